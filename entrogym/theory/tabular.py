"""Tabular softmax policy: one free logit per (state, action), the setting of the tabular-softmax corollary (appendix "Entropy dynamics under policy gradient for tabular softmax policies").

The bandit lab trains this policy with the same advantage, loss and controller functions the LLM
trainer uses; a trajectory is a single action (T = 1) and the state is the bandit's context.
"""

from __future__ import annotations

import numpy as np
import torch

from entrogym.algos import token_entropy_from_logits

INITS = ("calibrated", "flat")


def initial_logits(
    reward_means: np.ndarray,
    init: str = "calibrated",
    strength: float = 3.0,
    noise: float = 0.5,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Initial logits [S, K] for the tabular policy.

    ``"flat"``: all zeros (uniform policy, maximal entropy). ``"calibrated"``: like a pretrained
    model, arms with a higher mean reward are already more likely: logits =
    strength * (standardised mean reward within the state) + noise * N(0, 1). A calibrated policy
    makes log-probabilities and advantages positively correlated, which by the tabular-softmax corollary
    drives entropy down even for on-policy RLOO (paper Sec. 3, "Summary").
    """
    means = np.asarray(reward_means, dtype=np.float64)
    if means.ndim != 2:
        raise ValueError(f"reward_means must be [n_states, n_arms], got shape {means.shape}")
    if init == "flat":
        return np.zeros_like(means)
    if init != "calibrated":
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if strength < 0 or noise < 0:
        raise ValueError(f"strength and noise must be >= 0, got {strength}, {noise}")
    rng = rng if rng is not None else np.random.default_rng(0)
    centred = means - means.mean(axis=1, keepdims=True)
    scale = means.std(axis=1, keepdims=True)
    standardised = np.divide(centred, scale, out=np.zeros_like(centred), where=scale > 0)
    return strength * standardised + noise * rng.standard_normal(means.shape)


class TabularSoftmaxPolicy(torch.nn.Module):
    """pi(a | s) = softmax(logits[s])_a with the logits as the only parameters."""

    def __init__(self, logits: np.ndarray | torch.Tensor, dtype: torch.dtype = torch.float32):
        super().__init__()
        logits = torch.as_tensor(logits, dtype=dtype)
        if logits.dim() != 2 or logits.shape[1] < 2:
            raise ValueError(
                f"logits must be [n_states, n_arms] with n_arms >= 2, got {tuple(logits.shape)}"
            )
        self.logits = torch.nn.Parameter(logits.clone())

    @property
    def n_states(self) -> int:
        return self.logits.shape[0]

    @property
    def n_arms(self) -> int:
        return self.logits.shape[1]

    def log_probs_table(self) -> torch.Tensor:
        """log pi(. | s) for every state, [S, K]."""
        return torch.log_softmax(self.logits, dim=-1)

    def action_logprobs(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a_i | s_i) as a [B, 1] tensor: one-action trajectories, T = 1."""
        logp = torch.log_softmax(self.logits[states], dim=-1)
        return logp.gather(1, actions[:, None])

    def sample(self, states: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One action per entry of ``states`` (repeat a state K times for a group of K)."""
        with torch.no_grad():
            probs = torch.softmax(self.logits[states].double(), dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    @torch.no_grad()
    def state_entropies(self) -> torch.Tensor:
        """Exact entropy H(pi(. | s)) of every state, [S] (float64)."""
        return token_entropy_from_logits(self.logits.double())

    @torch.no_grad()
    def expected_rewards(self, reward_means: torch.Tensor) -> torch.Tensor:
        """E_{a ~ pi(. | s)}[r(s, a)] for every state, [S] (float64)."""
        probs = torch.softmax(self.logits.double(), dim=-1)
        return (probs * reward_means.double()).sum(dim=-1)
