"""entrogym.onednn: oneDNN's linear kernel, dense and packed, computes x @ W.T (checked against
a float64 product), and says where it runs."""

from __future__ import annotations

import pytest
import torch

from entrogym import onednn

CPU = torch.device("cpu")
DTYPES = {"fp32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 2e-2)}


def test_supported_where_onednn_runs(monkeypatch):
    assert not onednn.supported(CPU, torch.float16)
    assert not onednn.supported(torch.device("cuda"), torch.float32)
    assert onednn.supported(CPU, torch.float32) == torch.backends.mkldnn.is_available()
    # bf16 only where the CPU computes it natively, whatever this machine's CPU is
    monkeypatch.setattr(onednn, "cpu_has_native", lambda dtype: False)
    assert not onednn.supported(CPU, torch.bfloat16)
    monkeypatch.setattr(onednn, "cpu_has_native", lambda dtype: dtype == "bf16")
    assert onednn.supported(CPU, torch.bfloat16) == torch.backends.mkldnn.is_available()


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("rows", [(3,), (4, 1), (2, 5)], ids=["2d", "one-token", "prefill"])
def test_linear_is_x_times_w_transposed(name, packed, rows):
    dtype, tolerance = DTYPES[name]
    if not onednn.supported(CPU, dtype):
        pytest.skip(f"this torch build cannot run oneDNN's linear in {name}")
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 24, generator=gen).to(dtype)  # [out, in]
    x = torch.randn(*rows, 24, generator=gen).to(dtype)
    expected = x.double() @ weight.double().T  # independent: a float64 product
    got = onednn.linear(x, onednn.pack(weight) if packed else weight)
    assert got.shape == (*rows, 40) and got.dtype == dtype
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance)


def test_pack_leaves_the_weight_as_it_was():
    if not onednn.supported(CPU, torch.float32):
        pytest.skip("this torch build has no oneDNN")
    weight = torch.randn(8, 6)
    before = weight.clone()
    onednn.pack(weight)
    assert torch.equal(weight, before)


def _lora_like() -> torch.nn.Sequential:
    """Two frozen linears (the base layers) around a trainable one (an adapter's)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(12, 20, bias=False), torch.nn.Linear(20, 20), torch.nn.Linear(20, 7)
    )
    for i in (0, 2):
        net[i].weight.requires_grad_(False)
    net[2].bias.requires_grad_(False)
    return net


def test_frozen_linears_compute_what_nn_linear_computes_with_the_gradient():
    if not onednn.supported(CPU, torch.float32):
        pytest.skip("this torch build has no oneDNN")
    plain, fast = _lora_like(), _lora_like()
    assert onednn.use_for_frozen_linears(fast) == 2
    assert [type(m).__name__ for m in fast] == ["FrozenLinear", "Linear", "FrozenLinear"]
    assert all(isinstance(m, torch.nn.Linear) for m in fast)
    assert fast.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(3, 5, 12, dtype=torch.float64).float().requires_grad_()
    out = {}
    for name, net in (("plain", plain), ("fast", fast)):
        xi = x.detach().clone().requires_grad_()
        y = net(xi)
        (y * torch.linspace(-1, 1, 7)).sum().backward()
        out[name] = (y.detach(), xi.grad, net[1].weight.grad)
    for got, expected in zip(out["fast"], out["plain"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # independent of both: the input's gradient through three linears, in float64
    w = [m.weight.double() for m in plain]
    upstream = torch.linspace(-1, 1, 7, dtype=torch.float64).expand(3, 5, 7)
    expected_grad = upstream @ w[2] @ w[1] @ w[0]
    torch.testing.assert_close(out["fast"][1].double(), expected_grad, rtol=1e-4, atol=1e-5)


def test_a_trainable_or_foreign_input_falls_back_to_nn_linear():
    layer = torch.nn.Linear(4, 3).double()  # a dtype oneDNN's path does not take
    layer.weight.requires_grad_(False)
    onednn.use_for_frozen_linears(layer)
    assert type(layer).__name__ == "FrozenLinear"
    x = torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    layer.float().weight.requires_grad_(True)  # trained again: its gradient needs nn.Linear's
    layer(torch.randn(2, 4)).sum().backward()
    assert layer.weight.grad is not None
