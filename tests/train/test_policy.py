"""LoRA policy (paper defaults, peft save/load), dtype policy and fp16 loss scaling."""

from __future__ import annotations

import json

import pytest
import torch

from entrogym.train.devices import precision
from entrogym.train.devices.precision import (
    LossScaler,
    check_device_dtype,
    loss_scaler_for,
    resolve_dtype,
)
from entrogym.train.learner.logprobs import sequence_logprobs
from entrogym.train.learner.policy import (
    LORA_TARGETS,
    LoraSettings,
    load_adapter,
    load_base_model,
    load_policy,
    save_adapter,
    trainable_parameters,
)


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 49152, (2, 10), generator=torch.Generator().manual_seed(seed))


def test_lora_defaults_follow_the_paper():
    model = load_policy("tiny-random-qwen3", seed=0)
    cfg = model.peft_config["default"]
    assert (cfg.r, cfg.lora_alpha) == (16, 32)
    assert set(cfg.target_modules) == set(LORA_TARGETS)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    # 2 layers x 7 adapted linears x (A, B); the LM head stays a plain, frozen Linear
    assert len(names) == 2 * 7 * 2
    assert not hasattr(model.get_output_embeddings(), "lora_A")


def test_adapter_save_load_round_trip(tmp_path):
    model = load_policy("tiny-random-llama", seed=0)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    ids = _ids()
    for _ in range(2):  # train a little so the adapter is not the identity
        loss = -sequence_logprobs(model, ids).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    trained = sequence_logprobs(model, ids).detach()

    out = save_adapter(model, tmp_path / "adapter")
    assert (out / "adapter_config.json").is_file()
    assert (out / "adapter_model.safetensors").is_file()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 16
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers
    save_adapter(model, out)  # overwriting an existing adapter is atomic too
    assert (out / "adapter_model.safetensors").is_file()

    fresh = load_adapter(load_base_model("tiny-random-llama"), out)
    assert torch.allclose(sequence_logprobs(fresh, ids), trained, atol=1e-6)
    base = sequence_logprobs(load_base_model("tiny-random-llama"), ids)
    assert (base - trained).abs().max() > 1e-3
    again = load_policy("tiny-random-llama", adapter=out)
    assert trainable_parameters(again)  # a resumed adapter keeps training


def test_lora_rejects_missing_targets_and_bad_adapter(tmp_path):
    with pytest.raises(ValueError, match="do not exist"):
        load_policy("tiny-random-llama", lora=LoraSettings(target_modules=("c_attn",)))
    with pytest.raises(ValueError, match="not a peft adapter folder"):
        load_adapter(load_base_model("tiny-random-llama"), tmp_path)


def test_dtypes_load_and_logprobs_stay_fp32():
    ids = _ids(1)
    ref = sequence_logprobs(load_base_model("tiny-random-llama", dtype="fp32"), ids)
    # a CPU without native bf16/fp16 refuses them (tests/train/test_precision_threads.py)
    native = [n for n in ("bf16", "fp16") if precision.cpu_has_native(resolve_dtype(n))]
    for name in native:
        model = load_base_model("tiny-random-llama", dtype=name)
        assert next(model.parameters()).dtype == resolve_dtype(name)
        out = sequence_logprobs(model, ids)
        assert out.dtype == torch.float32
        assert (out - ref).abs().max() < 0.05  # same model, lower-precision weights


def test_bad_dtype_and_device_raise(monkeypatch):
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("fp8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            check_device_dtype("cuda", torch.float32)

    # Both CPU cases are set up explicitly, so the test does not depend on this machine's CPU.
    monkeypatch.setattr(precision, "cpu_has_native", lambda dtype, flags=None: False)
    with pytest.raises(
        ValueError, match="this CPU has no native fp16 arithmetic.*use dtype='fp32'"
    ):
        load_policy("tiny-random-llama", dtype="fp16")

    def no_fp16(dtype, device):
        raise RuntimeError(f'"addmm" not implemented for {dtype}')

    # a CPU that claims native fp16 but whose kernels are missing
    monkeypatch.setattr(precision, "cpu_has_native", lambda dtype, flags=None: True)
    monkeypatch.setattr(precision, "_probe", no_fp16)
    with pytest.raises(ValueError, match="dtype='fp16' cannot run on device cpu.*use dtype='fp32'"):
        load_policy("tiny-random-llama", dtype="fp16")


def _grads_after(scaler: LossScaler, value: float) -> tuple[bool, torch.Tensor]:
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=1.0)
    loss = (param * value).sum()
    scaler.scale(loss).backward()
    stepped = scaler.step(opt)
    scaler.update()
    return stepped, param.detach()


def test_loss_scaler_scales_unscales_skips_and_adapts():
    scaler = LossScaler(init_scale=1024.0, growth_interval=2)
    assert scaler.scale(torch.tensor(2.0)).item() == 2048.0
    stepped, param = _grads_after(scaler, 0.5)  # grad 0.5 after unscaling
    assert stepped and torch.allclose(param, torch.full((3,), 0.5))
    stepped, _ = _grads_after(scaler, 0.5)
    assert stepped and scaler.scale_value == 2048.0  # grew after 2 clean steps
    stepped, param = _grads_after(scaler, float("inf"))
    assert not stepped and torch.equal(param, torch.ones(3))  # skipped: params untouched
    assert scaler.scale_value == 1024.0 and scaler.growth_tracker == 0

    state = scaler.state_dict()
    other = LossScaler()
    other.load_state_dict(state)
    assert other.state_dict() == state

    off = loss_scaler_for(torch.bfloat16)
    assert not off.enabled and off.scale(torch.tensor(3.0)).item() == 3.0
    assert loss_scaler_for(torch.float16).enabled


@pytest.mark.skipif(
    not precision.cpu_has_native(torch.float16), reason="this CPU has no native fp16"
)
def test_fp16_training_step_needs_and_gets_scaling():
    """fp16 LoRA step on CPU: tiny gradients underflow unscaled, survive scaled."""
    ids = _ids(2)

    def lora_grads(scale: float) -> torch.Tensor:
        model = load_policy("tiny-random-qwen3", dtype="fp16", seed=0)
        scaler = LossScaler(init_scale=scale)
        # 1e-8 is far below fp16's smallest subnormal (6e-8): activations' grads underflow.
        loss = sequence_logprobs(model, ids).sum() * 1e-8
        scaler.scale(loss).backward()
        opt = torch.optim.SGD(trainable_parameters(model), lr=0.0)
        assert scaler.step(opt)
        return torch.cat([p.grad.flatten() for p in trainable_parameters(model)])

    unscaled, scaled = lora_grads(1.0), lora_grads(2.0**24)
    assert unscaled.abs().max() == 0
    assert scaled.abs().max() > 0 and torch.isfinite(scaled).all()
    # scaled gradients equal the fp32 model's
    model32 = load_policy("tiny-random-qwen3", dtype="fp32", seed=0)
    (sequence_logprobs(model32, ids).sum() * 1e-8).backward()
    ref = torch.cat([p.grad.flatten() for p in trainable_parameters(model32)])
    assert torch.allclose(scaled, ref, rtol=0.05, atol=1e-3 * ref.abs().max().item())
