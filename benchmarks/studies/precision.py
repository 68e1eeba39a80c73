"""What a low-precision learner body costs in exactness, on a fixed batch of the demo's shape.

An fp32 sampler (HF ``generate``, fp32 logits) draws K completions for the demo's first
prompts; then the batch is scored by learners that differ only in dtype:

* ``fp32``: the exact path;
* ``bf16+fp32head`` / ``fp16+fp32head``: body in bf16 / fp16, LM head and log-probs in fp32
  from fp32-upcast hidden states (``load_base_model(..., head_dtype="fp32")``);
* ``bf16``: everything in bf16 (the head's weight rounded to bf16, log-probs still fp32).

For each: the sampler/trainer mismatch |logp_learner - logp_sampler| over action tokens, the
ratio exp(logp_learner - logp_sampler) (the first minibatch's old/new ratio when the old
log-probs come from the sampler: its spread, and the fraction outside GRPO's [0.8, 1.2], which
is what would be clipped; fp32's is the baseline), the old/new ratio spread of the learner
against itself when the same rows are scored in a different micro-batching (6 rows vs 1), and
the seconds of one forward + backward over the batch.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/studies/precision.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

# The shared benchmark modules (demo_workload.py, roofline.py, ...) sit one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo_workload import ENV, ENV_KWARGS, SYSTEM_PROMPT  # noqa: E402


def sample_batch(model_dir: str, tasks: int, k: int, tokens: int, seed: int):
    """Right-padded [B, T] ids / attention / action masks and the sampler's fp32 log-probs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from entrogym.envs.base import make_text_env, task_ids_of

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    env = make_text_env(ENV, **ENV_KWARGS)
    rows = []
    torch.manual_seed(seed)
    for task in task_ids_of(env, "train")[:tasks]:
        obs, _ = env.reset(options={"task_id": task})
        chat = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs}]
        prompt = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
        prompt = prompt["input_ids"] if not torch.is_tensor(prompt) else prompt
        with torch.no_grad():
            out = model.generate(
                prompt,
                do_sample=True,
                max_new_tokens=tokens,
                num_return_sequences=k,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=tok.eos_token_id,
            )
        new = out.sequences[:, prompt.shape[1] :]
        logits = torch.stack(out.logits, 1).float()
        logp = torch.log_softmax(logits, -1).gather(-1, new[..., None])[..., 0]
        for i in range(k):
            n = (
                int((new[i] == tok.eos_token_id).nonzero()[0]) + 1
                if (new[i] == tok.eos_token_id).any()
                else new.shape[1]
            )
            rows.append((prompt[0], new[i, :n], logp[i, :n]))
    env.close()
    t = max(len(p) + len(c) for p, c, _ in rows)
    ids = torch.full((len(rows), t), tok.eos_token_id)
    attn, act, sampler = (torch.zeros(len(rows), t) for _ in range(3))
    for i, (p, c, lp) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.cat([p, c])
        attn[i, : len(p) + len(c)] = 1
        act[i, len(p) : len(p) + len(c)] = 1
        sampler[i, len(p) : len(p) + len(c)] = lp
    return ids, attn.long(), act, sampler


def score(model, ids, attn, act, micro: int) -> torch.Tensor:
    from entrogym.train.learner.logprobs import sequence_logprobs

    parts = []
    for s in range(0, len(ids), micro):
        sl = slice(s, s + micro)
        lp = sequence_logprobs(model, ids[sl], attn[sl], score_mask=act[sl], layout="trimmed")
        parts.append(torch.nn.functional.pad(lp, (0, ids.shape[1] - lp.shape[1])))
    return torch.cat(parts)


def measure(model, ids, attn, act, sampler) -> dict:
    keep = act.bool()
    with torch.no_grad():
        lp = score(model, ids, attn, act, 6)
        lp1 = score(model, ids, attn, act, 1)
    diff = (lp - sampler)[keep]
    ratio = diff.exp()
    self_ratio = (lp - lp1)[keep].exp()
    t0 = time.perf_counter()
    (score(model, ids, attn, act, 6) * act).sum().backward()
    return {
        "mismatch_mean_abs": float(diff.abs().mean()),
        "mismatch_max_abs": float(diff.abs().max()),
        "ratio_std": float(ratio.std()),
        "clip_fraction_0.8_1.2": float(((ratio < 0.8) | (ratio > 1.2)).float().mean()),
        "self_ratio_std_micro6_vs_1": float(self_ratio.std()),
        "forward_backward_s": round(time.perf_counter() - t0, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--bound", type=float, default=1e-3, help="max mean |dlogp| vs the sampler")
    args = p.parse_args()
    from entrogym.models import resolve_model
    from entrogym.train.devices.precision import apply_threads, cpu_has_native
    from entrogym.train.learner.policy import apply_lora, load_base_model

    if args.threads:
        apply_threads(args.threads)
    model_dir = str(resolve_model(args.model))
    batch = sample_batch(model_dir, args.tasks, args.k, args.tokens, seed=0)
    variants = {"fp32": ("fp32", None), "bf16+fp32head": ("bf16", "fp32"), "bf16": ("bf16", None)}
    if cpu_has_native(torch.float16):
        variants["fp16+fp32head"] = ("fp16", "fp32")
    report = {"action_tokens": int(batch[2].sum()), "rows": len(batch[0])}
    for name, (dtype, head) in variants.items():
        model = apply_lora(load_base_model(model_dir, dtype=dtype, head_dtype=head), seed=0)
        report[name] = measure(model, *batch)
        print(json.dumps({name: report[name]}), file=sys.stderr, flush=True)  # partial results
    report["bound"] = {"mismatch_mean_abs_max": args.bound, "clip_fraction_max": 0.0}
    report["fastest_within_bound"] = fastest_within_bound(report, args.bound)
    print(json.dumps(report, indent=1))


def fastest_within_bound(report: dict, bound: float) -> str | None:
    """The quickest learner whose mean |dlogp| vs the sampler is <= bound and clips nothing."""
    ok = [
        (r["forward_backward_s"], name)
        for name, r in report.items()
        if isinstance(r, dict)
        and "mismatch_mean_abs" in r
        and r["mismatch_mean_abs"] <= bound
        and r["clip_fraction_0.8_1.2"] == 0.0
    ]
    return min(ok)[1] if ok else None


if __name__ == "__main__":
    main()
