"""Bounded rollout memory: the ``hf`` engine generates in batches of at most ``max_num_seqs``
sequences, whatever the iteration asks for, and ``tasks_per_iter`` above the split's size is
refused instead of silently clamped.

Before these guarantees ``--tasks-per-iter 5000 --samples 2`` on Arithmetic handed all 10,000
prompts to one ``generate`` call (OOM-killed at 18.8 GB). The tests check the batch sizes the
engine receives rather than allocate that memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from vowel_env import TINY_RUN

from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.hf import HFEngine
from entrogym.commands.train import cli, parse_config
from entrogym.models import resolve_model
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import Trainer, train


@pytest.fixture
def batch_sizes(monkeypatch) -> list[int]:
    """The sizes of the batches the hf engine's ``generate`` runs (a spy: the real method runs)."""
    sizes: list[int] = []
    real = HFEngine._generate_batch

    def spy(self, model, prompts, params):
        sizes.append(len(prompts))
        return real(self, model, prompts, params)

    monkeypatch.setattr(HFEngine, "_generate_batch", spy)
    return sizes


def test_hf_engine_generates_in_batches_of_at_most_max_num_seqs(batch_sizes):
    engine = make_engine(
        "hf", resolve_model("tiny-random-llama"), dtype="fp32", max_model_len=64, max_num_seqs=3
    )
    prompts = [[1, 2 + i] for i in range(10)]
    out = engine.generate(prompts, SamplingParams(max_tokens=3, temperature=1.0))
    engine.close()
    assert len(out) == 10 and all(1 <= len(c.token_ids) <= 3 for c in out)
    assert batch_sizes == [3, 3, 3, 1]
    with pytest.raises(ValueError, match="max_num_seqs must be"):
        make_engine("hf", resolve_model("tiny-random-llama"), max_num_seqs=0)


def test_training_hands_the_engine_at_most_max_num_seqs_sequences(batch_sizes, tmp_path):
    run = {**TINY_RUN, "tasks_per_iter": 3, "samples": 3, "early_stop_min_per_task": 3}
    cfg = TrainConfig(**run, iterations=1, max_num_seqs=4, out=str(tmp_path))
    rows = read_metrics(train(cfg))
    assert rows[0]["episodes"] == 9  # all 9 sequences came back, in batches of <= 4
    assert batch_sizes and max(batch_sizes) <= 4 and sum(batch_sizes) >= 9
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        parse_config(["--max-num-seqs", "0"])


def test_default_batch_is_sized_from_the_model_and_the_context():
    """By construction: the default batch's KV cache at full context, plus its logits, fits
    in ``HF_BATCH_BYTES``; the demo's 24 sequences of 256 tokens still go in one batch."""
    from entrogym.agents.engines.hf import HF_BATCH_BYTES, hf_max_num_seqs

    model = resolve_model("smollm2-135m-instruct")
    long = hf_max_num_seqs(model, "fp32", 4096)
    assert 1 <= long < 24  # the Arithmetic run: 10,000 prompts in batches of `long`
    per_seq_kv = 30 * 3 * 64 * 2 * 4 * 4096  # layers x KV heads x head dim x (K, V) x fp32
    assert long * per_seq_kv <= HF_BATCH_BYTES
    assert hf_max_num_seqs(model, "fp32", 256) >= 24
    assert hf_max_num_seqs(model, "bf16", 4096) >= long  # half the bytes per token


def test_tasks_per_iter_above_the_split_is_refused_naming_both_numbers(tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig(**{**TINY_RUN, "tasks_per_iter": 7}, iterations=1, out=str(out))
    with pytest.raises(ValueError, match=r"tasks_per_iter \(7\).*6 tasks"):
        Trainer(cfg)
    assert not out.exists()  # refused before the run folder is made or a model loads


def test_the_command_refuses_it_in_one_line(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    args = ["--env", "vowel_env:test/Vowel-v0", "--model", "tiny-random-llama", "--engine",
            "hf", "--tasks-per-iter", "7", "--out", str(tmp_path / "run")]  # fmt: skip
    assert cli(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tasks_per_iter (7)" in err[0] and "6 tasks" in err[0], err
    assert not (tmp_path / "run").exists()
