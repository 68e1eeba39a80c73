"""``algo.is_correction``: the sampler-mismatch weights in the policy update (micro_batch_loss),
the settings' parsing, and off by default."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import EntropyControl, build_algorithm
from entrogym.algos.losses import LOSSES, aggregate
from entrogym.algos.micro_loss import micro_batch_loss
from entrogym.algos.update_batch import Rows
from entrogym.commands.algo_text import algo_args_mapping, label, parse_label, resolve_algorithm


def _rows(sampler: bool = True) -> tuple[Rows, torch.Tensor]:
    """Three rows of up to four tokens (the last row shorter), with learner, old and sampler
    log-probs far enough apart that some weights pass the bounds."""
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64) * 2
    shift = torch.tensor([[0.0, 1.5, -0.3, 0.2], [0.05, -2.0, 0.4, 0.0], [0.9, -0.1, 0.0, 0.0]])
    logprobs = (old + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    rows = Rows(
        torch.tensor([1.0, -0.5, 0.7], dtype=torch.float64),
        old * mask,
        mask.double(),
        ((old - shift) * mask).float() if sampler else None,
    )
    return rows, logprobs


def _by_hand(rows: Rows, logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """GRPO's clipped loss (eps 0.2, sequence-mean) with ``weights`` on each token's term."""
    ratio = torch.exp(logprobs - rows.old_logprobs)
    adv = rows.advantages[:, None]
    objective = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * weights
    per_row = (objective * rows.mask).sum(1) / rows.mask.sum(1)
    return -per_row.mean()


def _config(mode: str | None, **bounds: float | None):
    return build_algorithm({"name": "grpo", "is_correction": mode, **bounds})


@pytest.mark.parametrize(
    ("mode", "bounds", "weights"),
    [
        # exp(old - sampler) = exp(shift), capped at 2: token 1 of row 0 (e^1.5) is truncated
        ("token_truncate", {"is_clip_max": 2.0}, lambda s: s.exp().clamp(max=2.0)),
        # a token outside [0.5, 2] is dropped (e^-2 and e^1.5)
        ("token_mask", {"is_clip_min": 0.5, "is_clip_max": 2.0},
         lambda s: torch.where((s.exp() >= 0.5) & (s.exp() <= 2.0), s.exp(), 0.0)),
        # one ratio per row, the product of its tokens' ratios, clipped to [0.5, 2]
        ("sequence_truncate", {"is_clip_min": 0.5, "is_clip_max": 2.0},
         lambda s: s.sum(1, keepdim=True).exp().clamp(0.5, 2.0).expand_as(s)),
        # rows whose product leaves [0.5, 3] are dropped whole (e^1.4 and e^-1.55: rows 0, 1)
        ("sequence_mask", {"is_clip_min": 0.5},
         lambda s: torch.where(
             (s.sum(1, keepdim=True).exp() >= 0.5) & (s.sum(1, keepdim=True).exp() <= 3.0),
             s.sum(1, keepdim=True).exp(), 0.0).expand_as(s)),
    ],
)  # fmt: skip
def test_the_weights_multiply_each_tokens_policy_gradient_term(mode, bounds, weights) -> None:
    rows, logprobs = _rows()
    shift = (rows.old_logprobs - rows.sampler_logprobs.double()) * rows.mask
    expected_w = weights(shift) * rows.mask
    loss, metrics, _ = micro_batch_loss(
        EntropyControl(_config(mode, **bounds)), rows, logprobs, None
    )
    (grad,) = torch.autograd.grad(loss, logprobs)
    want = _by_hand(rows, logprobs, expected_w.to(torch.float64))
    (want_grad,) = torch.autograd.grad(want, logprobs)
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)
    plain = micro_batch_loss(EntropyControl(_config(None)), rows, logprobs, None)[0]
    assert loss.item() != pytest.approx(plain.item())  # the weights changed something
    action = rows.mask > 0
    assert metrics["is_weight_mean"] == pytest.approx(float(expected_w[action].mean()), rel=1e-5)
    zero = float((expected_w[action] == 0).double().mean())
    assert metrics["is_weight_zero_share"] == pytest.approx(zero)
    if mode.endswith("_mask"):
        assert 0 < zero < 1  # some tokens were dropped, not all


def test_off_by_default_the_loss_is_bit_identical_and_ignores_the_sampler() -> None:
    config = build_algorithm("grpo")
    assert config.is_correction is None and config.is_clip_max == 3.0
    rows, logprobs = _rows()
    loss, metrics, _ = micro_batch_loss(EntropyControl(config), rows, logprobs, None)
    terms = LOSSES.get("clipped")(
        logprobs, rows.old_logprobs, rows.advantages, rows.mask, config.loss.params, 0.2, 0.2
    )
    assert torch.equal(loss, -aggregate(terms.objective, terms.mask, "sequence-mean"))
    without, _ = _rows(sampler=False)
    assert torch.equal(loss, micro_batch_loss(EntropyControl(config), without, logprobs, None)[0])
    assert not any(key.startswith("is_weight") for key in metrics)


def test_a_mode_on_a_batch_without_engine_logprobs_says_what_it_needs() -> None:
    rows, logprobs = _rows(sampler=False)
    control = EntropyControl(_config("token_truncate"))
    with pytest.raises(ValueError, match="needs the engine's log-probs"):
        micro_batch_loss(control, rows, logprobs, None)


def test_the_settings_parse_from_the_command_line_yaml_and_labels() -> None:
    tokens = ["--algo", "grpo", "--algo.is-correction", "sequence_mask"]
    tokens += ["--algo.is-clip-min", "0.5", "--algo.is-clip-max", "none"]
    spec = algo_args_mapping(tokens)
    config = resolve_algorithm(spec)
    assert (config.is_correction, config.is_clip_min, config.is_clip_max) == (
        "sequence_mask", 0.5, None,
    )  # fmt: skip
    assert resolve_algorithm(parse_label(label(spec))) == config
    yaml_form = {"name": "grpo", "is_correction": "token_truncate", "is_clip_max": 2}
    assert resolve_algorithm(yaml_form).is_clip_max == 2
    assert resolve_algorithm({"name": "grpo", "is_correction": "none"}).is_correction is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"is_correction": "nope"}, "unknown sampler correction mode 'nope'; use one of"),
        ({"is_correction": "token_mask", "is_clip_min": "4"}, "clip_min (4.0) must be less"),
        ({"is_correction": "token_mask", "is_clip_max": "-1"}, "clip_max must be > 0"),
        ({"is_clip_max": "x"}, "is_clip_max: cannot read 'x' as float or None"),
    ],
)
def test_bad_settings_are_one_line(spec: dict, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        resolve_algorithm({"name": "grpo", **spec})
    assert message in str(caught.value) and "\n" not in str(caught.value)
