"""One iteration's policy update, composed from the named formula functions.

The same code drives the LLM trainer and the bandit lab, so what the lab shows about a preset
is what the trainer does with it. The caller supplies how to score a minibatch (an LLM forward
pass, or a lookup in a logit table), how to back-propagate (fp16 loss scaling) and how to
take an optimizer step (grad clipping); everything algorithmic happens here, in this order:

    advantages (rloo | grpo)  ->  per minibatch: entropy control (repo-r | repo-d with the latest
    policy's detached log-probs; adapo's eps_high; the bonus's beta)  ->  clipped_policy_loss
    (+ entropy bonus)  ->  step.  Repeated for the preset's epochs.

Controllers move once per iteration, after the update, from the entropy of the experience the
iteration was trained on; the target is the entropy of the first iteration (paper Sec. 5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from entrogym.algos.advantages import compute_advantages, zero_advantage_groups
from entrogym.algos.buffer import minibatch_indices
from entrogym.algos.entropy import (
    EpsHighController,
    ZetaController,
    entropy_bonus_loss,
    repo_d,
    repo_r,
    sampled_entropy,
)
from entrogym.algos.losses import clipped_policy_loss
from entrogym.algos.presets import AlgorithmConfig

# score(index) -> (logprobs [b, T] of the sampled tokens under the current policy,
#                  exact per-token entropies [b, T] or None when the preset does not need them)
ScoreFn = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]
# backward(loss): back-propagate one micro-batch's (weighted) loss, accumulating gradients
BackwardFn = Callable[[torch.Tensor], None]
# step() -> True if the optimizer stepped (False e.g. when fp16 scaling found inf grads);
# it also clears the accumulated gradients
StepFn = Callable[[], bool]


@dataclass
class EntropyControl:
    """The state of a preset's entropy control across iterations (checkpointed with the run)."""

    config: AlgorithmConfig
    target: float | None = None
    zeta: ZetaController | None = None
    eps_high: EpsHighController | None = None
    history: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        kind = self.config.entropy_control
        if kind in ("repo-r", "repo-d", "entropy-bonus") and self.zeta is None:
            self.zeta = ZetaController(
                self.config.zeta_min, self.config.zeta_max, self.config.zeta_init
            )
        if kind == "adapo" and self.eps_high is None:
            c = self.config
            self.eps_high = EpsHighController(
                c.eps_high, c.eps_high_min, c.eps_high_max, c.eps_high_up, c.eps_high_down
            )

    @property
    def coefficient(self) -> float | None:
        """Current zeta (REPO) or beta (entropy bonus); None for presets without one."""
        return None if self.zeta is None else self.zeta.zeta

    @property
    def clip_high(self) -> float | None:
        return self.eps_high.eps_high if self.eps_high is not None else self.config.eps_high

    def observe(self, entropy: float) -> None:
        """Feed one iteration's entropy: the first sets the target, later ones move controllers."""
        self.history.append(entropy)
        if self.target is None:
            self.target = entropy
            return
        if self.zeta is not None:
            self.zeta.update(entropy, self.target)
        if self.eps_high is not None:
            self.eps_high.update(entropy, self.target)

    def state_dict(self) -> dict:
        return {
            "target": self.target,
            "history": list(self.history),
            "zeta": None if self.zeta is None else self.zeta.state_dict(),
            "eps_high": None if self.eps_high is None else self.eps_high.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.target, self.history = state["target"], list(state["history"])
        if self.zeta is not None and state["zeta"] is not None:
            self.zeta.load_state_dict(state["zeta"])
        if self.eps_high is not None and state["eps_high"] is not None:
            self.eps_high.load_state_dict(state["eps_high"])


def shape_advantages(
    control: EntropyControl, advantages: torch.Tensor, logprobs: torch.Tensor
) -> torch.Tensor:
    """Apply REPO-R / REPO-D to the advantages with the latest policy's detached log-probs."""
    kind, zeta = control.config.entropy_control, control.coefficient
    if kind == "repo-r":
        return repo_r(advantages, logprobs.detach(), zeta)
    if kind == "repo-d":
        return repo_d(advantages, logprobs.detach(), zeta)
    return advantages


def micro_batches(index: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """Split one minibatch into chunks that fit in memory; their gradients are accumulated."""
    if size is not None and size < 1:
        raise ValueError(f"micro_batch_size must be >= 1 or None, got {size}")
    return [index] if size is None else list(index.split(size))


def micro_weight(aggregation: str, chunk_mask: torch.Tensor, minibatch_mask: torch.Tensor) -> float:
    """The chunk's share of the minibatch loss, so accumulated gradients equal the whole one's.

    ``sequence-mean`` averages over trajectories (share = trajectories in the chunk), while
    ``token-mean`` averages over action tokens (share = action tokens in the chunk).
    """
    if aggregation == "token-mean":
        return float(chunk_mask.sum() / minibatch_mask.sum())
    return chunk_mask.shape[0] / minibatch_mask.shape[0]


def policy_update(
    config: AlgorithmConfig,
    control: EntropyControl,
    *,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    score: ScoreFn,
    backward: BackwardFn,
    step: StepFn,
    micro_batch_size: int | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Run the preset's epochs x minibatches on one iteration's experience; return metrics.

    ``old_logprobs`` must be the trainer's recomputed fp32 log-probs of the sampled tokens under
    the policy that generated them (never the engine's). The entropy fed to the controllers is
    ``sampled_entropy(old_logprobs, mask)``: the entropy of the policy the data came from.
    Each minibatch is scored in chunks of ``micro_batch_size`` trajectories whose weighted
    losses are back-propagated one by one (gradient accumulation), then ``step()`` is called.
    """
    advantages = compute_advantages(config.advantage, rewards, group_ids)
    entropy = sampled_entropy(old_logprobs, mask)
    sums: dict[str, float] = {}
    ratio_maxes: list[float] = []
    n_chunks = n_steps = n_skipped = 0
    needs_entropy = config.entropy_control == "entropy-bonus"
    for _ in range(config.epochs):
        for minibatch in minibatch_indices(len(rewards), config.minibatch_size, generator):
            finite = True
            for index in micro_batches(minibatch, micro_batch_size):
                logprobs, token_entropies = score(index, needs_entropy)
                if not finite or not torch.isfinite(logprobs.detach()).all():
                    # A diverged model scores NaN/inf: the step is skipped and counted below,
                    # not raised (the formula functions reject such input from callers).
                    finite = False
                    continue
                adv = shape_advantages(control, advantages[index], logprobs)
                loss, metrics = clipped_policy_loss(
                    logprobs,
                    old_logprobs[index],
                    adv,
                    mask[index],
                    eps_low=config.eps_low,
                    eps_high=control.clip_high,
                    level=config.ratio_level,
                    aggregation=config.aggregation,
                )
                if needs_entropy:
                    if token_entropies is None:
                        raise ValueError(
                            "the entropy-bonus preset needs score() to return entropies"
                        )
                    loss = loss + entropy_bonus_loss(
                        token_entropies, mask[index], control.coefficient
                    )
                finite = finite and bool(torch.isfinite(loss))
                if finite:
                    backward(loss * micro_weight(config.aggregation, mask[index], mask[minibatch]))
                metrics["loss"] = float(loss.detach())
                ratio_maxes.append(metrics.pop("ratio_max"))
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                n_chunks += 1
            # A non-finite loss poisons the accumulated gradient: skip the whole step.
            stepped = step() if finite else False
            n_steps += int(stepped)
            n_skipped += int(not stepped)
    out = {key: value / max(n_chunks, 1) for key, value in sums.items()}
    out.update(
        ratio_max=max(ratio_maxes, default=float("nan")),
        entropy=entropy,
        reward_mean=float(rewards.float().mean()),
        zero_adv_groups=zero_advantage_groups(advantages, group_ids),
        optimizer_steps=n_steps,
        skipped_steps=n_skipped,
        zeta=control.coefficient if config.entropy_control != "entropy-bonus" else None,
        beta=control.coefficient if config.entropy_control == "entropy-bonus" else None,
        eps_high=control.clip_high,
    )
    control.observe(entropy)
    return out
