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
which with every state sampled is also what ``probe`` tracks, that over the initial policy's for
``relative``, ``input_dependence`` for ``input_dependence``, or ``entropy_sampled``);
``input_dependence`` the exact mutual information of state and arm after the update, the states
uniform (``entrogym.algos.input_dependence``: how much the arm depends on the state);
``reward`` exact expected
reward after the update; ``reward_sampled`` the experience's mean reward; clip fractions, KL,
and the lever's coefficient (``zeta``, ``beta``, ``eps_high``, ...) as used in the iteration.

What runs is a ``LabConfig`` (``entrogym.experiments.lab_config``): the settings and the runs,
each a label and an ``AlgorithmConfig``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import entrogym  # noqa: F401  (registers entrogym/Bandit-v0)
from entrogym.algos import (
    AlgorithmConfig,
    EntropyControl,
    UpdateBatch,
    input_dependence_exact,
    policy_update,
    token_entropy_from_logits,
)
from entrogym.experiments.lab_config import LabConfig, LabRun, LabSettings
from entrogym.experiments.lab_report import summarize, write_outputs
from entrogym.theory.tabular import TabularSoftmaxPolicy, initial_logits
from entrogym.theory.temperature import attach_temperature_samples

LOGGED_METRICS = ("clip_frac_low", "clip_frac_high", "approx_kl", "ratio_max", "loss")


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
    """The entropy of the batches of the initial policy the target asks for
    (``EntropyControl.probe_request``: ``controller.target_probe`` of them), by the
    controller's estimator, drawn from their own generator so the run's samples are those it
    draws without a probe."""
    generator = torch.Generator().manual_seed(seed + 1_000_003)
    entropies = []
    with torch.no_grad():
        for _ in range(control.probe_request):
            actions = policy.sample(states, generator)
            score = _scorer(policy, states, actions)
            logprobs, exact = score(torch.arange(len(states)), control.measures_exact)
            entropies.append(control.batch_entropy(logprobs, exact, torch.ones_like(logprobs)))
    return entropies


def _input_dependence(policy: TabularSoftmaxPolicy) -> float:
    """The exact mutual information of state and arm, states uniform (the states are the
    tasks, an arm the response: ``input_dependence_exact``)."""
    with torch.no_grad():
        return input_dependence_exact(policy.log_probs_table())


def _row(policy: TabularSoftmaxPolicy, means: torch.Tensor, m: dict[str, Any]) -> dict[str, Any]:
    """The logged metrics of one iteration (exact values after the update, sampled ones of
    the experience, the update's diagnostics and the control's coefficients)."""
    return {
        "entropy": float(policy.state_entropies().mean()),
        "entropy_sampled": m["entropy"],
        "entropy_tracked": m["entropy_tracked"],
        "input_dependence": _input_dependence(policy),
        "reward": float(policy.expected_rewards(means).mean()),
        "reward_sampled": m["reward_mean"],
        **{k: m.get(k) for k in LOGGED_METRICS},
        "zeta": m["zeta"],
        "beta": m["beta"],
        "eps_high": m["eps_high"],
        "entropy_target": m["entropy_target"],
    }


def run_one(
    run: LabRun | AlgorithmConfig, seed: int, lab: LabSettings
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Train one run (an entry of ``LabConfig.algos``, or an ``AlgorithmConfig``, e.g. with a
    part of yours, labelled by its preset) with one seed; return (initial exact entropy and
    reward, metric rows).

    The seed fixes the bandit's arm means, the initial logits and all sampling, so every preset
    sees the same problems for the same seed.
    """
    run = run if isinstance(run, LabRun) else LabRun(run.name, run)
    config, name = run.algorithm, run.label
    env, policy = _problem(lab, seed)
    optimizer = _optimizer(lab, policy)
    generator = torch.Generator().manual_seed(seed)
    control = EntropyControl(config)
    means = torch.as_tensor(env.reward_means)
    states = torch.arange(lab.n_states).repeat_interleave(lab.samples_per_state)
    if control.probe_request:  # a target measured before any push
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
        if control.tracks_input_dependence:  # the states are the tasks, an arm the response
            control.observe_states(_input_dependence(policy))
        elif control.tracks_handed:  # every state is sampled: probe's fixed states are all
            entropy = float(policy.state_entropies().mean())
            if control.tracks_relative:  # the initial policy is the base model here
                control.observe_states(entropy / initial["entropy"], initial["entropy"])
            else:
                control.observe_states(entropy)
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
        write_outputs(Path(out), rows, summary, initials, lab)
    return summary


def _run_all(lab: LabConfig, progress: bool) -> tuple[list[dict[str, Any]], dict]:
    rows: list[dict[str, Any]] = []
    initials: dict[tuple[str, int], dict[str, float]] = {}
    start = time.perf_counter()
    for run in lab.algos:
        for seed in range(lab.seeds):
            initials[run.label, seed], run_rows = run_one(run, seed, lab)
            rows += run_rows
        if progress:
            print(f"  {run.label:<20} done ({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    return rows, initials
