"""The lever protocol: what a lever declares and the hooks the policy update calls.

A lever is one small class, registered by name in ``LEVERS`` with a typed ``Params``
dataclass (``entrogym.algos.levers`` holds the built-in ones). It declares:

* ``coefficient``: its one coefficient (the paper's name: ``zeta``, ``beta``, ``eps_high``,
  ``kl_coef``, ...) and the coefficient's natural range, which a controller
  (``entrogym.algos.controllers``) moves toward the target entropy. A larger coefficient
  always means more entropy. ``None``: no coefficient, no controller;
* ``default_controller`` and ``controller_knobs``: the controller it gets and the knobs that
  controller takes for it unless the user sets them;
* ``reads_target``: whether a hook reads the run's target entropy.

Every hook is optional. Two are read when a run's ``EntropyControl`` is built:

* ``needs_entropy``: whether the scorer must return exact per-token entropies;
* ``initial_coefficient``: where the coefficient starts when the controller sets no ``init``.

``policy_update`` (``entrogym.algos.update``) calls the other four on each micro-batch, in this
order, with ``coef`` the coefficient as the controller set it:

* ``shape_advantages``: per-token advantages (REPO-R, REPO-D);
* ``clip_range``: the policy loss's clip range (ADAPO's upper clip);
* ``adjust_objective``: the per-token objective before aggregation (Clip-Cov, KL-Cov);
* ``extra_loss``: a term added to the loss (the entropy bonus), told the rows' advantages (for
  a lever that acts on some rows only) and the target.

**The target** reaches a lever one way: as ``extra_loss``'s ``target`` argument, the run's
target entropy in nats (``EntropyControl.lever_target``: the target, or for ``estimator
relative`` its ratio times the base model's entropy on the batch) at the moment the loss is
computed, or ``None`` before it is known (the first minibatch of a run whose target is the
first iterations' entropy). A lever that reads it sets ``reads_target = True``; it then needs a
controller that has a target (any but ``fixed``), which ``AlgorithmConfig`` checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from entrogym.algos.losses import ClipParams, TokenObjective
from entrogym.algos.registry import NoParams, Registry


@dataclass(frozen=True)
class Coefficient:
    """A lever's one coefficient: its name in metrics rows and its natural range.

    ``init`` is where it starts; ``max`` its largest magnitude. ``min`` is a lower bound for a
    coefficient that cannot be negative (``signed=False``), and for a signed one the smallest
    magnitude the paper's controller keeps before it flips the sign. Controllers take these as
    defaults of their own ``init``, ``min`` and ``max`` knobs.
    """

    name: str
    init: float
    min: float
    max: float
    signed: bool = True


@dataclass
class LeverInputs:
    """What a lever may read when it adjusts the per-token objective (one micro-batch)."""

    logprobs: torch.Tensor  # [b, w], with gradients
    old_logprobs: torch.Tensor  # [b, w]
    generator: torch.Generator | None


class Lever:
    """The lever of an algorithm that pushes nothing (``none``); the base of every lever (the
    module doc lists its hooks and how the target reaches it)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    coefficient: ClassVar[Coefficient | None] = None  # None: no coefficient, no controller
    # The controller a preset without a lever gets with this lever; None: ``paper`` for a
    # coefficient that may be negative, ``fixed`` for one that may not.
    default_controller: ClassVar[str | None] = None
    # Knobs a controller takes for this lever unless the user sets them, by controller name:
    # where the lever's own range or sensitivity differs from the one the controller's
    # defaults were chosen for (docs/bandit.md, the regime map).
    controller_knobs: ClassVar[dict[str, dict[str, Any]]] = {}
    # Whether ``extra_loss`` reads its ``target``: such a lever needs a controller that has one.
    reads_target: ClassVar[bool] = False

    @classmethod
    def controller_by_default(cls) -> str:
        if cls.default_controller is not None:
            return cls.default_controller
        return "paper" if cls.coefficient is None or cls.coefficient.signed else "fixed"

    def __init__(self, params: Any) -> None:
        self.params = params

    @property
    def needs_entropy(self) -> bool:
        """Whether the scorer must return exact per-token entropies."""
        return False

    def initial_coefficient(self, loss: ClipParams) -> float:
        """Where the coefficient starts when the controller sets no ``init``."""
        return self.coefficient.init if self.coefficient is not None else 0.0

    def shape_advantages(
        self,
        advantages: torch.Tensor,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None,
        coef: float | None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Advantages ``[b]`` or ``[b, T]`` for the loss; ``logprobs`` are the current scores
        and ``mask`` marks their action tokens."""
        return advantages

    def clip_range(
        self, eps_low: float | None, eps_high: float | None, coef: float | None
    ) -> tuple[float | None, float | None]:
        """The clip range ``(eps_low, eps_high)`` the loss uses."""
        return eps_low, eps_high

    def adjust_objective(
        self, terms: TokenObjective, inputs: LeverInputs, coef: float | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The per-token objective to aggregate, and metrics (e.g. the share of tokens touched)."""
        return terms.objective, {}

    def extra_loss(
        self,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None,
        mask: torch.Tensor,
        coef: float | None,
        *,
        advantages: torch.Tensor | None = None,
        target: float | None = None,
    ) -> torch.Tensor | None:
        """A term added to the micro-batch's loss (``None``: nothing to add). ``mask`` marks
        the tokens the loss trains on, ``advantages`` are the rows' (``[b]`` or ``[b, T]``, as
        shaped), ``target`` the run's target entropy in nats (None until known)."""
        return None


LEVERS: Registry = Registry("lever", base=Lever)
register_lever = LEVERS.register
register_lever("none")(Lever)
