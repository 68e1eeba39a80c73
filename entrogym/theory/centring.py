"""Exact centring of REPO's log-prob (``repo_centering: raw | exact``), lab half.

REPO reshapes advantages with the centred log-prob log pi(a|s) - E_pi[log pi(.|s)]
= log pi(a|s) + H(s) (Sec. 5, "REPO"); the paper's implementation uses the raw log pi because it
considered the mean expensive. The trainer already computes the exact per-token entropy H(s)
in vocabulary chunks, so the exact form costs one addition per token once H is scored.

Until ``entrogym.algos`` grows the ``repo_centering`` knob, :func:`exact_centring` runs the
bandit lab's unmodified ``run_one`` with centred REPO log-probs by routing the lab scorer's
exact entropies into the REPO advantage shaping. It is a measurement harness for the lab only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from entrogym.algos import update
from entrogym.algos.entropy import repo_d, repo_r
from entrogym.theory import lab

CENTERINGS = ("raw", "exact")
REPO_CONTROLS = ("repo-r", "repo-d")


def centred_logprobs(logprobs: torch.Tensor, token_entropies: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) - E_{a'~pi}[log pi(a'|s)] = log pi(a|s) + H(s) (Sec. 5, REPO's centred form).

    ``logprobs`` and ``token_entropies`` are [B, T] (the sampled tokens' log-probs and the exact
    entropies at the same positions); both are detached, since REPO treats them as constants.
    """
    if logprobs.shape != token_entropies.shape:
        raise ValueError(
            f"token_entropies shape {tuple(token_entropies.shape)} must equal logprobs shape "
            f"{tuple(logprobs.shape)}; score the entropies at the sampled positions"
        )
    return logprobs.detach() + token_entropies.detach()


def repo_advantages(
    control: str,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    zeta: float,
    *,
    centering: str = "raw",
    token_entropies: torch.Tensor | None = None,
) -> torch.Tensor:
    """REPO-R / REPO-D advantages with raw (paper's implementation) or exactly centred log pi.

    This is what ``entrogym.algos.update.shape_advantages`` should do once presets carry
    ``repo_centering``: ``exact`` needs the exact per-token entropies from the scorer.
    """
    if control not in REPO_CONTROLS:
        raise ValueError(f"control must be one of {REPO_CONTROLS}, got {control!r}")
    if centering not in CENTERINGS:
        raise ValueError(f"repo_centering must be one of {CENTERINGS}, got {centering!r}")
    if centering == "exact":
        if token_entropies is None:
            raise ValueError("repo_centering='exact' needs token_entropies from the scorer")
        logprobs = centred_logprobs(logprobs, token_entropies)
    shape = repo_r if control == "repo-r" else repo_d
    return shape(advantages, logprobs.detach(), zeta)


@contextlib.contextmanager
def exact_centring(centering: str = "exact") -> Iterator[None]:
    """Within the block, the lab's ``run_one`` shapes REPO advantages with ``centering``.

    The lab scorer is asked for exact entropies on every minibatch and hands them to the REPO
    shaping; nothing else in the update changes, so ``centering="raw"`` reproduces ``run_one``.
    Not thread-safe (it swaps two module attributes); meant for lab measurements only.
    """
    if centering not in CENTERINGS:
        raise ValueError(f"centering must be one of {CENTERINGS}, got {centering!r}")
    scored: dict[str, torch.Tensor | None] = {"entropies": None}
    original_scorer, original_shape = lab._scorer, update.shape_advantages

    def scorer(policy, states, actions):
        score = original_scorer(policy, states, actions)

        def with_entropies(index: torch.Tensor, needs_entropy: bool):
            logprobs, entropies = score(index, True)
            scored["entropies"] = entropies
            return logprobs, entropies if needs_entropy else None

        return with_entropies

    def shape(control, advantages, logprobs):
        kind = control.config.entropy_control
        if kind not in REPO_CONTROLS:
            return original_shape(control, advantages, logprobs)
        return repo_advantages(
            kind,
            advantages,
            logprobs,
            control.coefficient,
            centering=centering,
            token_entropies=scored["entropies"],
        )

    lab._scorer, update.shape_advantages = scorer, shape
    try:
        yield
    finally:
        lab._scorer, update.shape_advantages = original_scorer, original_shape
