"""Entropy controls: one small class per control, registered by name (paper Sec. 5).

A control may change the update in four places, each optional (the defaults change nothing):

* ``shape_advantages(advantages, logprobs, entropies)``: per-token advantages from the latest
  policy's detached log-probs (REPO-R, REPO-D; with ``repo_centering: exact`` centred by the
  exact entropies);
* ``extra_loss(logprobs, entropies, mask)``: a term added to the clipped loss (the entropy
  bonus);

``needs_entropy`` (a class attribute or a property) asks the scorer for the exact per-token
entropies at the log-probs' positions; without it ``entropies`` is ``None`` in both hooks;
* ``lower_clip`` / ``upper_clip``: the clip range it uses (ADAPO moves ``upper_clip``);
* ``steer(entropy, target)``: its feedback loop, run once per iteration by ``observe``.

The target is the entropy of the first iteration's experience (paper Sec. 5), set by the first
``observe``. Adding a control is one class plus one registry line::

    @register_control("my-control")
    class MyControl(EntropyControl):
        knobs = ("zeta_init",)  # the AlgorithmConfig fields it reads, settable per preset

        def shape_advantages(self, advantages, logprobs, entropies=None):
            return advantages - self.config.zeta_init * logprobs.detach()

``examples/custom_entropy_control.py`` writes one and runs it in the bandit lab.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from entrogym.algos.entropy import (
    EpsHighController,
    ZetaController,
    centred_logprobs,
    entropy_bonus_loss,
    repo_d,
    repo_r,
)

if TYPE_CHECKING:
    from entrogym.algos.presets import AlgorithmConfig


class EntropyControl:
    """The control of a preset that has none; the base of every other control.

    Holds the target entropy and the history of observed entropies (checkpointed with the run).
    """

    name: ClassVar[str] = ""
    knobs: ClassVar[tuple[str, ...]] = ()
    needs_entropy: ClassVar[bool] = False

    def __init__(self, config: AlgorithmConfig) -> None:
        self.config = config
        self.target: float | None = None
        self.history: list[float] = []

    def shape_advantages(
        self,
        advantages: torch.Tensor,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Advantages ``[b]`` or ``[b, T]`` for the loss; ``logprobs`` are the current scores,
        ``entropies`` the exact per-token entropies when ``needs_entropy`` (else ``None``)."""
        return advantages

    def extra_loss(
        self, logprobs: torch.Tensor, entropies: torch.Tensor | None, mask: torch.Tensor
    ) -> torch.Tensor | None:
        """A term added to the micro-batch's loss (``None``: nothing to add)."""
        return None

    @property
    def lower_clip(self) -> float | None:
        """eps_low of the clip range [1 - eps_low, 1 + eps_high]; ``None`` = unclipped."""
        return self.config.eps_low

    @property
    def upper_clip(self) -> float | None:
        """eps_high of the clip range [1 - eps_low, 1 + eps_high]; ``None`` = unclipped."""
        return self.config.eps_high

    def observe(self, entropy: float) -> None:
        """Feed one iteration's entropy: the first sets the target, later ones steer."""
        self.history.append(entropy)
        if self.target is None:
            self.target = entropy
            return
        self.steer(entropy, self.target)

    def steer(self, entropy: float, target: float) -> None:
        """Move the control's coefficients once per iteration (no-op without a controller)."""

    def metrics(self) -> dict[str, float | None]:
        """What the iteration's metrics row reports about the control as it was used."""
        return {"eps_high": self.upper_clip}

    def controllers(self) -> dict[str, Any]:
        """The stateful parts by checkpoint key; each has ``state_dict`` / ``load_state_dict``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        state = {"control": self.name, "target": self.target, "history": list(self.history)}
        state.update({key: c.state_dict() for key, c in self.controllers().items()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``state_dict()``, or the older format without ``"control"`` (``{"target",
        "history", "zeta", "eps_high"}``, the latter two ``None`` for presets without them)."""
        saved = state.get("control", self.name)
        if saved != self.name:
            raise ValueError(
                f"control state: the checkpoint holds {saved!r} state, this preset uses "
                f"{self.name!r}; resume with the preset the run was started with"
            )
        self.target, self.history = state["target"], list(state["history"])
        for key, controller in self.controllers().items():
            if state.get(key) is not None:
                controller.load_state_dict(state[key])


C = TypeVar("C", bound=type[EntropyControl])

CONTROLS: dict[str, type[EntropyControl]] = {}


