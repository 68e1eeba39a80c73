"""The bandit theory lab: train a tabular softmax policy on ``entrogym/Bandit-v0`` with every preset.

Each iteration samples K arms per state (one group per state), scores them with the env, and
hands the batch to :func:`entrogym.algos.policy_update`, the same update the LLM trainer
runs: advantages, REPO / ADAPO / bonus control, the preset's epochs x minibatches of
``clipped_policy_loss``, an optimizer step. A trajectory is one action (T = 1, mask of ones).

Logged per (algorithm, seed, iteration) in ``metrics.jsonl``:
``entropy`` exact mean state entropy of the policy after the iteration's update;
``entropy_sampled`` the mean -log pi over the iteration's sampled arms (``sampled_entropy``) of
the policy that collected the experience; ``entropy_tracked`` the estimate of that entropy the
controller saw (``controller.estimator``: the exact mean state entropy over the sampled states,
or ``entropy_sampled``); ``reward`` exact expected
reward after the update; ``reward_sampled`` the experience's mean reward; clip fractions, KL,
and the lever's coefficient (``zeta``, ``beta``, ``eps_high``, ...) as used in the iteration.

An entry of ``LabConfig.algos`` is a preset or a labelled variant in the one spelling of
``entrogym.train.algo_spec``: ``"repo-d --algo.controller pi --algo.controller.kp 0.3"``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import entrogym  # noqa: F401  (registers entrogym/Bandit-v0)
from entrogym.algos import (
    ALGORITHMS,
    AlgorithmConfig,
    EntropyControl,
    UpdateBatch,
    policy_update,
    token_entropy_from_logits,
)
from entrogym.theory.lab_report import entry_label, summarize, write_outputs
from entrogym.theory.tabular import INITS, TabularSoftmaxPolicy, initial_logits
from entrogym.theory.temperature import attach_temperature_samples
from entrogym.train.algo_spec import merge_specs, parse_label, resolve_algorithm

OPTIMIZERS = ("sgd", "adam")
# Beside the paper-cap presets, `entrogym bandit` runs these variants scaled to the toy, taken
# from the regime map in docs/bandit.md (3-seed sweeps at the lab's defaults, lr 64, 50 iters):
# at lr 64 REPO-R holds entropy only with one optimizer step per iteration, so GRPO runs with
# that same step count too; REPO-D and the bonus hold with a smaller cap than the paper's 10.
# ADAPO has no variant: no clip setting held entropy in this toy (see the regime map).
TOY_VARIANTS = (
    "grpo --algo.epochs 1 --algo.minibatch-size none",
    "repo-r --algo.controller.max 0.5 --algo.epochs 1 --algo.minibatch-size none",
    "repo-d --algo.controller.max 0.5",
    "grpo-entropy-bonus --algo.controller.max 0.2",
)
LOGGED_METRICS = ("clip_frac_low", "clip_frac_high", "approx_kl", "ratio_max", "loss")


@dataclass
class LabConfig:
    """The bandit lab's settings (defaults: what ``entrogym bandit`` runs).

    Args:
        algos: presets to train (each with every seed).
        seeds: seeds per preset (seed s fixes the arm means, the initial logits and sampling).
        iters: iterations per run.
        n_states: bandit states (one group of samples per state and iteration).
        n_arms: arms per state.
        samples_per_state: K, samples per state and iteration.
        reward_noise: ``bernoulli`` rewards or the arm means themselves.
        init: initial logits (``calibrated`` to the arm means, or another of the INITS).
        calibration: how strongly calibrated initial logits follow the arm means.
        init_noise: noise added to the initial logits.
        optimizer: ``sgd`` or ``adam``.
        lr: learning rate of the tabular logits.
        max_grad_norm: gradient clipping (0 = none).
        max_staleness: K, as the trainer's ``--max-staleness``: iteration i samples with the
            policy after update i - K (0: the current one) and trains on that stale batch, with
            the sampling policy's log-probs as the ratio's denominator (docs/async.md).
        algo: algorithm options applied to every chosen preset (``{"controller": {"name":
            "pi"}}``, the command line's ``--algo.controller pi``); lever and controller options
            apply to the presets that have a lever unless they name the lever. An entry's own
            options win.
    """

    algos: list[str] = field(default_factory=lambda: [*ALGORITHMS, *TOY_VARIANTS])
    seeds: int = 3
    iters: int = 50
    n_states: int = 32
    n_arms: int = 16
    samples_per_state: int = 8
    reward_noise: str = "bernoulli"
    init: str = "calibrated"
    calibration: float = 2.0
    init_noise: float = 0.5
    optimizer: str = "sgd"
    lr: float = 64.0
    max_grad_norm: float = 0.0
    max_staleness: int = 0
    algo: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if not self.algos:
            raise ValueError(f"algos: empty list; choose from {', '.join(ALGORITHMS)}")
        if "name" in self.algo:
            raise ValueError(
                "algo: the presets come from algos; give algorithm options without a preset"
            )
        for entry in self.algos:
            try:
                self.algorithm(entry)
            except ValueError as e:
                raise ValueError(
                    f"algos: {entry!r}: {e} (a variant is written "
                    "'repo-d --algo.controller pi --algo.controller.kp 0.3')"
                ) from None
        for name in ("seeds", "iters", "n_states"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_arms < 2 or self.samples_per_state < 2:
            raise ValueError(
                f"n_arms and samples_per_state must be >= 2 (a group needs two samples), "
                f"got {self.n_arms}, {self.samples_per_state}"
            )
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.max_grad_norm < 0:
            raise ValueError(
                f"max_grad_norm must be >= 0 (0 = no clipping), got {self.max_grad_norm}"
            )
        lever_options = {"lever", "controller"} & set(self.algo) and "name" not in _as_dict(
            self.algo.get("lever")
        )
        if lever_options and not any(self._has_lever(a) for a in self.algos):
            raise ValueError(
                "algo: lever and controller options apply to presets with a lever, and none of "
                f"{', '.join(self.algos)} has one"
            )

    def spec(self, entry: str) -> dict[str, Any]:
        """The algorithm spec of entry ``entry``: the lab-wide ``algo`` options that apply to it,
        then the entry's own (module doc)."""
        own = parse_label(entry)
        shared = dict(self.algo)
        names_lever = "name" in _as_dict(shared.get("lever"))
        if not names_lever and not self._has_lever(entry):
            shared = {k: v for k, v in shared.items() if k not in ("lever", "controller")}
        return merge_specs({"name": own["name"], **shared}, own)

    def algorithm(self, entry: str) -> AlgorithmConfig:
        """The algorithm entry ``entry`` runs (the lab-wide options applied)."""
        return resolve_algorithm(self.spec(entry))

    @staticmethod
    def _has_lever(entry: str) -> bool:
        return resolve_algorithm(parse_label(entry)).controller is not None


def _as_dict(value: Any) -> dict[str, Any]:
    return {"name": value} if isinstance(value, str) else dict(value or {})


def _optimizer(lab: LabConfig, policy: torch.nn.Module) -> torch.optim.Optimizer:
    if lab.optimizer == "adam":
        return torch.optim.Adam(policy.parameters(), lr=lab.lr)
    return torch.optim.SGD(policy.parameters(), lr=lab.lr)


def _scorer(policy: TabularSoftmaxPolicy, states: torch.Tensor, actions: torch.Tensor):
    """``score(index, needs_entropy)`` for ``policy_update``: the current policy's log-probs of
    the sampled arms as [b, 1] (T = 1) and, for the entropy bonus, exact entropies [b, 1]."""

    def score(index: torch.Tensor, needs_entropy: bool):
        logits = policy.logits[states[index]]
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, actions[index, None])
        entropies = token_entropy_from_logits(logits)[:, None] if needs_entropy else None
        return logprobs, entropies

    return score


