"""AEPO's samples at temperature T for the bandit lab (``entrogym.algos.aepo``).

Each iteration the lab draws, for a random ``share`` of the states, one group of arms from
softmax(logits / T) with T the ``aepo`` controller's current temperature, scores them with the
env, and attaches them to the lever, which adds the REINFORCE term on their log-probs under the
current policy (temperature 1) to every minibatch's loss.
"""

from __future__ import annotations

import math

import torch

from entrogym.algos import EntropyControl
from entrogym.algos.aepo import Aepo, TemperatureSamples
from entrogym.theory.tabular import TabularSoftmaxPolicy


def temperature_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """pi^T(a | s) = softmax(logits / T), the temperature-adjusted policy AEPO samples from."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(logits / temperature, dim=-1)


def sample_at_temperature(
    policy: TabularSoftmaxPolicy,
    states: torch.Tensor,
    temperature: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """One arm per entry of ``states`` from pi^T."""
    with torch.no_grad():
        probs = temperature_probs(policy.logits[states].double(), temperature)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def attach_temperature_samples(
    control: EntropyControl,
    policy: TabularSoftmaxPolicy,
    env,
    samples_per_state: int,
    generator: torch.Generator,
) -> dict[str, float] | None:
    """For the ``aepo`` lever: draw this iteration's samples at the controller's temperature and
    attach them; returns their metrics (None for any other lever)."""
    lever = control.lever
    if not isinstance(lever, Aepo):
        return None
    n_states = policy.n_states
    chosen = torch.randperm(n_states, generator=generator)[
        : max(1, math.ceil(lever.params.share * n_states))
    ]
    states = chosen.repeat_interleave(samples_per_state)
    temperature = float(control.coefficient)
    actions = sample_at_temperature(policy, states, temperature, generator)
    rewards = torch.as_tensor(env.sample_rewards(states.numpy(), actions.numpy())).float()
    lever.attach(
        TemperatureSamples(
            rewards=rewards,
            mask=torch.ones(len(states), 1),
            score=lambda: policy.action_logprobs(states, actions),
        )
    )
    return {"aepo_reward": float(rewards.mean())}
