"""The learner: the policy being trained, its optimizer and loss scaler, and the fp32 scoring
the update runs on.

:meth:`Learner.update` hands the preset's update (``entrogym.algos.policy_update``) its four
pieces: ``score`` (exact log-probs and entropies of a micro-batch), ``backward``, ``step``
(unscale, clip, step) and ``zero_grad``. Under ``torchrun`` the policy is FSDP2-sharded over
the ranks and every rank scores its share of each micro-batch (``entrogym.train.devices.distributed``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from entrogym.algos import (
    EntropyControl,
    UpdateBatch,
    exact_batch_entropy,
    optimizer_steps,
    policy_update,
    relative_entropy,
)
from entrogym.algos.aepo import TemperatureSamples
from entrogym.algos.step_guard import StepGuard
from entrogym.train.config import TrainConfig
from entrogym.train.devices import distributed
from entrogym.train.devices.precision import apply_threads, loss_scaler_for, resolve_dtype
from entrogym.train.folder.checkpoint import load_adapter_into
from entrogym.train.folder.rng import iteration_seed
from entrogym.train.learner.logprobs import sequence_logprobs, sequence_logprobs_and_entropy
from entrogym.train.learner.mismatch import sampler_entropy_gap
from entrogym.train.learner.policy import LoraSettings, load_policy, trainable_parameters
from entrogym.train.learner.versions import WeightVersions
from entrogym.train.phases import PhaseClock
from entrogym.train.progress import progress


class Learner:
    """The policy (LoRA over the base model; ``--init-adapter`` loaded into it), the loss scaler
    and, once :meth:`build_optimizer` ran, the optimizer. Scoring and steps are timed on
    ``phases``."""

    def __init__(self, cfg: TrainConfig, ranks: distributed.Ranks, phases: PhaseClock) -> None:
        self.cfg, self.ranks, self.phases = cfg, ranks, phases
        if cfg.threads is not None:
            apply_threads(cfg.threads)
        self.policy = load_policy(
            cfg.model,
            dtype=cfg.dtype,
            lora=LoraSettings(
                cfg.lora_rank, cfg.lora_alpha, target_modules=cfg.lora_target_modules
            ),
            seed=cfg.seed,
            # a 16-bit body keeps an fp32 LM head over upcast hidden states (paper Sec. 4);
            # under torchrun FSDP2's output_dtype=float32 plays that part
            head_dtype="fp32" if cfg.dtype != "fp32" and not ranks.distributed else None,
        )
        self.scaler = loss_scaler_for(resolve_dtype(cfg.dtype))
        if cfg.init_adapter:  # a checkpoint a resume loads replaces it
            load_adapter_into(self.policy, cfg.init_adapter, base_model=cfg.model)
        self.logprob_opts = {"softmax_fix": cfg.softmax_fix}
        self.grad_norms: list[float] = []  # this update's pre-clip norms, filled by step()
        self.overflow = False  # the last skipped step was fp16's loss-scale overflow
        self.guard = StepGuard(
            cfg.max_bad_steps_in_row,
            gradients_finite=self.gradients_finite,
            overflow_expected=lambda: self.overflow,
        )

    def build_optimizer(self) -> None:
        """Shard the policy under torchrun, then build the optimizer on its parameters: after
        the weights are loaded (into the whole model), before the optimizer state is."""
        if self.ranks.distributed:
            from entrogym.train.devices.fsdp import shard_policy

            shard_policy(self.policy, param_dtype=self.cfg.dtype)
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(self.policy), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )

    @property
    def device(self) -> torch.device:
        """Where the policy is (rows to score follow it there)."""
        return next(self.policy.parameters()).device

    # ----- the update -----------------------------------------------------------------------

    def update(self, control: EntropyControl, batch: UpdateBatch, it: int) -> dict[str, Any]:
        """Iteration ``it``'s update on ``batch`` (advantages and old log-probs set): the
        preset's metrics plus ``grad_norm``, the mean pre-clip norm of its steps."""
        self.grad_norms = []
        steps = optimizer_steps(control.config, len(batch))
        with progress(total=steps, desc="update", unit="steps", enabled=self.ranks.main) as bar:
            metrics = policy_update(
                control,
                batch,
                score=lambda index, need: self.score(batch, index, need),
                backward=self.backward,
                step=self.step,
                zero_grad=lambda: self.optimizer.zero_grad(set_to_none=True),
                micro_batch_size=self.cfg.micro_batch_size,
                generator=torch.Generator().manual_seed(iteration_seed(self.cfg.seed, it)),
                version=it,
                micro_batch_tokens=self.cfg.micro_batch_tokens,
                on_step=bar.update,
                guard=self.guard,
            )
        return {**metrics, "grad_norm": sum(self.grad_norms) / max(len(self.grad_norms), 1)}

    def score(
        self, batch: UpdateBatch, index: torch.Tensor, need_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-probs (and exact entropies) of rows ``index`` (one micro-batch of the
        update), ``[b, t]`` with ``t`` their longest row, under the caller's grad mode. Under
        torchrun each rank scores its share of the rows and the results are all-gathered."""
        phase = "forward" if torch.is_grad_enabled() else "scoring"
        with self.phases.time(phase, batch=batch, index=index):
            input_ids, attention_mask = batch.tokens(index)
            mine = distributed.rows_of_rank(len(index), self.ranks)
            fn = sequence_logprobs_and_entropy if need_entropy else sequence_logprobs
            # Only action positions enter the loss: the LM head runs there alone (exact, faster).
            heads = batch.actions(index)[mine] if self.cfg.action_only_head else None
            device = self.device  # rows follow a policy moved to a GPU
            out = fn(
                self.policy,
                input_ids[mine].to(device),
                attention_mask[mine].to(device),
                score_mask=None if heads is None else heads.to(device),
                layout=self.cfg.score_layout,
                **self.logprob_opts,
            )
            lp, ent = out if need_entropy else (out, None)
            # gathered on the policy's device (NCCL needs it), then back to the update's CPU
            lp = distributed.gather_rows(lp, len(index), self.ranks).cpu()
            if need_entropy:
                ent = distributed.gather_rows(ent, len(index), self.ranks).cpu()
        return lp, ent

    def temperature_samples(self, batch: UpdateBatch) -> TemperatureSamples:
        """The AEPO lever's view of ``batch``, samples drawn at its temperature T: their rewards
        and action tokens, and a ``score`` that rescores every row under the current policy at
        temperature 1 (fp32, with gradients, as a micro-batch of the update is scored). The
        lever calls it once per micro-batch, so its rows' activations are held until that
        micro-batch's backward."""
        rows = torch.arange(len(batch))
        return TemperatureSamples(
            rewards=batch.rewards,
            mask=batch.actions(rows),
            score=lambda: self.score(batch, rows, need_entropy=False)[0],
        )

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's weighted loss (scaled for fp16)."""
        with self.phases.time("backward"):
            self.scaler.scale(loss).backward()

    def step(self) -> bool:
        """Unscale (fp16), clip and take one optimizer step; False when it was skipped for
        non-finite gradients, in every dtype (fp32 and bf16 have no loss scaler to notice
        them): the pre-clip norm is finite exactly when every gradient is. The update clears
        gradients before each minibatch."""
        with self.phases.time("optimizer"):
            norm = math.inf if self.scaler.unscale_(self.optimizer) else None
            if norm is None:
                norm = _value(
                    torch.nn.utils.clip_grad_norm_(
                        trainable_parameters(self.policy), self.cfg.max_grad_norm
                    )
                )
            if not math.isfinite(norm):
                # fp16 while the scale is above 1: an overflow the scaler answers itself
                self.overflow = self.scaler.enabled and self.scaler.scale_value > 1
                self.scaler.mark_overflow()  # backs the scale off in update()
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
                return False
            self.grad_norms.append(norm)
            stepped = self.scaler.step(self.optimizer)
            self.scaler.update()
            return stepped

    def gradients_finite(self) -> bool:
        """Whether the gradients accumulated now are all finite (their norm is)."""
        grads = [p.grad for p in trainable_parameters(self.policy) if p.grad is not None]
        return not grads or math.isfinite(_value(torch.nn.utils.get_total_norm(grads)))

    # ----- scoring without gradients --------------------------------------------------------

    def score_rows(
        self,
        batch: UpdateBatch,
        rows: torch.Tensor,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None = None,
    ) -> None:
        """Score ``rows`` without gradients, micro-batch by micro-batch as the update does,
        into ``logprobs`` (and exact ``entropies`` if given): ``[B, T]`` like ``batch.mask``,
        left as they are past each micro-batch's width."""
        size, tokens = self.cfg.micro_batch_size, self.cfg.micro_batch_tokens
        with torch.no_grad():
            for index in batch.micro_batches(rows, size, tokens):
                lp, ent = self.score(batch, index, need_entropy=entropies is not None)
                logprobs[index, : lp.shape[1]] = lp
                if entropies is not None:
                    entropies[index, : ent.shape[1]] = ent

    def score_all(
        self, batch: UpdateBatch, need_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-probs (and exact entropies) of every row, ``[B, T]`` like ``batch.mask``."""
        logprobs = torch.zeros(batch.mask.shape)
        entropies = torch.zeros(batch.mask.shape) if need_entropy else None
        self.score_rows(batch, torch.arange(len(batch)), logprobs, entropies)
        return logprobs, entropies

    def sampling_version_logprobs(
        self, batch: UpdateBatch, it: int, versions: WeightVersions | None
    ) -> torch.Tensor:
        """fp32 log-probs ``[B, T]`` of every row under the weight version that sampled it
        (``batch.versions``, kept in ``versions``; the current weights are version ``it``): the
        ratio's denominator for a stale batch, scored exactly as the update scores its own."""
        out = torch.zeros(batch.mask.shape)
        for version in sorted(set(batch.versions.tolist())):
            rows = (batch.versions == version).nonzero().flatten()
            weights = contextlib.nullcontext() if version == it else versions.weights_of(version)
            with weights:
                self.score_rows(batch, rows, out)
        return out

    def probe_entropy(self, batch: UpdateBatch, control: EntropyControl) -> float:
        """A probe batch's entropy in the terms ``control`` tracks (exact or sampled), scored in
        fp32 like an iteration's batch."""
        logprobs, exact = self.score_all(batch, need_entropy=control.measures_exact)
        return control.batch_entropy(logprobs, exact, batch.mask)

    def relative_entropy(self, batch: UpdateBatch) -> tuple[float, float]:
        """``estimator relative``: ``batch``'s exact entropy under the policy being trained over
        the base model's on the same tokens (``entrogym.algos.relative_entropy``), the base
        model being the policy with its adapter switched off, and the base model's mean exact
        entropy there in nats. Two no-grad fp32 passes."""
        _, current = self.score_all(batch, need_entropy=True)
        with self.policy.disable_adapter():
            _, base = self.score_all(batch, need_entropy=True)
        return relative_entropy(current, base, batch.mask), exact_batch_entropy(base, batch.mask)

    def entropy_check(self, batch: UpdateBatch) -> dict[str, Any]:
        """Opt-in (``--sampler-entropy-check``): did the engine draw from the policy? One extra
        no-grad pass for the exact entropies at the sampled positions (``sampler_entropy_gap``;
        |z| > 4 fails). Empty when not asked for."""
        if not self.cfg.sampler_entropy_check:
            return {}
        logprobs, entropies = self.score_all(batch, need_entropy=True)
        check = sampler_entropy_gap(logprobs, entropies, batch.mask)
        return {"sampler_entropy_gap": check["gap"], "sampler_entropy_z": check["z"]}

    # ----- distributed state ----------------------------------------------------------------

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's optimizer state (sharded again under torchrun)."""
        distributed.load_optimizer_state(self.policy, self.optimizer, state, self.ranks)

    def gathered(self) -> dict[str, Any]:
        """Under torchrun, the whole adapter weights and optimizer state a checkpoint holds (a
        collective: every rank calls it); empty on one process, where they are at hand."""
        if not self.ranks.distributed:
            return {}
        return {
            "weights": distributed.gathered_adapter(self.policy, self.ranks),
            "optimizer_state": distributed.optimizer_state(self.policy, self.optimizer, self.ranks),
        }


def _value(norm: torch.Tensor) -> float:
    """A gradient norm as a float (the whole one, for an FSDP2-sharded policy's DTensor)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
