"""The ``hf`` engine's ``decode="static"`` path: sampling with merged LoRA weights and a static
KV cache, for RL rollouts on CPU.

``model.generate`` through peft runs every LoRA layer unmerged (two extra small matmuls and a
dropout call per projection) and grows a dynamic cache: thousands of small ops per token. Here
the adapter is merged into a sampling copy of the weights once per adapter version
(``W + scaling * B A``, computed by peft's own ``get_delta_weight``, so its scaling, rank and
alpha patterns and ``fan_in_fan_out`` hold), q/k/v and gate/up are each one matmul, the KV
cache is allocated once for the batch, identical prompts (the K samples of one task) are
prefilled once and the opening all prompts share once for them all (:func:`shared_prefix`).
A conversation's next turn reuses the keys and values its last call computed (the engine's
``cache_keys``, :mod:`turn_cache`) and prefills only the ids it adds. On CPU a one-token step runs on C++ kernels (:mod:`decode_kernel`; the keys are then cached
transposed): per layer, RMSNorm, the rotary embedding with the cache writes and the attention,
and ``silu(gate) * up`` are one call each, the residual adds ride on the projections' calls,
fp32 projections stream their weights through a kernel of the decoder's own where the CPU has
AVX-512 (:class:`~entrogym.agents.engines.sampling_copy.Projection`), and the token draw with
its log-prob is one call per step (:meth:`StaticDecoder._step`): eight calls per layer where
torch's ops took about twenty.

Sampling repeats ``generate``'s: the same logits processors (temperature, top-k, top-p, from
``transformers``), one ``torch.multinomial`` over every row per step (finished rows too, so
the random stream moves as ``generate``'s does and a seed gives the same tokens), finished
rows padded, and each recorded log-prob is ``log_softmax`` of the raw logits at the sampled id.
``decode="static-cdf"`` replaces only the draw (:mod:`draws`): ``inverse_cdf_draw`` takes one
uniform per row instead of ``multinomial``'s one exponential per vocabulary entry per row (at
SmolLM2's 49,152 entries and 24 rows, ~40 ms of a CPU decode step against ~1 ms). The
distribution is the same; the random stream, and so the tokens a seed gives, are not
``generate``'s.

Only Llama-style decoders run here (:func:`unsupported_reason` says why a model does not);
the engine samples the others with ``generate``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from entrogym.agents.engines import decode_kernel
from entrogym.agents.engines.base import SamplingParams
from entrogym.agents.engines.decode_math import (
    rms_norm,
    rotate,
    sampling_warpers,
    sdpa_step,
    step_attention,
)
from entrogym.agents.engines.draws import inverse_cdf_draw, multinomial_draw
from entrogym.agents.engines.sampling_copy import (
    Projection,
    kernel_pack,
    merged_weight,
    shared_kernel_projection,
)
from entrogym.agents.engines.turn_cache import Kept, Layers, common_prefix, shared_prefix


def unsupported_reason(config: Any) -> str | None:
    """Why ``config``'s model cannot take the static path (None: it can). The forward here is
    Llama's (RMSNorm, rotary embeddings, grouped-query attention, SiLU-gated MLP, no biases)."""
    if getattr(config, "model_type", None) != "llama":
        return f"model_type {getattr(config, 'model_type', None)!r} is not 'llama'"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not 'silu'"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "the model's projections have biases"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp is not 1"
    return None


@dataclass
class _Layer:
    """One decoder block: its norms, and its merged projections (:class:`Projection`)."""

    ln_in: torch.nn.Module
    qkv: Projection  # out = q | k | v
    o: Projection
    ln_post: torch.nn.Module
    gate_up: Projection  # out = gate | up
    down: Projection


def _projection(
    *mods: torch.nn.Module, adapter: str | None, packed: bool, kernel: bool
) -> Projection:
    """The merged projection of ``mods`` stacked, merged and packed in one pass where the
    streaming kernel takes it (:func:`kernel_pack`)."""
    adapted = any(adapter in getattr(m, "lora_A", {}) for m in mods)
    if kernel and not adapted:  # the base weights' own, packed once for every version
        shared = shared_kernel_projection(list(mods))
        if shared is not None:
            return shared
    stored = kernel_pack(list(mods), adapter) if kernel else None
    if stored is not None:
        return Projection.kernel_packed(stored, stored.shape[0] * 16)
    if len(mods) == 1:
        return Projection(merged_weight(mods[0], adapter), packed, kernel)
    return Projection(torch.cat([merged_weight(m, adapter) for m in mods]), packed, kernel)


