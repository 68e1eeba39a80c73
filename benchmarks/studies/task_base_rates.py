"""The base model's success rate on candidate tasks: which env fits as a sequential experiment's
second task (base success 20-60 %, short answers) and which as its first. With ``--adapter
LABEL=PATH`` it also scores trained adapters (a sequential experiment's stage-1 policies) on the
same tasks and samples, to see where a collapsed start samples fewer correct answers than a held
one.

One ``hf`` engine and agent are loaded once; every candidate is evaluated on the first
``--tasks`` held-out tasks with ``--samples`` samples each, sampled as the trainer's eval rows
sample (temperature 1, seeded). Prints one JSON object per candidate as it finishes, then all
of them, with pass@1, pass@k for k in 1, 4, ..., the samples, and the wall time.

    python benchmarks/studies/task_base_rates.py --tasks 40 --samples 8 --out runs/base-rates.json
    python benchmarks/studies/task_base_rates.py --only arith-1digit-3ops --no-base \
        --adapter grpo=runs/demo/seed0/grpo/adapters/v000015
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

# The shared benchmark modules (demo_workload.py, roofline.py, ...) sit one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo_workload import AGENT, PAIRS  # noqa: E402

from entrogym.agents.agent import LLMAgent  # noqa: E402
from entrogym.agents.config import AgentConfig  # noqa: E402
from entrogym.agents.engines import make_engine  # noqa: E402
from entrogym.atomic import atomic_write_text  # noqa: E402
from entrogym.train.evaluation.evaluate import evaluate_policy, mean_pass_at_k  # noqa: E402

ARITHMETIC = "entrogym/Arithmetic-v0"
REASONING_GYM = "entrogym/ReasoningGym-v0"
# name -> (env id, env kwargs). The arithmetic variants keep the demo's split sizes.
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "arith-1digit": (ARITHMETIC, {"max_digits": 1, "num_train": 100, "num_test": 40}),
    "arith-1digit-mul": (
        ARITHMETIC,
        # 100 ordered pairs of one-digit operands: 60 distinct problems in all
        {"max_digits": 1, "operations": "*", "num_train": 40, "num_test": 20},
    ),
    "arith-1digit-3ops": (
        ARITHMETIC,
        {"max_digits": 1, "num_operands": 3, "num_train": 100, "num_test": 40},
    ),
    "arith-1digit-3ops-add": (
        ARITHMETIC,
        {"max_digits": 1, "num_operands": 3, "operations": "+", "num_train": 100, "num_test": 40},
    ),
    "arith-2digit": (ARITHMETIC, {"max_digits": 2, "num_train": 100, "num_test": 40}),
    "arith-1digit-mixed": (
        ARITHMETIC,
        {"max_digits": 1, "operations": "+-*", "num_train": 100, "num_test": 40},
    ),
    "arith-1digit-sub-neg": (
        ARITHMETIC,
        # all 100 ordered pairs (45 with a negative difference), split 60 / 40
        {
            "max_digits": 1,
            "operations": "-",
            "allow_negative": True,
            "num_train": 60,
            "num_test": 40,
        },
    ),
    # the same 100 pairs as |a - b|: on the 45 negative differences the signed answer is wrong
    # (the neg-abs pair's B)
    "arith-1digit-sub-abs": (PAIRS["neg-abs"].b.env, PAIRS["neg-abs"].b.env_kwargs),
    "arith-1digit-sub-abs-neg": (
        ARITHMETIC,
        # the 45 pairs negative inside the bars only: the signed answer is wrong on every task
        {
            "max_digits": 1,
            "operations": "-",
            "allow_negative": True,
            "negative_only": True,
            "absolute": True,
            "num_train": 25,
            "num_test": 20,
        },
    ),
    "arith-1digit-neg": (
        ARITHMETIC,
        {"max_digits": 1, "allow_negative": True, "num_train": 100, "num_test": 40},
    ),
}
RG_DATASETS = (
    "basic_arithmetic",
    "chain_sum",
    "count_bits",
    "gcd",
    "letter_counting",
    "number_sorting",
    "spell_backward",
    "simple_equations",
    "products",
    "lcm",
    "base_conversion",
    "word_sorting",
    "leg_counting",
    "decimal_arithmetic",
    "power_function",
    "coin_flip",
    "number_filtering",
    "count_primes",
)
for _name in RG_DATASETS:
    CANDIDATES[f"rg-{_name}"] = (
        REASONING_GYM,
        {"dataset": _name, "size": 100, "test_size": 40, "seed": 0},
    )
    # graded as Arithmetic-v0 is: the last number counts where nothing is tagged or boxed
    CANDIDATES[f"rg-{_name}-bare"] = (
        REASONING_GYM,
        {"dataset": _name, "size": 100, "test_size": 40, "seed": 0, "bare_number": True},
    )

# reasoning-gym's defaults are far out of a 135M model's reach (five-term sums of four-digit
# numbers, ten kinds of animal): these configs scale a dataset down to its edge, graded bare.
RG_EASY: dict[str, tuple[str, dict[str, Any]]] = {
    "legs-1": ("leg_counting", {"min_animals": 1, "max_animals": 1, "max_instances": 3}),
    "legs-2": ("leg_counting", {"min_animals": 1, "max_animals": 2, "max_instances": 2}),
    "letters-2": ("letter_counting", {"min_words": 1, "max_words": 2}),
    "gcd-20": ("gcd", {"max_value": 20}),
    "gcd-10": ("gcd", {"max_value": 10}),
    "equations-9": (
        "simple_equations",
        {
            "min_terms": 2,
            "max_terms": 2,
            "max_value": 9,
            "operators": ["+", "-"],
            "operators_weights": [0.5, 0.5],
        },
    ),
    "bits-15": ("count_bits", {"max_n": 15}),
    "bits-7": ("count_bits", {"max_n": 7}),
}
for _name, (_dataset, _config) in RG_EASY.items():
    CANDIDATES[f"rg-{_name}-bare"] = (
        REASONING_GYM,
        {"dataset": _dataset, "config": _config, "size": 100, "test_size": 40, "seed": 0,
         "bare_number": True},
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-response-tokens", type=int, default=AGENT.max_response_tokens)
    parser.add_argument("--only", nargs="*", default=None, help="candidate names to run")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="also score this LoRA adapter folder (repeatable)",
    )
    parser.add_argument("--no-base", action="store_true", help="score only the adapters")
    args = parser.parse_args()
    policies: list[tuple[str, str | None]] = [] if args.no_base else [("base", None)]
    for spec in args.adapter:
        label, sep, path = spec.partition("=")
        if not sep or not label or not Path(path, "adapter_config.json").is_file():
            parser.error(
                f"--adapter {spec!r}: give LABEL=PATH to a folder with adapter_config.json"
            )
        policies.append((label, path))
    if not policies:
        parser.error("--no-base leaves nothing to score: add an --adapter LABEL=PATH")
    names = args.only or list(CANDIDATES)
    unknown = sorted(set(names) - set(CANDIDATES))
    if unknown:
        parser.error(f"unknown candidates {unknown}; choose from {sorted(CANDIDATES)}")
    cfg = AgentConfig(**(asdict(AGENT) | {"max_response_tokens": args.max_response_tokens}))
    engine = make_engine(cfg.engine, cfg.model, **cfg.engine_kwargs(seed=args.seed))
    agent = LLMAgent.from_model(cfg.model, **cfg.agent_kwargs())
    results = []
    try:
        for name, (label, adapter) in itertools.product(names, policies):
            env_id, kwargs = CANDIDATES[name]
            t0 = time.perf_counter()
            try:
                result = evaluate_policy(engine, agent, env_id, split="test",
                                         samples=args.samples, max_tasks=args.tasks,
                                         adapter=adapter, temperature=1.0, seed=args.seed,
                                         env_kwargs=kwargs)  # fmt: skip
            except Exception as exc:  # a candidate that cannot run is reported, not fatal
                row = {"name": name, "policy": label, "error": f"{type(exc).__name__}: {exc}"}
            else:
                # per task: one bool per sample that ran (env errors left out)
                correct = {
                    t["task_id"]: [True] * t["correct"]
                    + [False] * (t["samples"] - t["env_errors"] - t["correct"])
                    for t in result.per_task
                }
                ks = sorted({k for k in (1, 4, 16, 64) if k <= args.samples} | {args.samples})
                row = {
                    "name": name,
                    "policy": label,
                    "env": env_id,
                    "env_kwargs": kwargs,
                    "pass_at_k": {str(k): mean_pass_at_k(correct, k) for k in ks}
                    if correct
                    else None,
                    "summary": {
                        k: v for k, v in result.summary.items() if not isinstance(v, (list, dict))
                    },
                    "wall_s": round(time.perf_counter() - t0, 1),
                }
            print(json.dumps(row), flush=True)
            results.append(row)
            if args.out:
                atomic_write_text(args.out, json.dumps(results, indent=1))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
