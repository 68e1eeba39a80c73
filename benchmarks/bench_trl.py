"""TRL side of ``benchmarks/iteration.py``: TRL's ``GRPOTrainer`` on the same model folder,
prompts, K, token budget, LoRA, lr, clip and batching as the demo's GRPO iteration.

Runs in ``.venv-bench`` (``make bench``), one fresh process per repetition; writes one JSON
result file. docs/performance.md lists what cannot be made identical.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from bench_common import Workload, matmul_ceiling


def _reward_fn(answers: dict[str, str], generated: list[int]):
    """The arithmetic env's grading; appends each generation's completion tokens to
    ``generated`` (TRL hands reward functions the completion ids)."""
    from entrogym.envs.grading import grade

    def correct(prompts, completions, completion_ids=(), **kwargs) -> list[float]:
        generated.append(sum(len(ids) for ids in completion_ids))
        # the arithmetic env's grading: last number counts when nothing is boxed
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            reference = answers[prompt[-1]["content"] if isinstance(prompt, list) else prompt]
            out.append(1.0 if grade(text, reference, 5.0, allow_bare_number=True).correct else 0.0)
        return out

    return correct


def force_say(parse):
    """TRL's ``parse_response`` with every turn read as one call to TalkTools' ``say`` with the
    turn's text (multiturn_env.py: entrogym's side reads its turns the same way), so that every
    episode runs ``max_tool_calling_iterations`` + 1 turns whatever the model writes; TRL's own
    parse still runs on every turn."""

    def parse_response(tokenizer, ids, prefix=None, tools=None):
        text = parse(tokenizer, ids, prefix=prefix, tools=tools).get("content") or ""
        call = {"type": "function", "function": {"name": "say", "arguments": {"text": text}}}
        return {"role": "assistant", "content": text, "tool_calls": [call]}

    return parse_response


def multiturn_setup(work: Workload) -> dict:
    """GRPOConfig fields and GRPOTrainer arguments of the multi-turn workload (TalkTools through
    ``environment_factory``, each turn exactly ``max_response_tokens`` tokens); patches TRL's
    turn parsing (:func:`force_say`)."""
    import trl.trainer.grpo_trainer as grpo_trainer
    from multiturn_env import TalkTools, set_tool_latency

    s, turns = work.settings, work.multiturn["turns"]
    set_tool_latency(work.multiturn["latency_ms"])
    grpo_trainer.parse_response = force_say(grpo_trainer.parse_response)
    budget = s["max_response_tokens"]
    config = {
        "max_tool_calling_iterations": turns - 1,
        # TRL's budget covers every turn and the tool replies between them; each turn's own
        # is max_new_tokens (all of it: EOS held back, as entrogym's ignore_eos)
        "max_completion_length": s["max_context_tokens"],
        "generation_kwargs": {"max_new_tokens": budget, "min_new_tokens": budget},
    }
    return {"config": config, "trainer": {"environment_factory": TalkTools, "reward_funcs": None}}


def count_tokens(trainer, generated: list[int], learner: list[int]) -> None:
    """Appends to ``generated`` the tokens of each of the trainer's generation passes (one per
    turn), and to ``learner`` each batch's prompt and completion tokens, the tool replies among
    them (TRL's ``num_input_tokens_seen`` leaves those out, though its learner runs on them)."""
    single_turn, batch = trainer._generate_single_turn, trainer._generate_and_score_completions

    def counted_turn(*args, **kwargs):
        ids, logprobs = single_turn(*args, **kwargs)
        generated.append(sum(len(x) for x in ids))
        return ids, logprobs

    def counted_batch(*args, **kwargs):
        out = batch(*args, **kwargs)
        learner.append(int(out["prompt_mask"].sum() + out["completion_mask"].sum()))
        return out

    trainer._generate_single_turn = counted_turn
    trainer._generate_and_score_completions = counted_batch


def run(work: Workload, overrides: dict | None = None, callbacks: list | None = None) -> dict:
    """Train ``work`` with GRPOTrainer; ``overrides`` replace GRPOConfig fields (adaptive
    entropy, logging), ``callbacks`` join the timing one."""
    t_spawn = float(os.environ.get("BENCH_SPAWN_TIME", time.time()))
    if work.threads:
        torch.set_num_threads(work.threads)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    s = work.settings
    micro, minibatch = s["micro_batch_size"], s["minibatch_size"]
    per_iteration = s["tasks"] * s["samples"]
    stamps: list[float] = []
    seen: list[int] = []  # TRL's prompt + completion tokens so far, after each step
    generated: list[int] = []  # completion tokens of each generation pass
    generated_seen: list[int] = []  # their sum so far, after each step
    learner_counts: list[int] = []  # multi-turn: learner tokens of each batch (count_tokens)

    class Stamps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())
            stamps.append(time.time() - t_spawn)

        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())
            seen.append(sum(learner_counts) if multiturn else state.num_input_tokens_seen)
            generated_seen.append(sum(generated))

    answers = {p[-1]["content"]: a for p, a in zip(work.prompts, work.answers, strict=True)}
    multiturn = multiturn_setup(work) if work.multiturn is not None else None
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        settings = {
            "output_dir": tmp,
            "learning_rate": s["lr"],
            "lr_scheduler_type": "constant",
            "weight_decay": s["weight_decay"],
            "max_grad_norm": s["max_grad_norm"],
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": minibatch // micro,
            "steps_per_generation": per_iteration // micro,
            "num_generations": s["samples"],
            "max_completion_length": s["max_response_tokens"],
            "temperature": s["temperature"],
            "top_p": 1.0,
            "top_k": 0,
            "beta": 0.0,
            "num_iterations": 1,
            "epsilon": s["eps_low"],
            "epsilon_high": s["eps_high"],
            "loss_type": "grpo",
            "scale_rewards": "group",
            "shuffle_dataset": False,
            "max_steps": work.iterations * (per_iteration // minibatch),
            "use_cpu": work.device == "cpu",
            "bf16": work.dtype == "bf16",
            "fp16": work.dtype == "fp16",
            "logging_steps": 10**6,
            "save_strategy": "no",
            "report_to": "none",
            "disable_tqdm": True,
            "seed": work.seed,
            # Equal work: every completion runs to the token budget. HF generate cannot sample
            # past EOS (vLLM's ignore_eos), so EOS is held back until the budget is reached.
            "generation_kwargs": (
                {"min_new_tokens": s["max_response_tokens"]} if s.get("ignore_eos") else None
            ),
        }
        trainer_args = {"reward_funcs": _reward_fn(answers, generated)}
        if multiturn is not None:
            settings |= multiturn["config"]
            trainer_args = multiturn["trainer"]
        config = GRPOConfig(**(settings | (overrides or {})))
        trainer = GRPOTrainer(
            model=work.model_dir,
            **trainer_args,
            args=config,
            train_dataset=Dataset.from_list([{"prompt": p} for p in work.prompts]),
            peft_config=LoraConfig(
                r=s["lora_rank"],
                lora_alpha=s["lora_alpha"],
                lora_dropout=0.0,
                target_modules=list(s["target_modules"]),
                task_type="CAUSAL_LM",
            ),
            callbacks=[Stamps(), *(callbacks or [])],
        )
        if multiturn is not None:  # every turn's tokens (no reward function sees them)
            count_tokens(trainer, generated, learner_counts)
        trainer.train()
    steps = per_iteration // minibatch
    t_begin, startup_s, ends = stamps[0], stamps[1], stamps[2:]
    marks = [t_begin] + ends[steps - 1 :: steps]
    seconds = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    ends_seen = seen[steps - 1 :: steps]
    learner = [b - a for a, b in zip([0, *ends_seen], ends_seen, strict=False)]
    ends_generated = generated_seen[steps - 1 :: steps]
    generated = [b - a for a, b in zip([0, *ends_generated], ends_generated, strict=False)]
    iterations = [
        {"seconds": x, "generated_tokens": g, "learner_tokens": n}
        for x, g, n in zip(seconds, generated, learner, strict=True)
    ]
    return {
        "startup_s": startup_s,
        "iterations": iterations,
        "threads": torch.get_num_threads(),
        "ceiling_gflops": {"fp32": matmul_ceiling(torch.float32, work.device)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("workload", type=Path)
    p.add_argument("result", type=Path)
    args = p.parse_args()
    args.result.write_text(json.dumps(run(Workload.load(args.workload))))


if __name__ == "__main__":
    main()