def _problem(lab: LabConfig, seed: int) -> tuple[Any, TabularSoftmaxPolicy]:
    """The seed's bandit (arm means) and the policy's initial logits."""
    env = gym.make(
        "entrogym/Bandit-v0",
        n_arms=lab.n_arms,
        n_states=lab.n_states,
        reward_noise=lab.reward_noise,
        means_seed=seed,
    ).unwrapped
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    policy = TabularSoftmaxPolicy(
        initial_logits(env.reward_means, lab.init, lab.calibration, lab.init_noise, rng)
    )
    return env, policy


def _stepper(lab: LabConfig, policy: TabularSoftmaxPolicy, optimizer: torch.optim.Optimizer):
    """``step()`` for ``policy_update``: clip (when asked) and step."""

    def step() -> bool:
        if lab.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), lab.max_grad_norm)
        optimizer.step()
        return True

    return step


def _probe(
    control: EntropyControl, policy: TabularSoftmaxPolicy, states: torch.Tensor, seed: int
) -> list[float]:
    """The entropy of ``control.probe_batches`` batches of the initial policy, by the
    controller's estimator, drawn from their own generator so the run's samples are those it
    draws without a probe."""
    generator = torch.Generator().manual_seed(seed + 1_000_003)
    entropies = []
    with torch.no_grad():
        for _ in range(control.probe_batches):
            actions = policy.sample(states, generator)
            score = _scorer(policy, states, actions)
            logprobs, exact = score(torch.arange(len(states)), control.needs_entropy)
            entropies.append(control.batch_entropy(logprobs, exact, torch.ones_like(logprobs)))
    return entropies


