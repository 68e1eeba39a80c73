"""What ``torch.compile`` buys the ``hf`` engine's static decode step on CPU: the one-token
forward with its per-layer pieces compiled (RMSNorm, the q|k|v matmul and rotary embedding
before attention; the output projection, residuals, RMSNorm and SiLU-gated MLP after it; the
final norm and LM head), attention and the KV-cache writes left eager, so that every decode
step has one shape and nothing recompiles as the cache fills. Prefill is not compiled. The decoder is
built unpacked (input-major), the layout the pieces were measured on.

It runs ``decode_throughput.py`` (same workload, roofline and JSON) with the decoder patched,
or unpatched with ``--compile off``, one process per call so that each counts its own
compilation: the first timed call of a cold process includes it (the warm-up call compiles for
one row, the timed batch again for its rows), so compare medians and read the compile cost off
``per_repeat[0]``. Inductor's on-disk cache makes a second process's compile cheaper.

    .venv/bin/python benchmarks/decode_compile.py --compile pieces --dtypes '[fp32]' \\
        --decodes '[static-cdf]' --repeats 4
"""

from __future__ import annotations

import argparse
import sys

import decode_throughput
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from entrogym.agents.engines import static_decode


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm (``LlamaRMSNorm.forward``): normalise in fp32, scale in ``x``'s dtype.

    Written out rather than calling the layer's module: a module passed into a compiled
    function is guarded by identity, so each of the 30 layers would compile again (past
    dynamo's recompile limit); weights passed as tensors share one compiled graph."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def before_attention(x, ln, eps: float, qkv, cos, sin, heads: int, kv_heads: int, dim: int):
    """q (grouped per kv head, as the eager one-token step has it), k and v of one step."""
    b = x.shape[0]
    q, k, v = (rms_norm(x, ln, eps) @ qkv).split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    q = q.view(b, 1, heads, dim).transpose(1, 2)
    k = k.view(b, 1, kv_heads, dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return (
        q.reshape(b, kv_heads, heads // kv_heads, dim),
        k,
        v.view(b, 1, kv_heads, dim).transpose(1, 2),
    )


def after_attention(x, out, o, ln, eps: float, gate_up, down):
    """The rest of one decoder block: output projection, residuals and the gated MLP."""
    x = x + out @ o
    gate, up = (rms_norm(x, ln, eps) @ gate_up).chunk(2, -1)
    return x + (F.silu(gate) * up) @ down


def last_logits(x, ln, eps: float, head):
    """The final norm and the LM head at the last position, as the eager step computes them."""
    return (head @ rms_norm(x[:, -1], ln, eps).T).T.float().contiguous()


def patch_decoder() -> None:
    """Replace ``StaticDecoder._forward`` for one-token steps by the compiled pieces."""
    pre, post, final = (
        torch.compile(f, dynamic=False, fullgraph=True)
        for f in (before_attention, after_attention, last_logits)
    )
    eager = static_decode.StaticDecoder._forward

    # The one-token branch of StaticDecoder._forward with the compiled pieces swapped in; it
    # is mirrored here, not factored out of the decoder, so that the rollouts' own step stays
    # as it is for a lever that was measured and not adopted.
    def forward(self, ids, positions, mask, start):
        b, t = ids.shape
        if t != 1:
            return eager(self, ids, positions, mask, start)
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        x = F.embedding(ids, self.embed)
        cos, sin = self.rotary(x, positions)
        for layer, (k_cache, v_cache) in zip(self.layers, self._cache, strict=True):
            ln = layer.ln_in
            q, k, v = pre(x, ln.weight, ln.variance_epsilon, layer.qkv.weight, cos, sin, h, kvh, d)
            k_cache[:, :, start : start + 1] = k
            v_cache[:, :, start : start + 1] = v
            keys, values = k_cache[:, :, : start + 1], v_cache[:, :, : start + 1]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            ln = layer.ln_post
            x = post(x, out.reshape(b, 1, h * d), layer.o.weight, ln.weight, ln.variance_epsilon,
                     layer.gate_up.weight, layer.down.weight)  # fmt: skip
        return final(x, self.norm.weight, self.norm.variance_epsilon, self.head)

    static_decode.StaticDecoder._forward = forward
    # the pieces multiply input-major tensors: the decoder's unpacked layout (the oneDNN-packed
    # one is an opaque tensor inductor does not take as an input), and attend over the cache's
    # keys as [B, G, C, d]: not the fused kernel's transposed keys
    init = static_decode.StaticDecoder.__init__

    def unpacked(self, net, adapter, packed=None, kernels=None):
        init(self, net, adapter, packed=False, kernels=False)

    static_decode.StaticDecoder.__init__ = unpacked


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compile", choices=("off", "pieces"), default="pieces")
    args, rest = p.parse_known_args(argv)
    if args.compile == "pieces":
        patch_decoder()
    return decode_throughput.main(rest)


if __name__ == "__main__":
    sys.exit(main())
