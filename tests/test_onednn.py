"""entrogym.onednn: oneDNN's linear kernel, dense and packed, computes x @ W.T (checked against
a float64 product), and says where it runs."""

from __future__ import annotations

import pytest
import torch

from entrogym import onednn

CPU = torch.device("cpu")
DTYPES = {"fp32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 2e-2)}


def test_supported_where_onednn_runs():
    assert not onednn.supported(CPU, torch.float16)
    assert not onednn.supported(torch.device("cuda"), torch.float32)
    assert onednn.supported(CPU, torch.float32) == torch.backends.mkldnn.is_available()


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
