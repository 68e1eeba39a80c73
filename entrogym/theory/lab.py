"""The bandit theory lab: train a tabular softmax policy on ``entrogym/Bandit-v0`` with every preset.

Each iteration samples K arms per state (one group per state), scores them with the env, and
hands the batch to :func:`entrogym.algos.update.policy_update`, the same update the LLM trainer
runs: advantages, REPO / ADAPO / bonus control, the preset's epochs x minibatches of
``clipped_policy_loss``, an optimizer step. A trajectory is one action (T = 1, mask of ones).

Logged per (algorithm, seed, iteration) in ``metrics.jsonl``:
``entropy`` exact mean state entropy of the policy after the iteration's update;
``entropy_sampled`` the controllers' estimate (mean -log pi over the iteration's sampled arms,
``sampled_entropy``) of the policy that collected the experience; ``reward`` exact expected
reward after the update; ``reward_sampled`` the experience's mean reward; clip fractions, KL,
and ``zeta`` / ``beta`` / ``eps_high`` as used in the iteration.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser

import entrogym  # noqa: F401  (registers entrogym/Bandit-v0)
from entrogym.algos.entropy import token_entropy_from_logits
from entrogym.algos.presets import ALGORITHMS
from entrogym.algos.update import EntropyControl, policy_update
from entrogym.theory.tabular import INITS, TabularSoftmaxPolicy, initial_logits

# A lab entry is a preset or a labelled variant ("repo-r (zeta_max=0.5)"), resolved here.
from entrogym.theory.variants import get_algorithm

OPTIMIZERS = ("sgd", "adam")
# Beside the paper-cap presets, `entrogym bandit` runs these variants scaled to the toy, taken
# from the regime map in docs/bandit.md (3-seed sweeps at the lab's defaults, lr 64, 50 iters):
# at lr 64 REPO-R holds entropy only with one optimizer step per iteration, so GRPO runs with
# that same step count too; REPO-D and the bonus hold with a smaller cap than the paper's 10.
# ADAPO has no variant: no clip setting held entropy in this toy (see the regime map).
TOY_VARIANTS = (
    "grpo (epochs=1 minibatch_size=None)",
    "repo-r (zeta_max=0.5 epochs=1 minibatch_size=None)",
    "repo-d (zeta_max=0.5)",
    "grpo-entropy-bonus (zeta_max=0.2)",
)
LOGGED_METRICS = ("clip_frac_low", "clip_frac_high", "approx_kl", "ratio_max", "loss")


@dataclass
class LabConfig:
    """Defaults of ``entrogym bandit`` (what ``make demo`` runs)."""

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

    def validate(self) -> None:
        if not self.algos:
            raise ValueError(f"algos: empty list; choose from {', '.join(ALGORITHMS)}")
        for label in self.algos:
            try:
                get_algorithm(label)
            except ValueError as e:
                message = str(e) if str(e).startswith("algos:") else f"algos: {e}"
                raise ValueError(
                    f"{message} (a variant is written 'repo-r (zeta_max=0.5)')"
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
        if self.max_grad_norm < 0:
            raise ValueError(
                f"max_grad_norm must be >= 0 (0 = no clipping), got {self.max_grad_norm}"
            )


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


def run_one(algo: str, seed: int, lab: LabConfig) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Train one preset with one seed; return (initial exact entropy and reward, metric rows).

    The seed fixes the bandit's arm means, the initial logits and all sampling, so every preset
    sees the same problems for the same seed.
    """
    config = get_algorithm(algo)
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
    optimizer = _optimizer(lab, policy)
    generator = torch.Generator().manual_seed(seed)
    control = EntropyControl(config)
    means = torch.as_tensor(env.reward_means)
    states = torch.arange(lab.n_states).repeat_interleave(lab.samples_per_state)
    mask = torch.ones(len(states), 1)
    initial = {
        "entropy": float(policy.state_entropies().mean()),
        "reward": float(policy.expected_rewards(means).mean()),
    }

    def step() -> bool:
        if lab.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), lab.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        return True

    rows = []
    for iteration in range(lab.iters):
        actions = policy.sample(states, generator)
        rewards = torch.as_tensor(env.sample_rewards(states.numpy(), actions.numpy()))
        with torch.no_grad():
            old_logprobs = policy.action_logprobs(states, actions)
        m = policy_update(
            config,
            control,
            rewards=rewards.float(),
            group_ids=states,
            old_logprobs=old_logprobs,
            mask=mask,
            score=_scorer(policy, states, actions),
            backward=torch.Tensor.backward,
            step=step,
            generator=generator,
        )
        row = {
            "algo": algo,
            "seed": seed,
            "iteration": iteration,
            "entropy": float(policy.state_entropies().mean()),
            "entropy_sampled": m["entropy"],
            "reward": float(policy.expected_rewards(means).mean()),
            "reward_sampled": m["reward_mean"],
            **{k: m.get(k) for k in LOGGED_METRICS},
            "zeta": m["zeta"],
            "beta": m["beta"],
            "eps_high": m["eps_high"],
        }
        rows.append(row)
    return initial, rows


def run_lab(lab: LabConfig, out: Path | None = None, progress: bool = False) -> dict[str, Any]:
    """Every preset x seed; writes metrics.jsonl, summary.json and entropy.png when ``out``."""
    from entrogym.theory.lab_report import summarize, write_outputs

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
            initials[algo, seed], algo_rows = run_one(algo, seed, lab)
            rows += algo_rows
        if progress:
            print(f"  {algo:<20} done ({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    return rows, initials


def build_parser(prog: str = "entrogym bandit", default_out: str = "runs/bandit") -> ArgumentParser:
    defaults = LabConfig()
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument(
        "--algos", type=str, default=",".join(defaults.algos), help="comma-separated presets"
    )
    parser.add_argument("--out", type=str, default=default_out, help="output folder")
    parser.add_argument("--json", action=ActionYesNo, default=False, help="print the summary")
    for name, value in asdict(defaults).items():
        if name != "algos":
            parser.add_argument(f"--{name}", type=type(value), default=value)
    return parser


def lab_from_args(args: Any) -> LabConfig:
    fields = {k: getattr(args, k) for k in asdict(LabConfig()) if k != "algos"}
    algos = [a.strip() for a in str(args.algos).split(",") if a.strip()]
    return LabConfig(algos=algos, **fields)


def cli(argv: list[str], prog: str = "entrogym bandit", default_out: str = "runs/bandit") -> int:
    """``entrogym bandit --algos ... --seeds 3 --iters N --out DIR [--json]``."""
    import json

    from entrogym.theory.lab_report import format_table

    args = build_parser(prog=prog, default_out=default_out).parse_args(argv)
    lab = lab_from_args(args)
    try:
        lab.validate()
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if not args.json:
        print(
            f"bandit lab: {len(lab.algos)} presets x {lab.seeds} seeds x {lab.iters} iterations "
            f"({lab.n_states} states, {lab.n_arms} arms, {lab.samples_per_state} samples/state)",
            flush=True,
        )
    summary = run_lab(lab, Path(args.out), progress=not args.json)
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_table(summary))
        print(f"wrote {args.out}/metrics.jsonl, {args.out}/summary.json, {args.out}/entropy.png")
    return 0
