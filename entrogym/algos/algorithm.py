"""An algorithm: a composition of registered parts, each with its own typed params.

``AlgorithmConfig`` names an advantage estimator, a policy loss, a token mask, an entropy lever
and the controller of the lever's coefficient, plus how many epochs and minibatches the update
runs. The named compositions with the paper's values are the presets
(``entrogym.algos.presets``); :func:`algorithm_mapping` writes one as the plain mapping that
YAML files and run folders hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from entrogym.algos.advantages import ADVANTAGES
from entrogym.algos.controller_params import ControllerParams
from entrogym.algos.controllers import CONTROLLERS, Controller
from entrogym.algos.correction import CORRECTION_MODES, check_correction
from entrogym.algos.finite import check_finite_fields
from entrogym.algos.levers import LEVERS, Lever
from entrogym.algos.losses import LOSSES, ClipParams
from entrogym.algos.masks import MASKS
from entrogym.algos.registry import Part, Registry

# The parts of an algorithm, in the order they are shown, and the registry of each.
PART_REGISTRIES: dict[str, Registry] = {
    "advantage": ADVANTAGES,
    "loss": LOSSES,
    "mask": MASKS,
    "lever": LEVERS,
    "controller": CONTROLLERS,
}
DEFAULT_IS_CLIP_MAX = 3.0  # the largest importance weight a correction keeps, by default
# The settings of the update itself (not parts).
UPDATE_KNOBS = ("epochs", "minibatch_size", "is_correction", "is_clip_min", "is_clip_max")


@dataclass(frozen=True)
class AlgorithmConfig:
    """One policy-gradient algorithm.

    Attributes:
        name: the preset it is (or derives from).
        advantage: the advantage estimator (``rloo``: leave-one-out, ``grpo``: group mean/std).
        loss: the policy loss (``clipped``: clip range, ratio level, aggregation).
        mask: the token mask of the loss (``all``, or ``high-entropy``: the top-rho tokens).
        lever: how entropy is pushed, with one coefficient (``none``, ``repo-r``, ``repo-d``,
            ``entropy-bonus``, ``clip-high``, ``clip-cov``, ``kl-cov`` or one of yours).
        controller: how the lever's coefficient moves toward the target (``fixed``,
            ``paper``, ``multiplicative``, ``additive``, ``pi``); ``None`` without a lever.
        epochs: passes over each iteration's experience (1 = strictly on-policy RLOO).
        minibatch_size: trajectories per optimizer step; ``None`` = all experience in one step.
            The paper uses 128 on AppWorld and 256 on AIME.
        is_correction: how the policy-gradient term is reweighted for the sampler/learner
            mismatch (``entrogym.algos.correction``): ``token_truncate``, ``token_mask``,
            ``sequence_truncate`` or ``sequence_mask``; ``None`` (the default): not at all.
        is_clip_min: the smallest importance weight kept (``None``: no lower bound).
        is_clip_max: the largest importance weight kept (``None``: no upper bound).
    """

    name: str
    advantage: Part = Part("rloo")
    loss: Part = Part("clipped", ClipParams())
    mask: Part = Part("all")
    lever: Part = Part("none")
    controller: Part | None = None
    epochs: int = 2
    minibatch_size: int | None = 128
    is_correction: str | None = None
    is_clip_min: float | None = None
    is_clip_max: float | None = DEFAULT_IS_CLIP_MAX

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"epochs must be an integer >= 1, got {self.epochs!r}")
        size = self.minibatch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"minibatch_size must be an integer >= 1 or None, got {size!r}")
        check_finite_fields(self, "algo.")
        self._check_clip_has_correction()
        if self.is_correction is not None:
            try:
                check_correction(self.is_correction, self.is_clip_min, self.is_clip_max)
            except ValueError as exc:
                raise ValueError(f"algo.is_correction {self.is_correction!r}: {exc}") from None
        for kind, registry in PART_REGISTRIES.items():
            part = getattr(self, kind)
            if part is None:
                continue
            cls = registry.params_class(part.name)  # an unknown name lists the registered ones
            if not isinstance(part.params, cls):
                raise ValueError(
                    f"{kind} {part.name!r}: params must be {cls.__name__}, got "
                    f"{type(part.params).__name__}"
                )
        lever = make_lever(self)
        has_coefficient = lever.coefficient is not None
        if self.controller is None and has_coefficient:
            raise ValueError(f"lever {self.lever.name!r} needs a controller")
        if self.controller is not None and not has_coefficient:
            raise ValueError(
                f"controller {self.controller.name!r} has nothing to control: lever "
                f"{self.lever.name!r} has no coefficient"
            )
        if lever.reads_target and self.controller is not None and target_params(self) is None:
            raise ValueError(
                f"lever {self.lever.name!r} reads the target entropy, and controller "
                f"{self.controller.name!r} has none; to hold the coefficient, use pi with "
                "kp 0 and ki 0"
            )
        params = target_params(self)
        if lever.reads_target and params is not None and params.estimator == "input_dependence":
            raise ValueError(
                f"lever {self.lever.name!r} compares the entropy in its loss with the target, "
                "and controller.estimator input_dependence sets a target in mutual information; "
                "use a lever that reads no target (entropy-bonus, repo-r, repo-d, clip-high)"
            )
        make_controller(self, lever)  # the controller checks its range and start value

    def _check_clip_has_correction(self) -> None:
        """An importance-weight clip set without a correction mode would be ignored."""
        if self.is_correction is not None:
            return
        for knob, default in (("is_clip_min", None), ("is_clip_max", DEFAULT_IS_CLIP_MAX)):
            value = getattr(self, knob)
            if value != default:
                raise ValueError(
                    f"algo.{knob} {value} has no effect without algo.is_correction; add "
                    f"--algo.is-correction {CORRECTION_MODES[0]} (or "
                    f"{', '.join(CORRECTION_MODES[1:])}) or drop it"
                )

    @property
    def parts(self) -> dict[str, Part | None]:
        return {kind: getattr(self, kind) for kind in PART_REGISTRIES}


def make_lever(config: AlgorithmConfig) -> Lever:
    return LEVERS.get(config.lever.name)(config.lever.params)


def make_controller(config: AlgorithmConfig, lever: Lever | None = None) -> Controller | None:
    """The controller of ``config``'s lever coefficient, at its start value (None if none)."""
    if config.controller is None:
        return None
    lever = lever or make_lever(config)
    cls = CONTROLLERS.get(config.controller.name)
    return cls(
        config.controller.params, lever.coefficient, lever.initial_coefficient(config.loss.params)
    )


def target_params(config: AlgorithmConfig) -> ControllerParams | None:
    """The knobs of ``config``'s controller when it moves toward a target (they extend
    ``ControllerParams``); None without a controller or for one that has no target
    (``fixed``)."""
    params = None if config.controller is None else config.controller.params
    return params if isinstance(params, ControllerParams) else None


def part_mapping(part: Part) -> dict[str, Any]:
    """``{"name": ..., knob: value, ...}`` of one part."""
    return {"name": part.name, **part.knobs()}


def algorithm_mapping(config: AlgorithmConfig) -> dict[str, Any]:
    """The whole algorithm as a plain mapping: every part with every knob (a canonical form:
    two configs that train the same way have equal mappings)."""
    out: dict[str, Any] = {"name": config.name}
    for kind, part in config.parts.items():
        out[kind] = None if part is None else part_mapping(part)
    out.update({k: getattr(config, k) for k in UPDATE_KNOBS})
    return out