def empty_cache(
    layers: int, rows: int, columns: int, kv_heads: int, head_dim: int, keys_transposed: bool,
    like: torch.Tensor,
) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """A zeroed (keys, values) pair per layer for ``rows`` rows of ``columns`` tokens, in
    ``like``'s dtype and device; with ``keys_transposed`` the keys are [d, C] per (row, kv
    head), where the attention kernel reads them."""
    shape = (rows, kv_heads, columns, head_dim)
    key_shape = (rows, kv_heads, head_dim, columns) if keys_transposed else shape
    kw = {"dtype": like.dtype, "device": like.device}
    return [(torch.zeros(key_shape, **kw), torch.zeros(shape, **kw)) for _ in range(layers)]


class StaticDecoder:
    """A Llama model's forward over merged weights (``net``: the ``transformers`` model,
    plain or inside peft; ``adapter``: the peft adapter name to merge, None = the base)."""

    def __init__(
        self,
        net: torch.nn.Module,
        adapter: str | None,
        packed: bool | None = None,
        kernels: bool | None = None,
    ) -> None:
        """``packed``: store the projections packed for a CPU kernel (:class:`Projection`: the
        decoder's own in fp32 where the kernels run and the CPU has AVX-512, oneDNN's otherwise);
        None packs wherever oneDNN runs (:func:`entrogym.onednn.supported`). ``kernels``:
        one-token steps on the C++ kernels (:mod:`decode_kernel`, :meth:`_step`), keys cached
        transposed; None takes them wherever they run (:func:`decode_kernel.supports`)."""
        get_base = getattr(net, "get_base_model", None)
        lm = get_base() if callable(get_base) else net
        config = lm.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = lm.model.embed_tokens.weight.detach()
        self.dtype, self.device = self.embed.dtype, self.embed.device
        fp32_cpu = self.device.type == "cpu" and self.dtype == torch.float32
        self.step_attention = step_attention if fp32_cpu else sdpa_step
        group = (self.heads // self.kv_heads, self.head_dim)
        plan = decode_kernel.plan(self.device, self.dtype, *group, packed=packed, kernels=kernels)
        #: which kernel each part of a decode step runs on (:func:`decode_kernel.plan_names`)
        self.kernel_names = decode_kernel.plan_names(plan)
        packed, kernel = plan["packed"], plan["stream"]
        # the attention kernel reads keys as [d, C] per (row, kv head): 16 keys' scores per load
        self.kernels = plan["kernels"]
        self.norm = lm.model.norm
        self.rotary = lm.model.rotary_emb

        project = functools.partial(_projection, adapter=adapter, packed=packed, kernel=kernel)

        # packed, the head is a copy (the weight is often the input embedding itself, tied) that
        # pays: 4.7 ms a step against 15 for SmolLM2's in fp32. Unpacked, [V, hidden] is the
        # left factor: as fast as input-major here (matmul_layout.py), without a copy.
        self.head = project(lm.lm_head) if packed else merged_weight(lm.lm_head, adapter)
        self.layers = []
        for block in lm.model.layers:
            attn, mlp = block.self_attn, block.mlp
            self.layers.append(
                _Layer(
                    ln_in=block.input_layernorm,
                    qkv=project(attn.q_proj, attn.k_proj, attn.v_proj),
                    o=project(attn.o_proj),
                    ln_post=block.post_attention_layernorm,
                    gate_up=project(mlp.gate_proj, mlp.up_proj),
                    down=project(mlp.down_proj),
                )
            )
        self._cache: Layers = []
        self._last: tuple[Layers, int] = ([], 0)  # the last call's cache and tokens fed back
        self._width = self._w0 = 0
        self._reused: list[int] = []
        self._from_kept: list[int] = []

    # ----- the forward ---------------------------------------------------------------------

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Last-position logits (fp32) of ``ids`` [B, T] written at cache columns
        ``start:start + T``; ``mask`` [B, 1, T, start + T] says which columns each query sees.
        Torch's ops: the prefill, and one-token steps where the kernels do not run."""
        b, t = ids.shape
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        x = F.embedding(ids, self.embed)
        cos, sin = self.rotary(x, positions)
        end = start + t
        for layer, (k_cache, v_cache) in zip(self.layers, self._cache, strict=True):
            qk, v = layer.qkv(rms_norm(x, layer.ln_in)).split([(h + kvh) * d, kvh * d], -1)
            qk = rotate(qk.view(b, t, h + kvh, d), cos, sin)
            q, k = qk[:, :, :h], qk[:, :, h:]
            if self.kernels:
                k_cache[:, :, :, start:end] = k.permute(0, 2, 3, 1)
            else:
                k_cache[:, :, start:end] = k.transpose(1, 2)
            v_cache[:, :, start:end] = v.view(b, t, kvh, d).transpose(1, 2)
            if t == 1:  # one query per row: each kv head's query group as its query rows
                group = q.reshape(b, kvh, h // kvh, d)
                out = self.step_attention(
                    group, self._keys(k_cache, end), v_cache[:, :, :end], mask
                ).reshape(b, 1, h * d)
            else:
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2), self._keys(k_cache, end), v_cache[:, :, :end],
                    attn_mask=mask, enable_gqa=h != kvh,
                )  # fmt: skip
                out = out.transpose(1, 2).reshape(b, t, h * d)
            x = x + layer.o(out)
            gate, up = layer.gate_up(rms_norm(x, layer.ln_post)).chunk(2, -1)
            x = x + layer.down(F.silu(gate) * up)
        return self._logits(rms_norm(x[:, -1], self.norm))

    def _step(
        self, token: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, column: int
    ) -> torch.Tensor:
        """Logits (fp32) [B, V] of one new token per row, ``token`` [B] at ``positions`` [B],
        written at cache column ``column``; ``valid`` [B, C] says which columns each row sees.
        :meth:`_forward`'s math on the C++ kernels where they run (:attr:`kernels`): per layer
        one call each for RMSNorm, the attention with its rotary embedding and cache writes,
        and ``silu(gate) * up``, and the residual adds inside the projections' calls."""
        if not self.kernels:
            mask = valid[:, None, None, : column + 1]
            return self._forward(token[:, None], positions[:, None], mask, column)
        x = F.embedding(token, self.embed)
        cos, sin = (c[:, 0].contiguous() for c in self.rotary(x[:, None], positions[:, None]))
        for layer, (k_cache, v_cache) in zip(self.layers, self._cache, strict=True):
            h = decode_kernel.rms_norm(x, layer.ln_in.weight, layer.ln_in.variance_epsilon)
            qkv = layer.qkv(h)
            out = decode_kernel.attention_step(qkv, cos, sin, k_cache, v_cache, valid, column)
            x = layer.o.add(out, x)
            h = decode_kernel.rms_norm(x, layer.ln_post.weight, layer.ln_post.variance_epsilon)
            x = layer.down.add(decode_kernel.silu_mul(layer.gate_up(h)), x)
        return self._logits(decode_kernel.rms_norm(x, self.norm.weight, self.norm.variance_epsilon))

    def _logits(self, last: torch.Tensor) -> torch.Tensor:
        """The LM head's fp32 logits [B, V] of the final norm's output ``last`` [B, hidden]."""
        if isinstance(self.head, Projection):
            return self.head(last).float()
        return (self.head @ last.T).T.float().contiguous()

    def _keys(self, k_cache: torch.Tensor, end: int) -> torch.Tensor:
        """The cache's first ``end`` keys as [B, G, end, d] (a view of the transposed cache
        where the kernels are used)."""
        return k_cache[..., :end].transpose(-1, -2) if self.kernels else k_cache[:, :, :end]

    def _prefill(
        self, prompts: list[list[int]], kept: list[Kept | None], pad: int, room: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Allocate the cache for ``len(prompts)`` rows with ``room`` columns past the prompts
        and prefill them. Returns the first step's logits [B, V] and which of the first
        :attr:`_width` columns hold each row's prompt [B, width] (bool).

        A row reuses the keys and values of the longest prefix its prompt shares with its
        ``kept`` row (:mod:`turn_cache`; at least one token of the prompt is left to prefill);
        the rows with nothing kept reuse the prefix every one of their distinct prompts begins
        with (a system prompt and a chat template's opening, 28 of the demo's 49 tokens),
        prefilled once, as one row. Each row's reused columns are copied in to end at column
        ``w0`` (the longest reused part), and its own tokens follow, left-padded so that every
        row's prompt ends at column ``width``; identical rows (the K samples of a task) are
        prefilled once. Padding is masked and positions count the real tokens only, so each
        row attends as it would in a cache of its own."""
        reused = [0] * len(prompts)
        sources: list[Kept | None] = [None] * len(prompts)
        for i, (prompt, row) in enumerate(zip(prompts, kept, strict=True)):
            if row is not None:
                reused[i] = min(common_prefix(row.ids, prompt), len(prompt) - 1)
                sources[i] = row if reused[i] else None
        self._from_kept = list(reused)
        fresh = list(
            dict.fromkeys(tuple(p) for p, s in zip(prompts, sources, strict=True) if s is None)
        )
        shared = shared_prefix(fresh)
        if shared:
            opening = self._prefill_opening(list(fresh[0][:shared]))
            for i in range(len(prompts)):
                if sources[i] is None:
                    sources[i], reused[i] = opening, shared
        keys = [(tuple(p), id(s), n) for p, s, n in zip(prompts, sources, reused, strict=True)]
        first = {key: i for i, key in reversed(list(enumerate(keys)))}
        rows = sorted(first.values())
        w0 = max(reused[i] for i in rows)
        width = w0 + max(len(prompts[i]) - reused[i] for i in rows)
        self._cache = self._empty_cache(len(rows), width + room)
        ids = torch.full((len(rows), width - w0), pad, dtype=torch.long)
        valid = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, i in enumerate(rows):
            own = prompts[i][reused[i] :]
            self._copy_in(r, w0 - reused[i], sources[i], reused[i])
            valid[r, w0 - reused[i] : w0] = True
            ids[r, ids.shape[1] - len(own) :] = torch.tensor(own)
            valid[r, width - len(own) :] = True
        ids, valid = ids.to(self.device), valid.to(self.device)  # built on the host, moved once
        block = valid[:, w0:]
        # generate's positions: counted over the real tokens, 1 at the padding
        positions = (torch.tensor([reused[i] for i in rows], device=self.device)[:, None]
                     + block.long().cumsum(-1) - 1).masked_fill(~block, 1)  # fmt: skip
        ones = torch.ones(width - w0, width, dtype=torch.bool, device=self.device)
        causal, diagonal = ones.tril(w0), ones.tril(w0) & ~ones.tril(w0 - 1)
        # padding queries see themselves, so that no row of the softmax is empty
        mask = ((causal & valid[:, None, :]) | diagonal)[:, None]
        logits = self._forward(ids, positions, mask, w0)
        self._width, self._reused, self._w0 = width, reused, w0
        pick = [rows.index(first[key]) for key in keys]
        if pick != list(range(len(rows))):
            index = torch.tensor(pick, device=self.device)
            self._cache = [(k[index], v[index]) for k, v in self._cache]
            logits, valid = logits[index], valid[index]
        return logits, valid

    def _prefill_opening(self, opening: list[int]) -> Kept:
        """The keys and values of ``opening`` (the prefix fresh prompts share), one row."""
        self._cache = self._empty_cache(1, len(opening))
        n = len(opening)
        ids = torch.tensor([opening], device=self.device)
        positions = torch.arange(n, device=self.device)[None]
        mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None, None]
        self._forward(ids, positions, mask, 0)
        return Kept(opening, self._cache, 0, [(0, n)], id(self))

    def _copy_in(self, row: int, start: int, source: Kept | None, count: int) -> None:
        """Copy the keys and values of ``source``'s first ``count`` tokens into row ``row`` of
        the cache, at columns ``start:start + count``."""
        at = start
        for first, end in source.spans if source is not None else []:
            take = min(end - first, start + count - at)
            if take <= 0:
                break
            for (k, v), (k_from, v_from) in zip(self._cache, source.layers, strict=True):
                if self.kernels:  # keys transposed: columns last
                    k[row, ..., at : at + take] = k_from[source.row, ..., first : first + take]
                else:
                    k[row, :, at : at + take] = k_from[source.row, :, first : first + take]
                v[row, :, at : at + take] = v_from[source.row, :, first : first + take]
            at += take

    def reused(self, row: int) -> int:
        """The tokens row ``row`` of the last :meth:`sample` call reused from its kept row."""
        return self._from_kept[row]

    def kept_row(self, row: int, prompt: list[int], completion: list[int]) -> Kept:
        """What the last :meth:`sample` call's cache holds of row ``row``: its ``prompt`` and
        the tokens of its ``completion`` that were fed back (all but a last one that ended
        the sampling), for :class:`~entrogym.agents.engines.turn_cache.KeptCaches`."""
        layers, fed = self._last
        width, reused, w0 = self._width, self._reused[row], self._w0
        n = min(len(completion), fed)
        spans = [(w0 - reused, w0)] if reused else []
        spans.append((width - (len(prompt) - reused), width + n))
        return Kept(list(prompt) + list(completion[:n]), layers, row, spans, id(self))

    def _empty_cache(self, rows: int, columns: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        args = (self.kv_heads, self.head_dim, self.kernels, self.embed)
        return empty_cache(len(self.layers), rows, columns, *args)

    # ----- sampling ------------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        max_new: int,
        stops: list[int],
        pad: int,
        draw: Callable[[torch.Tensor], torch.Tensor] = multinomial_draw,
        kept: list[Kept | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample up to ``max_new`` tokens per prompt with ``params``' temperature, top-k and
        top-p, as ``generate`` does; rows stop at a token in ``stops`` and are padded with
        ``pad`` after. ``draw`` picks one token per row from the processed probabilities
        (:data:`STATIC_DRAWS`). ``kept``: per prompt, the row of an earlier call whose keys
        and values it may reuse (:meth:`_prefill`); :meth:`kept_row` says what this call's
        cache holds after. Returns the new ids [B, steps] and their raw log-probs
        [B, steps]."""
        warp = sampling_warpers(params)
        kept = kept or [None] * len(prompts)
        logits, prompt_columns = self._prefill(prompts, kept, pad, max_new)
        width = self._width
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        valid = torch.zeros((len(prompts), width + max_new), dtype=torch.bool, device=self.device)
        valid[:, :width] = prompt_columns
        stop_ids = torch.tensor(stops, dtype=torch.long, device=self.device)
        unfinished = torch.ones(len(prompts), dtype=torch.bool, device=self.device)
        tokens, logprobs = [], []
        # the inverse-CDF draw and its log-prob in one kernel call on the logits, from the same
        # uniforms (one float64 per row from torch's global stream, as the draw takes them)
        fused_draw = self.kernels and draw is inverse_cdf_draw
        for step in range(max_new):
            scores = warp(logits)
            if params.temperature <= 0:
                token, logprob = scores.argmax(-1), None
            elif fused_draw:
                uniforms = torch.rand(len(prompts), dtype=torch.float64, device=self.device)
                scores, logits = scores.contiguous(), logits.contiguous()
                token, logprob = decode_kernel.cdf_sample(scores, logits, uniforms)
            else:
                token, logprob = draw(F.softmax(scores, dim=-1)), None
            if logprob is None:
                logprob = torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
            if stops:
                token = torch.where(unfinished, token, pad)
            tokens.append(token)
            logprobs.append(logprob)
            if stops:
                unfinished &= ~torch.isin(token, stop_ids)
            if step + 1 == max_new or not unfinished.any():
                break
            column = width + step
            valid[:, column] = True
            logits = self._step(token, lengths + step, valid, column)
        # the cache lives on only where kept rows point into it (kept_row)
        self._last, self._cache = (self._cache, len(tokens) - 1), []
        return torch.stack(tokens, 1), torch.stack(logprobs, 1)
