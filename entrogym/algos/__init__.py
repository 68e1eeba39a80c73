"""The algorithm core, on tensors only: advantages, clipped losses, entropy controls, presets
and the policy update that composes them. It imports nothing from entrogym outside itself."""

from entrogym.algos.advantages import ADVANTAGES, compute_advantages, grpo, rloo
from entrogym.algos.controls import (
    CONTROLS,
    EntropyControl,
    control_class,
    make_control,
    register_control,
)
from entrogym.algos.entropy import (
    EpsHighController,
    ZetaController,
    centred_logprobs,
    entropy_bonus_loss,
    repo_d,
    repo_r,
    sampled_entropy,
    token_entropy_from_logits,
)
from entrogym.algos.losses import clipped_policy_loss
from entrogym.algos.presets import ALGORITHMS, AlgorithmConfig, get_algorithm, preset_knobs
from entrogym.algos.update import policy_update, score_old_logprobs
from entrogym.algos.update_batch import UpdateBatch, micro_batches, minibatch_indices

__all__ = [
    "ADVANTAGES",
    "ALGORITHMS",
    "CONTROLS",
    "AlgorithmConfig",
    "EntropyControl",
    "EpsHighController",
    "UpdateBatch",
    "ZetaController",
    "clipped_policy_loss",
    "compute_advantages",
    "control_class",
    "entropy_bonus_loss",
    "get_algorithm",
    "grpo",
    "make_control",
    "micro_batches",
    "minibatch_indices",
    "policy_update",
    "preset_knobs",
    "register_control",
    "repo_d",
    "repo_r",
    "rloo",
    "sampled_entropy",
    "score_old_logprobs",
    "centred_logprobs",
    "token_entropy_from_logits",
]
