"""The paper's two numerical claims on an LLM (SmolLM2-135M-Instruct by default), measured.

1. **bf16-rounded log-probs and clipping** (paper Sec. 4.1 "16-bit Quantization of Model
   Outputs Affects Clipping", Thm 3): rounding log-probs to bf16 before the importance ratio
   makes the upper clip bind more often and the lower clip less often than exact fp32. On the
   demo's batch (fp32 ``hf`` sampler), the real update takes ``--steps`` optimizer steps; after
   each, the clip decisions are taken on the same log-probs exactly and with old and new both
   rounded to bf16, and compared with symmetric noise of bf16's size (Thm 3's own model of the
   rounding error) to tell a rounding bias from how the ratios sit around the clip bounds.
2. **The sampler/trainer mismatch per sampler dtype** (Sec. 4.1, the figure "Inference/train
   discrepancy depending on dtype"): the ``hf`` engine samples in fp32, bf16 and fp16 and
   reports its log-probs; the exact fp32 learner scores the same tokens.

docs/llm-claims.md explains every number.

    PYTHONPATH=$PWD nice -n 19 .venv/bin/python benchmarks/llm_claims.py --threads 1 --table
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from demo_workload import AGENT, DEFAULT_LR, ENV, ENV_KWARGS, demo_config
from llm_claims_stats import bf16_clip_effect, mismatch_verdict, pool

RATIO_BAND = (0.8, 1.2)  # GRPO's clip range: the mismatch a sampler adds is clipped outside it


def make_agent(model: str) -> Any:
    """The demo's conversation settings (system prompt, 48 response tokens) for ``model``."""
    from entrogym.agents.agent import LLMAgent

    return LLMAgent.from_model(model, **replace(AGENT, model=model).agent_kwargs())


def sample_batch(engine: Any, agent: Any, *, tasks: int, k: int, seed: int) -> Any:
    """``k`` completions of ``tasks`` training tasks of the demo's env drawn by ``engine`` at
    temperature 1 without truncation, with their rewards, as the trainer's padded ``UpdateBatch``."""
    from entrogym.agents.engines import SamplingParams
    from entrogym.agents.rollout import collect_rollouts
    from entrogym.envs.base import make_text_env, task_ids_of
    from entrogym.train.batch import collate_episodes, usable_episodes

    env = make_text_env(ENV, **ENV_KWARGS)
    task_ids = task_ids_of(env, "train")
    env.close()
    chosen = random.Random(seed).sample(task_ids, tasks)
    torch.manual_seed(seed)  # the hf engine draws from torch's global generator
    rollouts = collect_rollouts(
        ENV, chosen, engine, agent, k=k, sampling=SamplingParams(temperature=1.0),
        early_stop=False, env_kwargs=ENV_KWARGS, seed=seed * 1_000_003,
    )  # fmt: skip
    episodes = usable_episodes([e for e in rollouts if not e.failed])
    return collate_episodes(episodes, agent.tokenizer.pad_token_id or 0)


def make_scorer(policy: torch.nn.Module, batch: Any):
    """The trainer's scoring of rows ``index`` (fp32 log-probs, action-only head, trimmed
    layout) as ``policy_update``'s ScoreFn: ``(index, need_entropy) -> ([b, w], None)``."""
    from entrogym.train.learner.logprobs import sequence_logprobs

    def score(index: torch.Tensor, need_entropy: bool = False):
        ids, attention = batch.tokens(index)
        lp = sequence_logprobs(
            policy, ids, attention, score_mask=batch.actions(index), layout="trimmed"
        )
        return lp, None

    return score


def score_all(score, n: int, width: int, micro: int) -> torch.Tensor:
    """``[n, width]`` log-probs of every row, in fixed micro-batches of ``micro`` rows (the same
    split every call, so a policy scored twice gives bit-identical values)."""
    from entrogym.algos.update_batch import micro_batches

    parts = []
    with torch.no_grad():
        for index in micro_batches(torch.arange(n), micro):
            lp = score(index)[0]
            parts.append(torch.nn.functional.pad(lp, (0, width - lp.shape[1])))
    return torch.cat(parts)


