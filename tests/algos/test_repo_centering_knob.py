"""``repo_centering: raw | exact``: a knob of REPO-R and REPO-D only (Sec. 5, centred log pi)."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import get_algorithm, make_control, policy_update, preset_knobs
from entrogym.algos.entropy import centred_logprobs, repo_d, repo_r, token_entropy_from_logits
from entrogym.algos.presets import AlgorithmConfig, presets_with
from entrogym.algos.update_batch import UpdateBatch


def test_centred_logprob_has_zero_mean_under_the_policy() -> None:
    logits = torch.randn(5, 7, dtype=torch.float64)
    logp = torch.log_softmax(logits, dim=-1)
    entropies = token_entropy_from_logits(logits).double()[:, None].expand(5, 7)
    centred = centred_logprobs(logp, entropies)
    brute = logp - (logp.exp() * logp).sum(-1, keepdim=True)
    torch.testing.assert_close(centred, brute, atol=1e-6, rtol=0)  # H is computed in fp32
    torch.testing.assert_close(
        (logp.exp() * centred).sum(-1), torch.zeros(5, dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert not centred_logprobs(logp.requires_grad_(), entropies).requires_grad
    with pytest.raises(ValueError, match="token_entropies"):
        centred_logprobs(logp, entropies[:, :3])


def test_repo_centering_is_a_knob_of_repo_presets_only() -> None:
    assert presets_with("repo_centering") == ["repo-r", "repo-d"]
    assert "repo_centering" in preset_knobs("repo-r") and "repo_centering" in preset_knobs("repo-d")
    for name in ("grpo", "grpo-entropy-bonus", "adapo"):
        assert "repo_centering" not in preset_knobs(name)
        with pytest.raises(ValueError, match="presets that accept it: repo-r, repo-d"):
            get_algorithm(name, repo_centering="exact")
    with pytest.raises(ValueError, match="presets that accept it: repo-r, repo-d"):
        AlgorithmConfig("mine", control="adapo", repo_centering="exact")
    with pytest.raises(ValueError, match="repo_centering must be one of raw, exact"):
        get_algorithm("repo-r", repo_centering="mean")
    assert get_algorithm("repo-d").repo_centering == "raw"  # the paper's implementation


def test_exact_centring_asks_for_entropies_and_shapes_with_log_pi_plus_h() -> None:
    adv, lp, ent = torch.tensor([1.0, -1.0]), torch.full((2, 1), -3.0), torch.ones(2, 1)
    for name, shape in (("repo-r", repo_r), ("repo-d", repo_d)):
        raw = make_control(get_algorithm(name, zeta_init=0.1, zeta_max=0.5))
        exact = make_control(
            get_algorithm(name, zeta_init=0.1, zeta_max=0.5, repo_centering="exact")
        )
        assert not raw.needs_entropy and exact.needs_entropy
        torch.testing.assert_close(raw.shape_advantages(adv, lp, ent), shape(adv, lp, 0.1))
        torch.testing.assert_close(exact.shape_advantages(adv, lp, ent), shape(adv, lp + ent, 0.1))
        with pytest.raises(ValueError, match="exact per-token entropies"):
            exact.shape_advantages(adv, lp, None)
    exact_r = make_control(get_algorithm("repo-r", zeta_init=0.1, repo_centering="exact"))
    # (1 - 0.1 * (-3 + 1)) = 1.2 for A = 1; (1 + 0.1 * (-2)) = 0.8 for A = -1
    torch.testing.assert_close(
        exact_r.shape_advantages(adv, lp, ent), torch.tensor([[1.2], [-0.8]])
    )


def _update(centering: str) -> tuple[list[bool], torch.Tensor]:
    """One repo-d update on a 4-arm bandit; returns what the scorer was asked and the grads."""
    torch.manual_seed(0)
    logits = torch.randn(4, requires_grad=True)
    actions = torch.tensor([0, 1, 2, 3, 0, 1])
    asked: list[bool] = []

    def score(index: torch.Tensor, need_entropy: bool):
        asked.append(need_entropy)
        logp_all = torch.log_softmax(logits, -1)
        lp = logp_all[actions[index]][:, None]
        h = -(logp_all.exp() * logp_all).sum()
        return lp, h.expand(len(index))[:, None] if need_entropy else None

    config = get_algorithm("repo-d", epochs=1, minibatch_size=None, zeta_init=0.5, zeta_max=0.5,
                           repo_centering=centering)  # fmt: skip
    batch = UpdateBatch.build(
        config.advantage, rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]), mask=torch.ones(6, 1),
    )  # fmt: skip
    grads = []
    policy_update(make_control(config), batch, score=score,
                  backward=lambda loss: grads.append(torch.autograd.grad(loss, logits)[0]),
                  step=lambda: True, zero_grad=lambda: None)  # fmt: skip
    return asked, grads[0]


def test_update_hands_the_scorers_entropies_to_the_control() -> None:
    asked_raw, grad_raw = _update("raw")
    asked_exact, grad_exact = _update("exact")
    assert not any(asked_raw)  # raw never pays for entropies
    assert asked_exact and all(asked_exact)
    assert not torch.allclose(grad_raw, grad_exact)
