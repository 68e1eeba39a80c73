"""The algorithm core, on tensors only: advantage estimators, policy losses, token masks,
sampler-mismatch importance weights, entropy levers and their controllers (each a registry of
small parts with typed params), the presets that compose them, the policy update, and the
estimators of how much responses depend on their task. It imports nothing from entrogym
outside itself and reads no text."""

from entrogym.algos import aepo, entropic  # noqa: F401  (register their levers and controllers)
from entrogym.algos.advantages import (
    ADVANTAGES,
    GrpoParams,
    compute_advantages,
    grpo,
    register_advantage,
    rloo,
)
from entrogym.algos.algorithm import PART_REGISTRIES, AlgorithmConfig, algorithm_mapping
from entrogym.algos.controllers import (
    CONTROLLERS,
    AdditiveParams,
    Controller,
    ControllerParams,
    FixedParams,
    MultiplicativeParams,
    PaperParams,
    PIParams,
    register_controller,
)
from entrogym.algos.correction import CORRECTION_MODES, check_correction, sampler_weights
from entrogym.algos.entropy import (
    centred_logprobs,
    entropy_bonus_loss,
    exact_batch_entropy,
    high_entropy_tokens,
    importance_weighted_entropy,
    relative_entropy,
    repo_d,
    repo_r,
    sampled_entropy,
    token_covariance,
    token_entropy_from_logits,
)
from entrogym.algos.entropy_control import EntropyControl
from entrogym.algos.input_dependence import (
    cross_pairs,
    cross_scores,
    input_dependence,
    input_dependence_exact,
    input_dependence_per_token,
    retrieval_accuracy,
)
from entrogym.algos.levers import LEVERS, Coefficient, Lever, register_lever
from entrogym.algos.losses import LOSSES, ClipParams, clipped_policy_loss, register_loss
from entrogym.algos.masks import MASKS, TokenMask, register_mask
from entrogym.algos.presets import ALGORITHMS, build_algorithm, get_algorithm
from entrogym.algos.registry import NoParams, Part
from entrogym.algos.update import optimizer_steps, policy_update, score_old_logprobs
from entrogym.algos.update_batch import UpdateBatch, micro_batches, minibatch_indices

__all__ = [
    "ADVANTAGES",
    "ALGORITHMS",
    "CONTROLLERS",
    "CORRECTION_MODES",
    "LEVERS",
    "LOSSES",
    "MASKS",
    "PART_REGISTRIES",
    "AdditiveParams",
    "AlgorithmConfig",
    "ClipParams",
    "Coefficient",
    "Controller",
    "ControllerParams",
    "EntropyControl",
    "FixedParams",
    "GrpoParams",
    "Lever",
    "MultiplicativeParams",
    "NoParams",
    "PIParams",
    "PaperParams",
    "Part",
    "TokenMask",
    "UpdateBatch",
    "algorithm_mapping",
    "build_algorithm",
    "centred_logprobs",
    "check_correction",
    "clipped_policy_loss",
    "compute_advantages",
    "cross_pairs",
    "cross_scores",
    "entropy_bonus_loss",
    "exact_batch_entropy",
    "get_algorithm",
    "grpo",
    "high_entropy_tokens",
    "micro_batches",
    "minibatch_indices",
    "optimizer_steps",
    "policy_update",
    "register_advantage",
    "register_controller",
    "register_lever",
    "register_loss",
    "register_mask",
    "repo_d",
    "repo_r",
    "rloo",
    "sampler_weights",
    "importance_weighted_entropy",
    "input_dependence",
    "input_dependence_exact",
    "input_dependence_per_token",
    "relative_entropy",
    "retrieval_accuracy",
    "sampled_entropy",
    "score_old_logprobs",
    "token_covariance",
    "token_entropy_from_logits",
]