def update_and_measure(policy, batch: Any, algo: Any, cfg: Any, steps: int) -> list[dict]:
    """Take ``steps`` optimizer steps of the real update on ``batch`` (old log-probs: the
    policy's own fp32 scores) and measure :func:`bf16_clip_effect` before the first step (a
    self-check: both ratios are exactly 1) and after each step."""
    from entrogym.algos import EntropyControl
    from entrogym.algos.update import policy_update
    from entrogym.algos.update_batch import UpdateBatch
    from entrogym.train.learner.policy import trainable_parameters

    score = make_scorer(policy, batch)
    n, width, micro = len(batch), batch.mask.shape[1], cfg.micro_batch_size
    old = score_all(score, n, width, micro)
    experience = UpdateBatch.build(
        algo.advantage, rewards=batch.rewards, group_ids=batch.group_ids,
        mask=batch.mask, lengths=batch.lengths, old_logprobs=old.clone(),
    )  # fmt: skip
    mask, adv = batch.mask.float(), experience.advantages
    measured = [bf16_clip_effect(score_all(score, n, width, micro), old, adv, mask, algo)]
    params = trainable_parameters(policy)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def step() -> bool:
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        measured.append(bf16_clip_effect(score_all(score, n, width, micro), old, adv, mask, algo))
        return True

    policy_update(
        EntropyControl(replace(algo, epochs=steps, minibatch_size=None)), experience,
        score=score, backward=lambda loss: loss.backward(), step=step,
        zero_grad=lambda: optimizer.zero_grad(set_to_none=True), micro_batch_size=micro,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    for i, row in enumerate(measured):
        row["step"] = i
    return measured


def bf16_clipping_claim(args: argparse.Namespace, model: str, agent: Any) -> dict:
    """Claim 1 over ``args.seeds`` batches: per-seed rows and pooled rows per step."""
    from entrogym.agents.engines import make_engine
    from entrogym.algos.presets import get_algorithm
    from entrogym.commands.demo_runs import parse_run
    from entrogym.train.learner.policy import LoraSettings, load_policy

    algo = get_algorithm(args.algo)
    per_seed: list[list[dict]] = []
    with make_engine("hf", model, dtype="fp32", max_model_len=AGENT.max_context_tokens) as engine:
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            cfg = demo_config(parse_run(args.algo).algo, Path(os.devnull), 1, args.lr, 1, seed=seed)
            batch = sample_batch(engine, agent, tasks=args.tasks, k=args.k, seed=seed)
            policy = load_policy(
                model, lora=LoraSettings(r=cfg.lora_rank, alpha=cfg.lora_alpha), seed=seed
            )
            rows = update_and_measure(policy, batch, algo, cfg, args.steps)
            per_seed.append(rows)
            say({"bf16_clipping_seed": seed, "s": round(time.perf_counter() - t0, 1),
                 "after_step_1": rows[1]["flips"] if len(rows) > 1 else None})  # fmt: skip
    pooled = {f"step_{s}": pool([rows[s] for rows in per_seed]) for s in range(1, args.steps + 1)}
    for row in (r for rows in per_seed for r in rows):
        row.pop("noise_control_net")  # pooled above; per seed it would only bloat the report
    self_check = max(abs(rows[0]["mean_abs_log_ratio"]) for rows in per_seed)
    return {
        "algo": algo.name,
        "eps_low": algo.loss.params.eps_low,
        "eps_high": algo.loss.params.eps_high,
        "lr": args.lr,
        "self_check_mean_abs_log_ratio_before_step": self_check,
        "pooled": pooled,
        "per_seed": per_seed,
        "verdict": pooled["step_1"]["verdict"],  # after one step: the brief's headline
    }


def mismatch_claim(args: argparse.Namespace, model: str, agent: Any) -> dict:
    """Claim 2: per sampler dtype, its batch scored by the exact fp32 learner; the verdict on
    the order of the dtypes."""
    from entrogym.agents.engines import make_engine
    from entrogym.train.learner.mismatch import sampler_mismatch
    from entrogym.train.learner.policy import load_base_model

    learner, rows = load_base_model(model, dtype="fp32"), {}
    for dtype in args.dtypes:
        t0 = time.perf_counter()
        kwargs = {"dtype": dtype, "max_model_len": AGENT.max_context_tokens, "seed": args.seed}
        with make_engine("hf", model, **kwargs) as engine:
            batch = sample_batch(engine, agent, tasks=args.mismatch_tasks, k=args.k, seed=args.seed)
        n, width = len(batch), batch.mask.shape[1]
        learner_lp = score_all(make_scorer(learner, batch), n, width, args.micro)
        m = sampler_mismatch(
            learner_lp, batch.sampler_logprobs, batch.mask, low=RATIO_BAND[0],
            high=RATIO_BAND[1],
        )  # fmt: skip
        rows[dtype] = {
            "tokens": m["num_tokens"],
            "mean_abs_dlogp": m["mean_abs_diff"],
            "max_abs_dlogp": m["max_abs_diff"],
            "frac_ratio_outside_0.8_1.2": m["frac_ratio_outside"],
            "mean_sampler_minus_learner": None if m["mean_diff"] is None else -m["mean_diff"],
            "sampler_nonfinite": m["sampler_nonfinite"],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        say({f"mismatch_{dtype}": rows[dtype]})
    return {"rows": rows, "verdict": mismatch_verdict(rows)}


def say(obj: dict) -> None:
    """Progress on stderr (partial results survive an interrupted run)."""
    print(json.dumps(obj), file=sys.stderr, flush=True)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Markdown table lines."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header)] + [
        f"| {' | '.join(str(c) for c in row)} |" for row in rows
    ]


def markdown(report: dict) -> str:
    """The two tables a reader wants: clip fractions per step, mismatch per sampler dtype."""
    lines = []
    if "bf16_clipping" in report:
        c, rows = report["bf16_clipping"], []
        for key, p in c["pooled"].items():
            f, b, fl, t = p["fp32"], p["bf16"], p["flips"], p["thm3_ratio_bias"]
            ctrl = p["noise_control"]
            rows.append([
                key.split("_")[1], p["tokens"], f"{p['mean_abs_log_ratio']:.3f}",
                f"{f['clip_frac_high']:.4f} / {f['clip_frac_low']:.4f}",
                f"{b['clip_frac_high']:.4f} / {b['clip_frac_low']:.4f}",
                f"{fl['high_gained']} / {fl['high_lost']} / {fl['low_gained']} / {fl['low_lost']}",
                "-" if fl["p_value"] is None else f"{fl['p_value']:.3g}",
                f"{ctrl['mean_net_toward']:+.1f} ({ctrl['p_value']:.3g})",
                f"{t['mean']:.1e} ± {t['stderr']:.1e} ({t['predicted']:.1e})",
            ])  # fmt: skip
        lines += [f"{c['algo']}, eps {c['eps_low']}/{c['eps_high']}, lr {c['lr']}, "
                  f"{len(c['per_seed'])} seeds", ""]  # fmt: skip
        lines += table(
            ["after step", "tokens", "mean abs log r", "fp32 high / low", "bf16 high / low",
             "high +/-, low +/- (bf16 flips)", "sign p",
             "noise net (p)", "r_obs/r_true - 1 (Thm 3 predicts)"],
            rows,
        )  # fmt: skip
        lines += ["", f"Verdict: {c['verdict']}", ""]
    if "sampler_mismatch" in report:
        m = report["sampler_mismatch"]
        rows = [
            [d, r["tokens"], f"{r['mean_abs_dlogp']:.2e}", f"{r['max_abs_dlogp']:.2e}",
             f"{r['frac_ratio_outside_0.8_1.2']:.4f}", f"{r['mean_sampler_minus_learner']:+.2e}"]
            for d, r in m["rows"].items()
        ]  # fmt: skip
        lines += table(
            ["sampler", "tokens", "mean abs dlogp", "max abs dlogp", "ratio outside [0.8, 1.2]",
             "mean sampler - learner"],
            rows,
        )  # fmt: skip
        lines += ["", f"Verdict: {m['verdict']}"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from entrogym.dtypes import DTYPE_NAMES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--claims", default="clipping,mismatch", help="comma-separated subset")
    p.add_argument("--algo", default="grpo", help="preset whose advantages, loss and clip range")
    p.add_argument("--seeds", type=int, default=8, help="batches for the clipping claim")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per batch")
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--lr", type=float, default=None, help="default: the demo's")
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES), help="sampler dtypes")
    p.add_argument("--mismatch-tasks", type=int, default=6)
    p.add_argument("--seed", type=int, default=0, help="the mismatch batch's seed")
    p.add_argument(
        "--micro", type=int, default=6, help="rows per micro-batch of the mismatch learner"
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--table", action="store_true", help="also print markdown tables")
    args = p.parse_args(argv)
    args.claims = [c for c in args.claims.split(",") if c]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    if not args.claims or set(args.claims) - {"clipping", "mismatch"}:
        p.error(f"--claims: choose from clipping, mismatch, got {args.claims}")
    if [d for d in args.dtypes if d not in DTYPE_NAMES] or not args.dtypes:
        p.error(f"--dtypes: choose from {', '.join(DTYPE_NAMES)}, got {args.dtypes}")
    for name in ("seeds", "steps", "tasks", "mismatch_tasks", "micro"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.k < 2:
        p.error("--k must be >= 2 (GRPO's group baseline needs two samples per task)")
    return args


def run(args: argparse.Namespace) -> dict:
    """Both claims as one JSON-ready report."""
    from entrogym.models import resolve_model
    from entrogym.train.devices.precision import apply_threads

    if args.threads:
        apply_threads(args.threads)
    args.lr = DEFAULT_LR if args.lr is None else args.lr
    model = str(resolve_model(args.model))
    agent = make_agent(model)
    t0 = time.perf_counter()
    report: dict[str, Any] = {"model": args.model, "load_avg_start": os.getloadavg()}
    if "clipping" in args.claims:
        report["bf16_clipping"] = bf16_clipping_claim(args, model, agent)
    if "mismatch" in args.claims:
        report["sampler_mismatch"] = mismatch_claim(args, model, agent)
    report["load_avg_end"] = os.getloadavg()
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=1))
    if args.table:
        print(markdown(report))


if __name__ == "__main__":
    main()
