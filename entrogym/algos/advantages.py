"""Group-relative advantage estimators (paper Sec. 2, "Preliminaries").

Both take one terminal reward per trajectory and the id of the group (task) it was sampled for;
the K samples of a task form one group. They are registered in ``ADVANTAGES`` by name, each
with its params (``grpo``'s ``eps``), as an algorithm's ``advantage`` part.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from entrogym.algos.checks import check_group_inputs
from entrogym.algos.registry import NoParams, Part, Registry


def rloo(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out advantage (Sec. 2, "RLOO").

    A_i = r_i - 1/(K-1) * sum_{j != i} r_j, computed as the paper's equivalent closed form
    K/(K-1) * (r_i - mean_j r_j). Groups may have different sizes (early stopping); every group
    needs at least two trajectories, since a leave-one-out baseline of nothing is undefined.
    """
    rewards, inverse, counts = check_group_inputs(rewards, group_ids, min_group_size=2)
    sums = torch.zeros(counts.numel(), dtype=rewards.dtype).index_add_(0, inverse, rewards)
    k = counts[inverse].to(rewards.dtype)
    mean = sums[inverse] / k
    return k / (k - 1) * (rewards - mean)


def grpo(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantage (Sec. 2, "GRPO"): (r_i - mean) / (std + eps) within each group.

    The std is the sample standard deviation with Bessel's correction, as TRL and verl compute it.
    A group whose rewards are all equal carries no signal and gets exactly 0 (the numerator is 0).
    """
    rewards, inverse, counts = check_group_inputs(rewards, group_ids, min_group_size=2)
    n_groups = counts.numel()
    k = counts.to(rewards.dtype)
    mean = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards) / k
    centred = rewards - mean[inverse]
    var = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centred**2) / (k - 1)
    return centred / (var.sqrt()[inverse] + eps)


@dataclass(frozen=True)
class GrpoParams:
    """Knobs of the ``grpo`` estimator.

    Args:
        eps: added to the group's standard deviation before dividing.
    """

    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not self.eps >= 0:
            raise ValueError(f"algo.advantage.eps must be >= 0, got {self.eps}")


# An estimator is fn(rewards[B], group_ids[B], params) -> advantages[B].
ADVANTAGES: Registry = Registry("advantage")
register_advantage = ADVANTAGES.register


@register_advantage("rloo")
def _rloo(rewards: torch.Tensor, group_ids: torch.Tensor, params: NoParams) -> torch.Tensor:
    """Leave-one-out: r_i minus the mean of the group's other rewards (RLOO, LOOP, DAPO)."""
    return rloo(rewards, group_ids)


@register_advantage("grpo", params=GrpoParams)
def _grpo(rewards: torch.Tensor, group_ids: torch.Tensor, params: GrpoParams) -> torch.Tensor:
    """Group-normalised: (r_i - group mean) / (group std + eps) (GRPO, REPO)."""
    return grpo(rewards, group_ids, eps=params.eps)


def compute_advantages(
    advantage: str | Part, rewards: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """The advantages of the registered estimator ``advantage`` (a name, or a :class:`Part`
    with its params)."""
    part = advantage if isinstance(advantage, Part) else ADVANTAGES.part(advantage)
    return ADVANTAGES.get(part.name)(rewards, group_ids, part.params)


def zero_advantage_groups(advantages: torch.Tensor, group_ids: torch.Tensor) -> int:
    """Number of groups whose advantages are all zero: they carry no policy-gradient signal."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    nonzero = torch.zeros(int(inverse.max()) + 1, dtype=torch.long)
    nonzero.index_add_(0, inverse, (advantages != 0).long())
    return int((nonzero == 0).sum())
