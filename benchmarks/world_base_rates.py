"""The base model's rates on the world (``entrogym/World-v0``), per split and template: TGC,
mean reward (fraction of checks), turns per episode, the share of turns that are well-formed
tool calls, and how episodes ended. This is how the world's task mix and prompt were chosen
(issue 68: base TGC on ``test_normal`` 5-30 %, discovery tasks rare but not absent, 2-5 turns).

The episodes run through the path a user's run takes: ``collect_rollouts`` with the registered
env and an ``LLMAgent`` in the ``call`` tool format, the env's demonstrations as chat turns,
temperature 1 (the training temperature). Every task of each split is run ``--samples`` times.
``--adapter`` measures a trained LoRA policy the same way (a run's ``checkpoints/*/adapter``).

    python benchmarks/world_base_rates.py --samples 3 --out benchmarks/results/world.json
    python benchmarks/world_base_rates.py --adapter RUN/checkpoints/latest/adapter --splits test_normal
    python benchmarks/world_base_rates.py --model tiny-random-llama --scenarios 1 --samples 1
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import Counter, defaultdict
from typing import Any

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, check_adapter, make_engine
from entrogym.agents.rollout import collect_rollouts
from entrogym.agents.tool_format import get_tool_format
from entrogym.atomic import atomic_write_text
from entrogym.envs.appworld.metrics import completion_by_sample
from entrogym.envs.tools import argument_problem
from entrogym.envs.world.demos import DEFAULT_DEMONSTRATIONS
from entrogym.envs.world.env import DEFAULT_MAX_TURNS, WorldEnv
from entrogym.envs.world.tasks import TEMPLATES, scenario_of
from entrogym.models import resolve_model

ENV_ID = "entrogym/World-v0"


def turn_kind(text: str, tools: list[dict[str, Any]], fmt: Any) -> str:
    """``call`` (every call in the turn parses, names a tool and has valid arguments),
    ``bad_call`` (a call that does not) or ``text`` (no call: the episode's end)."""
    message = fmt.parse(text, tools)
    if message.parse_error is not None:
        return "bad_call"
    if not message.tool_calls:
        return "text"
    schemas = {t["function"]["name"]: t for t in tools}
    for call in message.tool_calls:
        if call.name not in schemas or argument_problem(schemas[call.name], call.arguments):
            return "bad_call"
    return "call"


def summarize(episodes: list[Any], tools: list[dict[str, Any]], fmt: Any) -> dict[str, Any]:
    kinds: Counter = Counter()
    for e in episodes:
        kinds.update(turn_kind(a, tools, fmt) for a in e.info.get("actions", []))
    turns = sum(kinds.values())
    n = len(episodes)
    return {
        "episodes": n,
        "tgc": sum(bool(e.info.get("success")) for e in episodes) / n,
        "mean_reward": sum(e.reward for e in episodes) / n,
        "mean_turns": sum(e.num_turns for e in episodes) / n,
        "well_formed_call_share": kinds["call"] / turns if turns else 0.0,
        "turn_kinds": dict(kinds),
        "end_reasons": dict(Counter(e.info.get("end_reason") for e in episodes)),
        "failed": sum(e.failed for e in episodes),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--adapter", default=None, help="LoRA adapter to measure (None: base)")
    p.add_argument("--splits", nargs="+", default=["test_normal", "test_challenge"])
    p.add_argument("--scenarios", type=int, default=8, help="test scenarios per template")
    p.add_argument("--samples", type=int, default=3, help="episodes per task")
    p.add_argument("--templates", nargs="*", default=None, help="only these templates")
    p.add_argument("--demonstrations", nargs="*", default=list(DEFAULT_DEMONSTRATIONS))
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-turns", type=int, default=DEFAULT_MAX_TURNS)
    p.add_argument("--max-turn-tokens", type=int, default=48)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--decode", default="static-cdf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=48, help="episodes run at once (memory)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--all-episodes", action="store_true", help="keep every episode's actions")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    env_kwargs = {"test_scenarios": args.scenarios, "train_scenarios": args.scenarios,
                  "demonstrations": args.demonstrations, "max_turns": args.max_turns}  # fmt: skip
    try:
        probe = WorldEnv(**env_kwargs)
        for split in args.splits:
            probe.resolve_split(split)
    except ValueError as e:
        p.error(str(e))
    unknown = set(args.templates or ()) - set(TEMPLATES)
    if unknown:
        p.error(f"unknown template(s) {sorted(unknown)}; choose from {list(TEMPLATES)}")
    if args.adapter is not None:
        try:
            args.adapter = check_adapter(args.adapter, resolve_model(args.model))
        except ValueError as e:
            p.error(str(e))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    engine = make_engine("hf", args.model, dtype=args.dtype, max_model_len=2048,
                         decode=args.decode, seed=args.seed)  # fmt: skip
    agent = LLMAgent(tokenizer, tool_format="call", max_turn_tokens=args.max_turn_tokens,
                     max_context=2048, on_turn_budget=probe.on_turn_budget)  # fmt: skip
    fmt = get_tool_format("call")
    results: dict[str, Any] = {
        "model": args.model, "adapter": args.adapter, "env": ENV_ID, "env_kwargs": env_kwargs,
        "temperature": args.temperature, "samples": args.samples,
        "max_turn_tokens": args.max_turn_tokens, "dtype": args.dtype, "decode": args.decode,
        "seed": args.seed, "host": platform.processor() or platform.machine(), "splits": {},
    }  # fmt: skip
    try:
        for split in args.splits:
            tasks = [t for t in probe.task_ids(split)
                     if args.templates is None or probe.task(t).template in args.templates]  # fmt: skip
            t0 = time.perf_counter()
            episodes: list[Any] = []
            # the engine holds a batch's caches at once: a bounded batch bounds the memory
            per_batch = max(1, args.batch // args.samples)
            for start in range(0, len(tasks), per_batch):
                episodes += collect_rollouts(
                    ENV_ID, tasks[start : start + per_batch], engine, agent, k=args.samples,
                    early_stop=False, sampling=SamplingParams(temperature=args.temperature),
                    seed=args.seed + start * args.samples, adapter=args.adapter,
                    env_kwargs={**env_kwargs, "split": split}, env_workers=0,
                )  # fmt: skip
                print(f"  {split}: {len(episodes)} episodes, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
            wall = time.perf_counter() - t0
            by_template: dict[str, list[Any]] = defaultdict(list)
            for e in episodes:
                by_template[probe.task(e.task_id).template].append(e)
            summary = {
                "all": summarize(episodes, probe.tool_schemas, fmt),
                "templates": {
                    t: summarize(es, probe.tool_schemas, fmt) for t, es in by_template.items()
                },  # fmt: skip
                "wall_s": round(wall, 1),
            }
            completion = completion_by_sample(episodes, tasks, args.samples, scenario_of)
            summary["all"]["sgc"] = completion["sgc"]
            records = [
                {"task_id": e.task_id, "task": probe.task(e.task_id).instruction,
                 "actions": e.info.get("actions"), "reward": e.reward,
                 "end_reason": e.info.get("end_reason")}
                for e in episodes
            ]  # fmt: skip
            # two examples per template; every episode with --all-episodes
            summary["examples"] = [
                r for t in by_template
                for r in [x for x in records if probe.task(x["task_id"]).template == t][:2]
            ]  # fmt: skip
            if args.all_episodes:
                summary["episodes"] = records
            results["splits"][split] = summary
            if args.out:  # after each split: a long run keeps what it measured
                atomic_write_text(args.out, json.dumps(results, indent=1) + "\n")
            row = {k: summary["all"][k] for k in ("tgc", "sgc", "mean_reward", "mean_turns")}
            print(json.dumps({"split": split, **row, "wall_s": summary["wall_s"]}), flush=True)
            for name, s in summary["templates"].items():
                print(f"  {name:10s} n={s['episodes']:3d} tgc={s['tgc']:.3f} "
                      f"reward={s['mean_reward']:.3f} turns={s['mean_turns']:.2f} "
                      f"well-formed={s['well_formed_call_share']:.3f}", flush=True)  # fmt: skip
    finally:
        engine.close()
    return results


if __name__ == "__main__":
    main()