def _row(policy: TabularSoftmaxPolicy, means: torch.Tensor, m: dict[str, Any]) -> dict[str, Any]:
    """The logged metrics of one iteration (exact values after the update, sampled ones of
    the experience, the update's diagnostics and the control's coefficients)."""
    return {
        "entropy": float(policy.state_entropies().mean()),
        "entropy_sampled": m["entropy"],
        "entropy_tracked": m["entropy_tracked"],
        "reward": float(policy.expected_rewards(means).mean()),
        "reward_sampled": m["reward_mean"],
        **{k: m.get(k) for k in LOGGED_METRICS},
        "zeta": m["zeta"],
        "beta": m["beta"],
        "eps_high": m["eps_high"],
        "entropy_target": m["entropy_target"],
    }


def run_one(
    algo: str | AlgorithmConfig, seed: int, lab: LabConfig
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Train one preset or variant (an entry of ``LabConfig.algos``, or an ``AlgorithmConfig``,
    e.g. with a part of yours) with one seed; return (initial exact entropy and reward, metric
    rows).

    The seed fixes the bandit's arm means, the initial logits and all sampling, so every preset
    sees the same problems for the same seed.
    """
    config = lab.algorithm(algo) if isinstance(algo, str) else algo
    name = entry_label(algo) if isinstance(algo, str) else config.name  # a variant's label
    env, policy = _problem(lab, seed)
    optimizer = _optimizer(lab, policy)
    generator = torch.Generator().manual_seed(seed)
    control = EntropyControl(config)
    means = torch.as_tensor(env.reward_means)
    states = torch.arange(lab.n_states).repeat_interleave(lab.samples_per_state)
    if control.probe_batches:  # a target measured before any push (controller.target_probe)
        control.observe_probe(_probe(control, policy, states, seed))
    initial = {
        "entropy": float(policy.state_entropies().mean()),
        "reward": float(policy.expected_rewards(means).mean()),
    }
    rows = []
    versions = [policy.logits.detach().clone()]  # the logits after each update, as sampled
    for iteration in range(lab.iters):
        version = max(0, iteration - lab.max_staleness)  # the policy that samples this batch
        sampler = policy if version == iteration else TabularSoftmaxPolicy(versions[version])
        actions = sampler.sample(states, generator)
        rewards = torch.as_tensor(env.sample_rewards(states.numpy(), actions.numpy()))
        with torch.no_grad():
            old_logprobs = sampler.action_logprobs(states, actions)
        # AEPO's extra samples come from the policy being trained, at the controller's T
        extra = attach_temperature_samples(control, policy, env, lab.samples_per_state, generator)
        batch = UpdateBatch.build(
            config.advantage,
            rewards=rewards.float(),
            group_ids=states,
            mask=torch.ones(len(states), 1),  # one action per trajectory
            old_logprobs=old_logprobs,
            versions=torch.full((len(states),), version),
        )
        m = policy_update(
            control,
            batch,
            score=_scorer(policy, states, actions),
            backward=torch.Tensor.backward,
            step=_stepper(lab, policy, optimizer),
            zero_grad=optimizer.zero_grad,
            generator=generator,
            version=iteration,
        )
        versions.append(policy.logits.detach().clone())
        row = {"algo": name, "seed": seed, "iteration": iteration, **_row(policy, means, m)}
        row.update({key: m[key] for key in control.metrics() if key not in row})  # custom ones
        row.update(extra or {})
        rows.append(row)
    return initial, rows


def run_lab(lab: LabConfig, out: Path | None = None, progress: bool = False) -> dict[str, Any]:
    """Every preset x seed; writes metrics.jsonl, summary.json and entropy.png when ``out``."""

    lab.validate()
    # Tiny tensors: one thread avoids oversubscription on shared cores (measured 20x faster).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows, initials = _run_all(lab, progress)
    finally:
        torch.set_num_threads(threads)
    summary = summarize(rows, initials, lab)
    if out is not None:
        write_outputs(Path(out), rows, summary, initials)
    return summary


def _run_all(lab: LabConfig, progress: bool) -> tuple[list[dict[str, Any]], dict]:
    rows: list[dict[str, Any]] = []
    initials: dict[tuple[str, int], dict[str, float]] = {}
    start = time.perf_counter()
    for algo in lab.algos:
        for seed in range(lab.seeds):
            initials[entry_label(algo), seed], algo_rows = run_one(algo, seed, lab)
            rows += algo_rows
        if progress:
            print(f"  {algo:<20} done ({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    return rows, initials
