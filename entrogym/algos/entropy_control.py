"""The entropy control of one run: an algorithm's lever, controller, token mask and target.

``EntropyControl`` is what ``policy_update`` consults: the lever's coefficient as the controller
has set it, the clip range, whether the scorer must compute exact entropies, which estimate of
a batch's entropy the controller tracks (``controller.estimator``: ``batch_entropy``, or with
``probe`` the fixed probe states' entropy, with ``relative`` the batch's entropy over the
base model's and with ``input_dependence`` the mutual information of probe tasks and
responses, each handed over by the trainer: ``observe_states``), and where
the controller is fed: ``observe`` once per iteration (the paper's step) and ``observe_step``
after every optimizer step (TRL's). The target is set by the first entropy the controller sees
(a ratio of it, averaged with the initial policy's probe batches when ``controller.target_probe``
asks the trainer for some, measured by the same estimator) unless it is absolute (nats); the
lever reads it only as ``extra_loss``'s ``target`` (``entrogym.algos.lever_hooks``).
``state_dict`` / ``load_state_dict`` checkpoint it; loading refuses a state saved by another
lever or controller.
"""

from __future__ import annotations

from typing import Any

import torch

from entrogym.algos.algorithm import AlgorithmConfig, make_controller, make_lever, target_params
from entrogym.algos.entropy import exact_batch_entropy, sampled_entropy
from entrogym.algos.masks import MASKS


