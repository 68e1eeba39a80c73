"""EntroPIC and AEPO on the tabular bandit: each raises entropy against GRPO when the target is
above the entropy and lowers it when the target is below; AEPO's sampler is softmax(z / T)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entrogym.commands.lab_runs import lab_run
from entrogym.experiments.lab import run_one
from entrogym.experiments.lab_config import LabConfig
from entrogym.theory.tabular import TabularSoftmaxPolicy
from entrogym.theory.temperature import sample_at_temperature, temperature_probs

LAB = LabConfig(iters=30, lr=8.0, n_states=16)
CONTROLS = {
    "entropic": "grpo --algo.lever entropic --algo.lever.high-prob 0.3 --algo.controller.max 3",
    "aepo": "grpo --algo.lever aepo --algo.controller.max 2 --algo.controller.min 0.5",
}


def _final_entropy(entry: str) -> float:
    _, rows = run_one(lab_run(entry), 0, LAB)
    return float(np.mean([r["entropy"] for r in rows[-5:]]))


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_control_pushes_entropy_toward_a_target_above_or_below(name):
    torch.set_num_threads(1)
    grpo = _final_entropy("grpo")
    nats = "--algo.controller.target-unit nats --algo.controller.target"
    above = _final_entropy(f"{CONTROLS[name]} {nats} 3.0")  # above the initial entropy (~1.4)
    below = _final_entropy(f"{CONTROLS[name]} {nats} 0.05")
    assert above > grpo + 0.1, (above, grpo)
    assert below < grpo - 0.05, (below, grpo)


def test_temperature_probs_match_numpy_and_sampling():
    logits = torch.tensor([[2.0, 0.0, -1.0]], dtype=torch.float64)
    for t in (0.5, 1.0, 2.0):
        z = np.array([2.0, 0.0, -1.0]) / t
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert np.allclose(temperature_probs(logits, t)[0].numpy(), want)
    policy = TabularSoftmaxPolicy(logits)
    states = torch.zeros(20000, dtype=torch.long)
    actions = sample_at_temperature(policy, states, 2.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(actions, minlength=3).double() / len(actions)
    assert torch.allclose(freq, temperature_probs(logits, 2.0)[0], atol=0.015)
    with pytest.raises(ValueError, match="temperature"):
        temperature_probs(logits, 0.0)
