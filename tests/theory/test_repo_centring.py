"""Exact centring of REPO's log-prob (log pi + H), lab half."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos.entropy import repo_r, token_entropy_from_logits
from entrogym.theory.centring import centred_logprobs, exact_centring, repo_advantages
from entrogym.theory.lab import LabConfig, run_one


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
    with pytest.raises(ValueError, match="token_entropies"):
        centred_logprobs(logp, entropies[:, :3])


def test_repo_advantages_raw_is_the_paper_form_and_exact_shifts_it() -> None:
    adv, logp, ent = torch.tensor([1.0, -1.0]), torch.tensor([[-3.0], [-3.0]]), torch.ones(2, 1)
    raw = repo_advantages("repo-r", adv, logp, 0.1)
    torch.testing.assert_close(raw, repo_r(adv, logp, 0.1))
    exact = repo_advantages("repo-r", adv, logp, 0.1, centering="exact", token_entropies=ent)
    torch.testing.assert_close(exact, torch.tensor([[1.2], [-0.8]]))
    with pytest.raises(ValueError, match="token_entropies"):
        repo_advantages("repo-d", adv, logp, 0.1, centering="exact")
    with pytest.raises(ValueError, match="repo_centering"):
        repo_advantages("repo-d", adv, logp, 0.1, centering="mean")


def test_lab_with_raw_centring_reproduces_run_one_and_exact_changes_repo_only() -> None:
    lab = LabConfig(iters=5, n_states=4, n_arms=6, samples_per_state=4)
    _, plain = run_one("repo-r (zeta_init=0.5 zeta_max=0.5)", 0, lab)
    with exact_centring("raw"):
        _, raw = run_one("repo-r (zeta_init=0.5 zeta_max=0.5)", 0, lab)
    with exact_centring("exact"):
        _, exact = run_one("repo-r (zeta_init=0.5 zeta_max=0.5)", 0, lab)
        _, grpo = run_one("grpo", 0, lab)
    assert [r["entropy"] for r in raw] == [r["entropy"] for r in plain]
    assert [r["entropy"] for r in exact] != [r["entropy"] for r in plain]
    assert [r["entropy"] for r in grpo] == [r["entropy"] for r in run_one("grpo", 0, lab)[1]]