def _origin(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__


def register_control(name: str) -> Callable[[C], C]:
    """Class decorator: make the control available to presets as ``control=name``."""

    def add(cls: C) -> C:
        if not (isinstance(cls, type) and issubclass(cls, EntropyControl)):
            raise ValueError(f"register_control({name!r}) takes an EntropyControl subclass")
        known = CONTROLS.get(name)
        rerun = known is not None and _origin(known) == _origin(cls)  # same definition, re-run
        if known is not None and known is not cls and not rerun:
            raise ValueError(
                f"control {name!r} is already registered ({known.__name__}); pick another name"
            )
        cls.name = name
        CONTROLS[name] = cls
        return cls

    return add


def control_class(name: str) -> type[EntropyControl]:
    """The registered control called ``name``; ValueError listing the registered ones."""
    if name not in CONTROLS:
        raise ValueError(
            f"control: {name!r} is not a registered entropy control; registered: "
            f"{', '.join(CONTROLS)} (add one with entrogym.algos.register_control)"
        )
    return CONTROLS[name]


def make_control(config: AlgorithmConfig) -> EntropyControl:
    """A fresh control for ``config`` (``config.control`` names it)."""
    return control_class(config.control)(config)


register_control("none")(EntropyControl)


class ZetaControl(EntropyControl):
    """A control with one coefficient steered by the bidirectional ``ZetaController``."""

    knobs = ("zeta_init", "zeta_min", "zeta_max", "zeta_factor")

    def __init__(self, config: AlgorithmConfig) -> None:
        super().__init__(config)
        self.zeta = ZetaController(
            config.zeta_min, config.zeta_max, config.zeta_init, config.zeta_factor
        )

    @property
    def coefficient(self) -> float:
        return self.zeta.zeta

    def steer(self, entropy: float, target: float) -> None:
        self.zeta.update(entropy, target)

    def metrics(self) -> dict[str, float | None]:
        return {**super().metrics(), "zeta": self.coefficient}

    def controllers(self) -> dict[str, Any]:
        return {"zeta": self.zeta}


class RepoControl(ZetaControl):
    """REPO's shaping with raw log pi or, with ``repo_centering: exact``, log pi + H(s)."""

    knobs = (*ZetaControl.knobs, "repo_centering")

    @property
    def needs_entropy(self) -> bool:  # type: ignore[override]
        # Only the exact form needs H(s); raw REPO keeps the scorer's cheap path.
        return self.config.repo_centering == "exact"

    def shaping_logprobs(
        self, logprobs: torch.Tensor, entropies: torch.Tensor | None
    ) -> torch.Tensor:
        """The detached log-probs REPO shapes with: raw, or centred by the exact entropies."""
        if not self.needs_entropy:
            return logprobs.detach()
        if entropies is None:
            raise ValueError(
                "repo_centering='exact' needs the scorer's exact per-token entropies; the "
                "score function must return them when asked (need_entropy=True)"
            )
        return centred_logprobs(logprobs, entropies)

    # The per-token formula (entrogym.algos.entropy.repo_r or repo_d): (A, logp, zeta) -> A'.
    formula: ClassVar[Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]]

    def shape_advantages(
        self,
        advantages: torch.Tensor,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None = None,
    ) -> torch.Tensor:
        shaping = self.shaping_logprobs(logprobs, entropies)
        return type(self).formula(advantages, shaping, self.coefficient)


@register_control("repo-r")
class RepoR(RepoControl):
    """REPO-R: multiplicative per-token reshaping of the advantages (appendix "REPO-R")."""

    formula = staticmethod(repo_r)


@register_control("repo-d")
class RepoD(RepoControl):
    """REPO-D: A - zeta * logp per token (Sec. 5)."""

    formula = staticmethod(repo_d)


@register_control("entropy-bonus")
class EntropyBonus(ZetaControl):
    """J_PPO + beta * H with exact token entropies, beta steered like REPO's zeta (Sec. 5)."""

    needs_entropy = True

    def extra_loss(
        self, logprobs: torch.Tensor, entropies: torch.Tensor | None, mask: torch.Tensor
    ) -> torch.Tensor:
        if entropies is None:
            raise ValueError("the entropy-bonus control needs score() to return entropies")
        return entropy_bonus_loss(entropies, mask, self.coefficient)

    def metrics(self) -> dict[str, float | None]:
        return {"eps_high": self.upper_clip, "beta": self.coefficient}


@register_control("adapo")
class Adapo(EntropyControl):
    """ADAPO: the upper clip eps_high steered toward the target entropy (Sec. 5, "ADAPO")."""

    knobs = ("eps_high_min", "eps_high_max", "eps_high_up", "eps_high_down")

    def __init__(self, config: AlgorithmConfig) -> None:
        super().__init__(config)
        if config.eps_high is None:
            raise ValueError("eps_high: ADAPO steers the upper clip, so it cannot be None")
        self.eps_high = EpsHighController(
            config.eps_high,
            config.eps_high_min,
            config.eps_high_max,
            config.eps_high_up,
            config.eps_high_down,
        )

    @property
    def upper_clip(self) -> float:
        return self.eps_high.eps_high

    def steer(self, entropy: float, target: float) -> None:
        self.eps_high.update(entropy, target)

    def controllers(self) -> dict[str, Any]:
        return {"eps_high": self.eps_high}
