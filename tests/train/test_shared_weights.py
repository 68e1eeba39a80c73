"""The in-process ``hf`` engine samples with the learner's frozen base weights (one copy in
memory, not two), and samples exactly what an engine with its own copy samples."""

from __future__ import annotations

import pytest
import torch
from vowel_env import TINY_RUN

from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.shared_weights import frozen_base_tensors, model_on_tensors
from entrogym.models import resolve_model
from entrogym.train.config import TrainConfig
from entrogym.train.folder.safety import adapter_folder
from entrogym.train.learner.policy import LoraSettings, load_policy
from entrogym.train.trainer import Trainer

RUN = TINY_RUN | dict(iterations=2, lr=1e-2, max_grad_norm=1.0)


def _storages(module: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in module.parameters()}


def test_the_engine_shares_the_learners_base_weights_and_samples_the_same(tmp_path):
    trainer = Trainer(TrainConfig(out=str(tmp_path / "run"), **RUN))
    try:
        engine = trainer.sampler.engine
        assert engine.shares_weights
        base = trainer.learner.policy.get_base_model()
        frozen = {p.untyped_storage().data_ptr() for n, p in base.named_parameters()
                  if "lora_" not in n}  # fmt: skip
        assert _storages(engine._model) == frozen  # not one tensor of its own
        trainer.fit()  # the learner trains beside it: its LoRA weights only
        adapter = str(adapter_folder(trainer.run.dir, 2))
        prompts = [[1, 5, 9, 13], [1, 7, 2]]
        params = [SamplingParams(max_tokens=6, seed=3)] * 2
        shared = engine.generate(prompts, params, adapter=adapter)
    finally:
        trainer.close()
    own = make_engine("hf", RUN["model"], dtype="fp32")
    try:
        assert not own.shares_weights
        alone = own.generate(prompts, params, adapter=adapter)
    finally:
        own.close()
    assert [c.token_ids for c in shared] == [c.token_ids for c in alone]
    assert [c.logprobs for c in shared] == [c.logprobs for c in alone]


def test_an_engine_in_another_dtype_loads_its_own_copy(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "run"), **(RUN | dict(engine_dtype="fp16")))
    trainer = Trainer(cfg)
    try:
        assert not trainer.sampler.engine.shares_weights
        assert next(trainer.sampler.engine._model.parameters()).dtype == torch.float16
        trainer.fit()
    finally:
        trainer.close()


def test_weights_that_do_not_fit_the_model_are_named():
    policy = load_policy("tiny-random-llama", lora=LoraSettings(4, 8), seed=0)
    tensors = frozen_base_tensors(policy)
    model = str(resolve_model("tiny-random-llama"))
    assert model_on_tensors(model, torch.float32, tensors) is not None
    with pytest.raises(ValueError, match="lm_head.weight is missing"):
        model_on_tensors(model, torch.float32, {k: v for k, v in tensors.items()
                                                if k != "lm_head.weight"})  # fmt: skip
    with pytest.raises(ValueError, match=r"the engine needs .* torch.bfloat16"):
        model_on_tensors(model, torch.bfloat16, tensors)
    for p in policy.parameters():
        p.requires_grad_(True)  # the base is trained too: nothing is frozen to share
    assert frozen_base_tensors(policy) is None
