"""``--max-staleness``: K = 0 is the synchronous loop bit for bit; with K >= 1 a stale batch is
trained with the sampling policy as the ratio's denominator, no batch is more than K versions
old, and an async run killed mid-pipeline resumes exactly (tiny random Llama, hf engine)."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch
from safetensors.torch import load_file
from vowel_env import TINY_RUN

from entrogym.agents.engines import SamplingParams
from entrogym.agents.rollout import collect_rollouts
from entrogym.algos import get_algorithm, policy_update
from entrogym.models import resolve_model
from entrogym.train.batch import collate_episodes, usable_episodes
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.folder.rng import iteration_seed
from entrogym.train.folder.safety import adapter_folder
from entrogym.train.learner.policy import load_base_model, save_adapter
from entrogym.train.learner.update import Learner
from entrogym.train.trainer import Trainer, train

RUN = TINY_RUN | dict(
    samples=3,
    early_stop_min_per_task=3,
    micro_batch_size=2,
    lr=1e-2,
    max_grad_norm=1.0,
    algo=dataclasses.replace(
        get_algorithm("repo-r"), minibatch_size=3
    ),  # two minibatches of 3: a second, off-policy one
)
COMPARED = ("entropy", "loss", "reward_mean", "approx_kl", "ratio_max", "zeta", "grad_norm")


def _adapter(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "adapter_model.safetensors"))


def _sequential_reference(cfg: TrainConfig) -> list[dict]:
    """The synchronous loop written out from its parts: draw tasks, roll out with the current
    adapter, collate, update, write the adapter; nothing runs beside anything else."""
    trainer = Trainer(cfg)
    rows = []
    try:
        sampler, learner = trainer.sampler, trainer.learner
        sampler.publish_adapter(0)
        for it in range(cfg.iterations):
            tasks = random.Random(iteration_seed(cfg.seed, it)).sample(
                sampler.tasks, cfg.tasks_per_iter
            )
            rollouts = collect_rollouts(
                cfg.env,
                tasks,
                sampler.engine,
                sampler.agent,
                k=cfg.samples,
                sampling=SamplingParams(temperature=cfg.temperature),
                adapter=str(adapter_folder(trainer.run.dir, it)),
                min_done_per_task=cfg.early_stop_min_per_task,
                min_done_fraction=cfg.early_stop_fraction,
                seed=iteration_seed(cfg.seed, it * len(tasks) * cfg.samples),
            )
            batch = collate_episodes(usable_episodes(list(rollouts)), sampler.pad_id)
            batch.compute_advantages(trainer.algo.advantage)
            learner.grad_norms = []
            row = policy_update(
                trainer.control,
                batch,
                score=lambda index, need, batch=batch: learner.score(batch, index, need),
                backward=learner.backward,
                step=learner.step,
                zero_grad=lambda: learner.optimizer.zero_grad(set_to_none=True),
                micro_batch_size=cfg.micro_batch_size,
                generator=torch.Generator().manual_seed(iteration_seed(cfg.seed, it)),
            )
            row["grad_norm"] = sum(learner.grad_norms) / max(len(learner.grad_norms), 1)
            rows.append(row)
            sampler.publish_adapter(it + 1)
    finally:
        trainer.close()
    return rows


def test_max_staleness_0_is_the_synchronous_loop_bit_for_bit(tmp_path):
    cfg = TrainConfig(**RUN, iterations=3, out=str(tmp_path / "fit"))
    rows = [r for r in read_metrics(train(cfg)) if r["kind"] == "train"]
    reference = _sequential_reference(TrainConfig(**RUN, iterations=3, out=str(tmp_path / "ref")))
    for got, want in zip(rows, reference, strict=True):
        for key in COMPARED:
            assert got[key] == want[key], (got["iteration"], key, got[key], want[key])
        assert got["staleness_max"] == 0 and got["policy_version"] == got["iteration"]
        assert "threads_rollout" not in got  # nothing runs beside the update: no split
    fit, ref = (
        _adapter(tmp_path / "fit/adapters/v000003"),
        _adapter(tmp_path / "ref/adapters/v000003"),
    )
    assert fit.keys() == ref.keys() and all(torch.equal(fit[k], ref[k]) for k in fit)


def test_no_batch_is_more_than_k_versions_old(tmp_path):
    # --thread-split cost: on 2 cores one thread each, as with even, so the numbers are even's
    cfg = TrainConfig(**RUN, iterations=4, max_staleness=2, thread_split="cost", out=str(tmp_path))
    rows = [r for r in read_metrics(train(cfg)) if r["kind"] == "train"]
    assert [r["policy_version"] for r in rows] == [0, 0, 0, 1]
    assert [r["staleness_max"] for r in rows] == [0, 1, 2, 2]
    assert all(r["staleness_mean"] == r["iteration"] - r["policy_version"] for r in rows)
    # the hf engine and the learner split the cores between them, re-chosen every iteration
    cores = max(os.cpu_count() or 1, 2)
    assert all(r["threads_rollout"] + r["threads_learner"] == cores for r in rows)
    # the versions still sampled from stay on disk: 2..4, not the last two alone
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == [
        "v000001", "v000002", "v000003", "v000004"]  # fmt: skip


def test_an_elastic_split_reports_the_updates_seconds_on_every_core(tmp_path):
    # 3 iterations at staleness 1: the rollout thread, done with the last batch, idles while
    # the last update runs, so some learner phase must start with every core
    cfg = TrainConfig(**RUN, iterations=3, max_staleness=1, thread_split="elastic",
                      out=str(tmp_path))  # fmt: skip
    rows = [r for r in read_metrics(train(cfg)) if r["kind"] == "train"]
    cores = max(os.cpu_count() or 1, 2)
    assert all(r["threads_rollout"] + r["threads_learner"] == cores for r in rows)
    learner_s = [sum(r["phases_s"][p] for p in ("scoring", "forward", "backward", "optimizer"))
                 for r in rows]  # fmt: skip
    # the learner's seconds on every core are some of its seconds (both rounded in the row)
    assert all(
        0 <= r["learner_all_cores_s"] <= s + 1e-3 for r, s in zip(rows, learner_s, strict=True)
    )
    assert rows[-1]["learner_all_cores_s"] > 0


def _logprobs(model, adapter, ids, attention):
    from peft import PeftModel

    peft = PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        logits = peft(input_ids=ids, attention_mask=attention).logits.float()
    model = peft.unload()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


def test_stale_ratios_are_pi_new_over_the_sampling_policy(tmp_path, monkeypatch):
    """Iteration 1 of a K = 1 run trains on the batch version 0 sampled, with version 1's
    weights. The ratios of its first micro-batch must equal pi_v1 / pi_v0, both scored here
    independently (plain transformers forward, peft adapters from the run folder)."""
    import entrogym.algos.update as update

    losses, scored = [], []
    real_loss, real_score = update.micro_batch_loss, Learner.score

    def loss_spy(control, rows, logprobs, *args, **kwargs):
        losses.append((logprobs.detach().clone(), rows.old_logprobs.clone(), rows.mask.clone()))
        return real_loss(control, rows, logprobs, *args, **kwargs)

    def score_spy(self, batch, index, need_entropy):
        if torch.is_grad_enabled():
            scored.append((batch, index.clone()))
        return real_score(self, batch, index, need_entropy)

    monkeypatch.setattr(update, "micro_batch_loss", loss_spy)
    monkeypatch.setattr(Learner, "score", score_spy)
    cfg = TrainConfig(**RUN, iterations=2, max_staleness=1, out=str(tmp_path))
    rows = read_metrics(train(cfg))
    assert [r["staleness_max"] for r in rows] == [0, 1]
    per_iteration = len(losses) // 2  # the same number of micro-batches in both iterations
    logprobs, old, mask = losses[per_iteration]
    batch, index = scored[per_iteration]
    assert batch.versions.tolist() == [0] * len(batch)  # iteration 1's batch: version 0's
    ids, attention = batch.tokens(index)
    base = load_base_model(resolve_model("tiny-random-llama"))
    new = _logprobs(base, tmp_path / "adapters/v000001", ids, attention)
    sampler = _logprobs(base, tmp_path / "adapters/v000000", ids, attention)
    width = logprobs.shape[1]
    on = mask[:, 1:width].bool()
    got = (logprobs - old)[:, 1:width][on]
    want = (new - sampler)[:, : width - 1][on]
    assert want.abs().max() > 1e-4, "the update did not move the policy: the test would be vacuous"
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_old_logprobs_sampler_takes_the_engines_scores_without_a_scoring_pass(
    tmp_path, monkeypatch
):
    """``--old-logprobs sampler``: iteration 1 of a K = 1 run trains on version 0's batch with
    the engine's log-probs as the ratio's denominator, and the learner never rescores it. Those
    log-probs are version 0's, scored here independently (plain transformers forward, peft
    adapter from the run folder), within fp32 tolerance: the premise of the option."""
    import entrogym.algos.update as update

    losses, scored = [], []
    real_loss, real_score = update.micro_batch_loss, Learner.score

    def loss_spy(control, rows, logprobs, *args, **kwargs):
        losses.append((rows.old_logprobs.clone(), rows.sampler_logprobs.clone(), rows.mask))
        return real_loss(control, rows, logprobs, *args, **kwargs)

    def score_spy(self, batch, index, need_entropy):
        scored.append((batch, index.clone(), torch.is_grad_enabled()))
        return real_score(self, batch, index, need_entropy)

    def no_rescoring(*args, **kwargs):
        raise AssertionError("old_logprobs sampler rescored a stale batch")

    monkeypatch.setattr(update, "micro_batch_loss", loss_spy)
    monkeypatch.setattr(Learner, "score", score_spy)
    monkeypatch.setattr(Learner, "sampling_version_logprobs", no_rescoring)
    algo = dataclasses.replace(get_algorithm("grpo"), minibatch_size=3)  # tracks no entropy
    cfg = TrainConfig(**{**RUN, "algo": algo}, iterations=2, max_staleness=1,
                      old_logprobs="sampler", out=str(tmp_path))  # fmt: skip
    rows = read_metrics(train(cfg))
    assert [r["staleness_max"] for r in rows] == [0, 1]
    assert all(r["sampler_mismatch"] is None for r in rows)  # nothing compared: none reported
    assert all(torch.equal(old, sampler) for old, sampler, _ in losses)
    assert all(grad for *_, grad in scored)  # no scoring pass without gradients, either batch
    # iteration 1's first micro-batch: version 0's samples, trained with version 1's weights
    old, _, mask = losses[len(losses) // 2]
    batch, index, _ = scored[len(scored) // 2]
    assert batch.versions.tolist() == [0] * len(batch)
    ids, attention = batch.tokens(index)
    base = load_base_model(resolve_model("tiny-random-llama"))
    want = _logprobs(base, tmp_path / "adapters/v000000", ids, attention)
    width = old.shape[1]
    on = mask[:, 1:width].bool()
    assert bool(on.any())
    got, want = old[:, 1:width][on], want[:, : width - 1][on]
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_async_run_killed_mid_pipeline_resumes_exactly(tmp_path, monkeypatch):
    """Killed while the rollout thread is ahead of the update: the batches it had collected
    are collected again on resume, by the same versions (kept in the checkpoint), so the
    resumed run equals an uninterrupted one: no batch lost, none trained twice."""
    from test_trainer import _cli_args, _kill_at_checkpoint, _run_cli

    def args(out):
        # even: a split that follows timings (the default, elastic) is not bit for bit
        a = _cli_args(out, 4) + ["--max-staleness", "1", "--thread-split", "even"]
        return a + ["--micro-batch-size", "2", "--algo.minibatch-size", "3"]

    full, killed = tmp_path / "full", tmp_path / "killed"
    p = _run_cli(args(full))
    assert p.wait(timeout=600) == 0, p.stdout.read()
    # Checkpoint 1 is written after update 1, while the rollout thread holds batch 2 (sampled
    # by version 1 during update 1) and starts batch 3: a kill then is always mid-pipeline.
    _kill_at_checkpoint(_run_cli(args(killed)), killed)
    p = _run_cli([*args(killed), "--resume", "true"])
    output = p.communicate(timeout=600)[0]
    assert p.returncode == 0, output
    a, b = read_metrics(full), read_metrics(killed)
    assert [r["iteration"] for r in b] == [0, 1, 2, 3]
    assert [r["policy_version"] for r in b] == [0, 0, 1, 2]
    for ra, rb in zip(a, b, strict=True):
        for key in COMPARED:
            assert ra[key] == pytest.approx(rb[key], rel=1e-6, abs=1e-9), (key, ra, rb)
    fa, fb = _adapter(full / "adapters/v000004"), _adapter(killed / "adapters/v000004")
    assert all(torch.allclose(fa[k], fb[k], atol=1e-7) for k in fa)


def test_weight_versions_swap_in_and_back(tmp_path):
    from entrogym.train.learner.policy import LoraSettings, load_policy
    from entrogym.train.learner.versions import WeightVersions

    model = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings(r=4, alpha=8))
    versions = WeightVersions(model, keep=2)
    params = [p for p in model.parameters() if p.requires_grad]
    for v in range(3):
        with torch.no_grad():
            params[0].fill_(float(v))
        versions.record(v)
    assert versions.versions() == [1, 2]
    with versions.weights_of(1):
        assert float(params[0].flatten()[0]) == 1.0
    assert float(params[0].flatten()[0]) == 2.0
    with pytest.raises(KeyError, match="weight version 0 is not kept"):
        versions.weights_of(0).__enter__()
    saved = versions.full([1])
    other = WeightVersions(model, keep=2)
    other.load(saved)
    with other.weights_of(1):
        assert float(params[0].flatten()[0]) == 1.0
    save_adapter(model, tmp_path / "a", saved[1])  # a checkpoint's copy writes an adapter folder
    assert _adapter(tmp_path / "a")
