"""``lever.centering: raw | exact``: a knob of the REPO levers (Sec. 5, centred log pi)."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import EntropyControl, build_algorithm, policy_update
from entrogym.algos.entropy import centred_logprobs, repo_d, repo_r, token_entropy_from_logits
from entrogym.algos.update_batch import UpdateBatch


def _repo(name: str, **lever: object) -> EntropyControl:
    # the sampled estimator: what needs entropies here is the lever's alone
    controller = {"init": 0.1, "max": 0.5, "estimator": "sampled"}
    spec = {"name": name, "controller": controller, "lever": lever}
    return EntropyControl(build_algorithm(spec))


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


def test_centering_is_a_knob_of_the_repo_levers_only() -> None:
    assert build_algorithm("repo-d").lever.params.centering == "raw"  # the paper's implementation
    assert (
        build_algorithm({"name": "repo-r", "lever": {"centering": "exact"}}).lever.params.centering
        == "exact"
    )
    for name in ("grpo-entropy-bonus", "adapo"):
        with pytest.raises(ValueError, match="algo.lever.centering is not a knob of lever"):
            build_algorithm({"name": name, "lever": {"centering": "exact"}})
    with pytest.raises(ValueError, match="this preset has no lever; presets with a lever: repo-r"):
        build_algorithm({"name": "grpo", "lever": {"centering": "exact"}})
    with pytest.raises(ValueError, match="algo.lever.centering: expected one of raw, exact"):
        build_algorithm({"name": "repo-r", "lever": {"centering": "mean"}})


def test_exact_centring_asks_for_entropies_and_shapes_with_log_pi_plus_h() -> None:
    adv, lp, ent = torch.tensor([1.0, -1.0]), torch.full((2, 1), -3.0), torch.ones(2, 1)
    for name, shape in (("repo-r", repo_r), ("repo-d", repo_d)):
        raw, exact = _repo(name), _repo(name, centering="exact")
        assert not raw.needs_entropy and exact.needs_entropy
        assert raw.coefficient == exact.coefficient == 0.1
        torch.testing.assert_close(
            raw.lever.shape_advantages(adv, lp, ent, 0.1), shape(adv, lp, 0.1)
        )
        torch.testing.assert_close(
            exact.lever.shape_advantages(adv, lp, ent, 0.1), shape(adv, lp + ent, 0.1)
        )
        with pytest.raises(ValueError, match="exact per-token entropies"):
            exact.lever.shape_advantages(adv, lp, None, 0.1)
    exact_r = _repo("repo-r", centering="exact")
    # (1 - 0.1 * (-3 + 1)) = 1.2 for A = 1; (1 + 0.1 * (-2)) = 0.8 for A = -1
    torch.testing.assert_close(
        exact_r.lever.shape_advantages(adv, lp, ent, 0.1), torch.tensor([[1.2], [-0.8]])
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

    config = build_algorithm({"name": "repo-d", "epochs": 1, "minibatch_size": None,
                              "controller": {"init": 0.5, "max": 0.5,
                                             "estimator": "sampled"},  # the lever's needs alone
                              "lever": {"centering": centering}})  # fmt: skip
    batch = UpdateBatch.build(
        config.advantage, rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]), mask=torch.ones(6, 1),
    )  # fmt: skip
    grads = []
    policy_update(EntropyControl(config), batch, score=score,
                  backward=lambda loss: grads.append(torch.autograd.grad(loss, logits)[0]),
                  step=lambda: True, zero_grad=lambda: None)  # fmt: skip
    return asked, grads[0]


def test_update_hands_the_scorers_entropies_to_the_control() -> None:
    asked_raw, grad_raw = _update("raw")
    asked_exact, grad_exact = _update("exact")
    assert not any(asked_raw)  # raw never pays for entropies
    assert asked_exact and all(asked_exact)
    assert not torch.allclose(grad_raw, grad_exact)