class EntropyControl:
    """The entropy parts of ``config`` for one run (see the module doc)."""

    def __init__(self, config: AlgorithmConfig) -> None:
        self.config = config
        self.lever = make_lever(config)
        self.controller = make_controller(config, self.lever)
        # the knobs of a controller that moves toward a target; None without one (``fixed``
        # has none: like a run without a lever, the target then only reports the drift)
        self.feedback = target_params(config)
        self.mask = MASKS.get(config.mask.name)(config.mask.params)
        self.target: float | None = None
        self.history: list[float] = []
        self.probe: list[float] = []  # entropies of the initial policy's probe batches
        # estimator probe: the policy's entropy on the probe batches' states, this iteration
        self.state_entropy: float | None = None
        # estimator relative: the base model's mean exact entropy on this iteration's batch, in
        # nats, which turns the ratio target into the nats a lever's in-loss push compares with
        self.state_reference: float | None = None

    # ----- what the update reads --------------------------------------------------------------

    @property
    def steps_per_optimizer_step(self) -> bool:
        return self.feedback is not None and self.feedback.step == "optimizer"

    @property
    def tracks_exact(self) -> bool:
        """The controller tracks the exact entropy of each iteration's batch
        (``controller.estimator: exact``); without a controller that has a target nothing is
        tracked and the sampled estimate, free, is reported."""
        return self.feedback is not None and self.feedback.estimator == "exact"

    @property
    def tracks_probe_states(self) -> bool:
        """The controller tracks the exact entropy on the fixed probe states
        (``controller.estimator: probe``): the trainer rescores them before every update and
        hands the result to ``observe_states``."""
        return self.feedback is not None and self.feedback.estimator == "probe"

    @property
    def tracks_relative(self) -> bool:
        """The controller tracks the batch's exact entropy relative to the base model's on the
        same tokens (``controller.estimator: relative``): the trainer measures it before every
        update and hands it to ``observe_states``."""
        return self.feedback is not None and self.feedback.estimator == "relative"

    @property
    def probe_request(self) -> int:
        """How many batches of the initial policy the target averages in, asked of the trainer
        before the first update (``controller.target_probe``; validated where it is parsed: a
        controller without a target, or with one in nats, has none). None once an iteration
        was observed: a resumed run's state holds what the probe measured."""
        if self.feedback is None or self.history:
            return 0
        return self.feedback.target_probe

    @property
    def tracks_input_dependence(self) -> bool:
        """The controller tracks how much the responses depend on the task, not an entropy
        (``controller.estimator: input_dependence``): the trainer measures the mutual
        information on its probe tasks before every update and hands it to ``observe_states``."""
        return self.feedback is not None and self.feedback.estimator == "input_dependence"

    @property
    def tracks_handed(self) -> bool:
        """The update does not estimate what the controller tracks: the caller hands it over
        (``observe_states``) before the update (``probe``, ``relative`` or
        ``input_dependence``)."""
        return self.tracks_probe_states or self.tracks_relative or self.tracks_input_dependence

    @property
    def loss_needs_entropy(self) -> bool:
        """Every loss pass needs exact per-token entropies: for the lever, the mask, or a
        controller fed after every optimizer step (it reads the minibatch's)."""
        lever_or_mask = self.lever.needs_entropy or self.mask.needs_entropy
        return lever_or_mask or self.steps_per_optimizer_step

    @property
    def needs_entropy(self) -> bool:
        """Exact per-token entropies of an iteration's batch are needed somewhere: by the loss,
        or by a controller that tracks them (the policy's before the iteration's first step
        only)."""
        return self.loss_needs_entropy or self.tracks_exact

    @property
    def measures_exact(self) -> bool:
        """``batch_entropy`` reads exact entropies (``exact``, ``probe`` or ``relative``): score
        with them."""
        return self.tracks_exact or self.tracks_probe_states or self.tracks_relative

    def batch_entropy(
        self, logprobs: torch.Tensor, entropies: torch.Tensor | None, mask: torch.Tensor
    ) -> float:
        """The entropy the controller tracks of one batch scored under one policy: the mean
        exact entropy of ``entropies`` (scored with them: ``measures_exact``) when it tracks an
        exact one (``exact``, or ``probe`` on a probe batch), else the sampled estimate from
        ``logprobs``, over ``mask``'s action tokens."""
        if not self.measures_exact:
            return sampled_entropy(logprobs, mask)
        if entropies is None:
            raise ValueError(
                f"controller.estimator {self.feedback.estimator} tracks exact entropies; score "
                "the batch with need_entropy=True (EntropyControl.measures_exact)"
            )
        return exact_batch_entropy(entropies, mask)

    @property
    def coefficient(self) -> float | None:
        """The lever's coefficient as applied now (None for a lever without one)."""
        return None if self.controller is None else self.controller.applied()

    def clip_range(self) -> tuple[float | None, float | None]:
        loss = self.config.loss.params
        return self.lever.clip_range(loss.eps_low, loss.eps_high, self.coefficient)

    # ----- feedback ---------------------------------------------------------------------------

    def observe(self, entropy: float) -> None:
        """One iteration's tracked entropy (``batch_entropy`` of the policy being trained, on
        its experience): recorded, and fed to a controller that steps once per iteration."""
        self.history.append(entropy)
        # probe and relative: each iteration's update needs its own measurement
        self.state_entropy = self.state_reference = None
        self._set_target()
        stepwise = self.steps_per_optimizer_step
        if self.controller is not None and not stepwise and self.target is not None:
            self.controller.update(entropy, self.target)

    def observe_probe(self, entropies: list[float]) -> None:
        """The entropies of the batches the initial policy sampled before the first update
        (``controller.target_probe`` of them, drawn by the trainer), each ``batch_entropy`` of
        one batch (so by the controller's estimator): averaged into a ratio target."""
        self.probe = list(entropies)

    def observe_states(self, entropy: float, reference: float | None = None) -> None:
        """What the iteration's update then tracks, measured by the caller before it:
        ``controller.estimator: probe``, the policy being trained's entropy on the probe
        batches' states this iteration (the mean of their ``batch_entropy``, as the probe
        measured them); ``relative``, its exact entropy on the iteration's batch over the base
        model's there (``entrogym.algos.entropy.relative_entropy``), with ``reference`` the
        base model's mean exact entropy there in nats (``lever_target``); ``input_dependence``,
        the mutual information of its probe tasks and its responses
        (``entrogym.algos.input_dependence``)."""
        if self.tracks_relative and reference is None:
            raise ValueError(
                "controller.estimator relative: hand observe_states the base model's mean "
                "entropy on the batch (reference), which the lever's target is in"
            )
        self.state_entropy, self.state_reference = entropy, reference

    def observe_step(self, entropy: float) -> None:
        """The entropy measured during one optimizer step, for a controller fed every step
        (it waits until the target is known)."""
        if self.target is not None:
            self.controller.update(entropy, self.target)

    def reference(self, entropy: float) -> None:
        """The iteration's entropy, as soon as the update knows it (before its first optimizer
        step): a target taken from the first iteration alone is set from it then, so a
        controller fed every step and the lever know it from the first step on."""
        if not self.history:
            self._set_target(entropy)

    def _set_target(self, first: float | None = None) -> None:
        """The target, once known: from ``first`` (the first iteration's entropy, before it
        ends) or from the recorded iterations' entropies."""
        if self.target is not None:
            return
        params = self.feedback
        if params is not None and params.target_unit == "nats":
            self.target = params.target
        else:
            needed = 1 if params is None else params.target_iterations
            seen = self.history if first is None else [first]
            if len(seen) < needed:
                return
            # probe batches and the first iterations weigh one batch each
            measured = self.probe + seen[:needed]
            reference = sum(measured) / len(measured)
            if self.tracks_input_dependence and not reference > 0:
                # an estimate near 0 may come out negative: no ratio of it is a target
                raise ValueError(
                    f"controller.estimator input_dependence: the first iterations measured "
                    f"{reference:.4g} nats, so a ratio target of it means nothing; set "
                    "algo.controller.target_unit nats and the target in nats"
                )
            # no target: the first entropy, to report the drift from it
            self.target = reference if params is None else params.target * reference

    @property
    def lever_target(self) -> float | None:
        """The target a lever's in-loss push compares a micro-batch's exact entropy with, in
        nats (``extra_loss``'s ``target``): ``target`` itself, except for ``estimator
        relative``, whose ratio target becomes nats on the iteration's batch, ``target`` times
        the base model's mean entropy there."""
        if self.target is None or not self.tracks_relative:
            return self.target
        if self.state_reference is None:  # read outside an update: no batch to convert on
            return None
        return self.target * self.state_reference

    # ----- reporting and checkpoints ----------------------------------------------------------

    def metrics(self) -> dict[str, float | None]:
        """The clip range's upper side and the lever's coefficient under its own name."""
        out: dict[str, float | None] = {"eps_high": self.clip_range()[1]}
        if self.lever.coefficient is not None:
            out[self.lever.coefficient.name] = self.coefficient
        return out

    def target_metrics(self, entropy: float | None) -> dict[str, float | None]:
        """``entropy_target`` and ``entropy_error`` = H / target - 1 (positive above target)."""
        if self.target is None or entropy is None:
            return {"entropy_target": self.target, "entropy_error": None}
        return {"entropy_target": self.target, "entropy_error": entropy / self.target - 1.0}

    def state_dict(self) -> dict[str, Any]:
        return {
            "lever": self.config.lever.name,
            "controller": None if self.controller is None else self.config.controller.name,
            "target": self.target,
            "history": list(self.history),
            "probe": list(self.probe),
            "controller_state": None if self.controller is None else self.controller.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``state_dict()``; a state of another lever or controller is refused."""
        mine = self.state_dict()
        missing = [key for key in mine if key not in state]
        if missing:
            raise ValueError(
                f"control state: the checkpoint lacks {', '.join(missing)}; resume from a "
                "checkpoint this entrogym wrote"
            )
        for key in ("lever", "controller"):
            if state[key] != mine[key]:
                raise ValueError(
                    f"control state: the checkpoint holds {key} {state[key]!r}, this algorithm "
                    f"uses {mine[key]!r}; resume with the algorithm the run was started with"
                )
        self.target, self.history = state["target"], list(state["history"])
        self.probe = list(state["probe"])
        if self.controller is not None and state["controller_state"] is not None:
            self.controller.load_state_dict(state["controller_state"])
