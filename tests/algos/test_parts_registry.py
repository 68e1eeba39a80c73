"""The registries of an algorithm's parts: built-ins, knobs per part, checkpoints, and parts
of a user's own reached by name or as ``module:name``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from entrogym.algos import (
    ALGORITHMS,
    CONTROLLERS,
    LEVERS,
    MASKS,
    PART_REGISTRIES,
    Coefficient,
    EntropyControl,
    Lever,
    build_algorithm,
    entropy_bonus_loss,
    register_lever,
    repo_d,
    repo_r,
)


def test_every_builtin_part_is_registered_and_presets_name_them():
    assert set(LEVERS.names()) >= {"none", "repo-r", "repo-d", "entropy-bonus", "clip-high",
                                   "clip-cov", "kl-cov", "entropic", "aepo"}  # fmt: skip
    assert set(CONTROLLERS.names()) == {
        "fixed", "paper", "multiplicative", "additive", "pi", "entropic", "aepo"
    }  # fmt: skip
    assert set(MASKS.names()) >= {"all", "high-entropy"}
    for name, preset in ALGORITHMS.items():
        for kind, part in preset.parts.items():
            if part is not None:
                assert part.name in PART_REGISTRIES[kind], (name, kind)
        control = EntropyControl(preset)
        assert (control.controller is None) == (preset.lever.name == "none"), name
    # needs_entropy is read from the parts in use (REPO's depends on its centering)
    assert EntropyControl(ALGORITHMS["grpo-entropy-bonus"]).needs_entropy
    sampled = {"name": "repo-r", "controller": {"estimator": "sampled"}}
    assert not EntropyControl(build_algorithm(sampled)).needs_entropy
    assert EntropyControl(ALGORITHMS["repo-r"]).needs_entropy  # it tracks the exact entropy
    assert EntropyControl(ALGORITHMS["grpo-adaptive-entropy"]).needs_entropy  # per-step H


def test_each_lever_shapes_the_update_as_its_formula_says():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(4, generator=g)
    lp = -torch.rand(4, 3, generator=g) * 3
    ent, mask = torch.rand(4, 3, generator=g), torch.ones(4, 3)
    r, d = EntropyControl(ALGORITHMS["repo-r"]), EntropyControl(ALGORITHMS["repo-d"])
    torch.testing.assert_close(r.lever.shape_advantages(adv, lp, None, 1e-3), repo_r(adv, lp, 1e-3))
    torch.testing.assert_close(d.lever.shape_advantages(adv, lp, None, 1e-3), repo_d(adv, lp, 1e-3))
    bonus = EntropyControl(ALGORITHMS["grpo-entropy-bonus"])
    torch.testing.assert_close(
        bonus.lever.extra_loss(lp, ent, mask, 1e-3), entropy_bonus_loss(ent, mask, 1e-3)
    )
    with pytest.raises(ValueError, match="needs score\\(\\) to return entropies"):
        bonus.lever.extra_loss(lp, None, mask, 1e-3)
    none = EntropyControl(ALGORITHMS["grpo"])
    assert none.lever.shape_advantages(adv, lp, None, None) is adv
    assert none.lever.extra_loss(lp, ent, mask, None) is None
    adapo = EntropyControl(ALGORITHMS["adapo"])
    adapo.observe(1.0)  # sets the target
    adapo.observe(0.5)  # entropy fell: the upper clip opens
    assert adapo.clip_range() == (0.2, pytest.approx(0.28 * 1.05))
    assert adapo.metrics() == {"eps_high": pytest.approx(0.294)}
    assert r.metrics() == {"eps_high": 0.2, "zeta": 1e-3}
    assert bonus.metrics() == {"eps_high": 0.2, "beta": 1e-3}
    assert EntropyControl(ALGORITHMS["kl-cov"]).metrics() == {"eps_high": None, "kl_coef": 1.0}


def test_knobs_belong_to_parts_and_wrong_ones_are_named():
    assert (
        build_algorithm({"name": "repo-r", "controller": {"max": 0.5}}).controller.params.max == 0.5
    )
    with pytest.raises(
        ValueError, match="algo.controller.kp is not a knob of controller 'paper'"
    ) as e:
        build_algorithm({"name": "repo-r", "controller": {"kp": 0.5}})
    assert (
        "its knobs: target, target_unit, target_iterations, target_probe, step, estimator, init, min, max, factor"
        in str(e.value)
    )
    assert "controllers that have it: pi" in str(e.value)
    with pytest.raises(ValueError, match="preset 'grpo' has no lever, so nothing to control") as e:
        build_algorithm({"name": "grpo", "controller": "pi"})
    assert "presets with a lever: repo-r, repo-d, adapo" in str(e.value)
    with pytest.raises(ValueError, match="unknown controller 'pid'; registered controllers: fixed"):
        build_algorithm({"name": "repo-d", "controller": "pid"})
    with pytest.raises(ValueError, match="unknown lever 'x'; registered levers: none, repo-r"):
        build_algorithm({"name": "repo-d", "lever": "x"})
    with pytest.raises(ValueError, match="algo.controller.kp: expected float, got '0.3'"):
        build_algorithm({"name": "repo-d", "controller": {"name": "pi", "kp": "0.3"}})
    with pytest.raises(ValueError, match="algo.controller.min must be <= algo.controller.max"):
        build_algorithm({"name": "repo-d", "controller": {"name": "pi", "min": 1.0, "max": 0.5}})


def test_a_lever_added_or_swapped_keeps_a_controller():
    added = build_algorithm({"name": "grpo", "lever": "repo-d"})
    assert (added.lever.name, added.controller.name) == ("repo-d", "paper")  # lever's default
    cov = build_algorithm({"name": "grpo", "lever": "kl-cov"})
    assert cov.controller.name == "fixed"
    swapped = build_algorithm({"name": "repo-d", "lever": "repo-r"})
    assert swapped.controller == ALGORITHMS["repo-d"].controller  # the preset's controller
    assert EntropyControl(swapped).controller.bounds() == (-0.05, 0.05)  # the new lever's range
    renamed = build_algorithm({"name": "repo-d", "controller": {"name": "pi", "kp": 0.3}})
    assert renamed.controller.params.kp == 0.3 and renamed.controller.params.ki == 0.1
    removed = build_algorithm({"name": "repo-d", "lever": "none"})
    assert removed.controller is None


def test_a_lever_suggests_its_controller_knobs_and_the_user_overrides_them():
    chosen = build_algorithm({"name": "repo-r", "controller": "pi"})
    assert LEVERS.get("repo-r").controller_knobs["pi"] == {"kp": 1.0, "ki": 1.0, "max": 2.0}
    p = chosen.controller.params
    assert (p.kp, p.ki, p.max, p.deadband) == (1.0, 1.0, 2.0, 0.0)
    assert EntropyControl(chosen).controller.bounds() == (-2.0, 2.0)
    mixed = build_algorithm({"name": "repo-r", "controller": {"name": "pi", "kp": 0.3}})
    assert (mixed.controller.params.kp, mixed.controller.params.ki) == (0.3, 1.0)
    # a lever without suggestions keeps the controller's own defaults
    plain = build_algorithm({"name": "repo-d", "controller": "pi"}).controller.params
    assert (plain.kp, plain.ki, plain.max) == (0.3, 0.1, None)
    # the preset's own controller, with knobs changed, takes no suggestion
    paper = build_algorithm({"name": "repo-r", "controller": {"factor": 1.5}}).controller
    assert (paper.name, paper.params.max) == ("paper", None)


@pytest.mark.parametrize("preset", list(ALGORITHMS))
def test_control_state_round_trips_through_a_checkpoint(preset):
    control = EntropyControl(ALGORITHMS[preset])
    for entropy in (1.25, 1.0, 0.8):  # the controller moves, so its state is not the start's
        control.observe(entropy)
    state = json.loads(json.dumps(control.state_dict()))  # checkpoints store it as JSON
    again = EntropyControl(ALGORITHMS[preset])
    again.load_state_dict(state)
    assert again.state_dict() == control.state_dict()
    assert (again.target, again.history, again.coefficient) == (
        control.target, control.history, control.coefficient
    )  # fmt: skip
    again.observe(0.5)  # resumes steering from the loaded state
    control.observe(0.5)
    assert again.state_dict() == control.state_dict()


def test_control_state_without_its_lever_is_refused_in_one_line():
    state = EntropyControl(ALGORITHMS["repo-r"]).state_dict()
    del state["lever"]
    with pytest.raises(ValueError, match="the checkpoint lacks lever; resume from a checkpoint"):
        EntropyControl(ALGORITHMS["repo-r"]).load_state_dict(state)


def test_state_of_another_lever_or_controller_is_refused():
    state = EntropyControl(ALGORITHMS["repo-r"]).state_dict()
    with pytest.raises(ValueError, match="holds lever 'repo-r', this algorithm uses 'clip-high'"):
        EntropyControl(ALGORITHMS["adapo"]).load_state_dict(state)
    pi = build_algorithm({"name": "repo-r", "controller": "pi"})
    with pytest.raises(ValueError, match="holds controller 'paper', this algorithm uses 'pi'"):
        EntropyControl(pi).load_state_dict(state)


def test_a_new_lever_is_one_class_and_one_registry_line():
    try:

        @register_lever("test-fixed-push")
        class FixedPush(Lever):
            coefficient = Coefficient("push", init=0.5, min=0.0, max=1.0, signed=False)
            default_controller = "fixed"

            def shape_advantages(self, advantages, logprobs, entropies, coef):
                return repo_d(advantages, logprobs, coef)

        cfg = build_algorithm({"name": "grpo", "lever": "test-fixed-push"})
        control = EntropyControl(cfg)
        adv, lp = torch.ones(2), torch.full((2, 1), -2.0)
        shaped = control.lever.shape_advantages(adv, lp, None, control.coefficient)
        torch.testing.assert_close(shaped, torch.full((2, 1), 2.0))
        assert control.metrics() == {"eps_high": 0.2, "push": 0.5}
        with pytest.raises(ValueError, match="already registered"):
            register_lever("repo-r")(FixedPush)
        with pytest.raises(ValueError, match="takes a subclass of Lever"):
            register_lever("test-not-a-lever")(dict)
    finally:
        LEVERS._parts.pop("test-fixed-push", None)


def test_a_part_from_a_users_module_is_reached_as_module_colon_name(tmp_path: Path, monkeypatch):
    (tmp_path / "my_levers.py").write_text(
        textwrap.dedent(
            """
            from entrogym.algos import Coefficient, Lever, register_lever

            @register_lever("half-bonus")
            class HalfBonus(Lever):
                coefficient = Coefficient("beta", init=0.1, min=0.0, max=1.0, signed=False)

            class Unregistered(Lever):
                coefficient = Coefficient("gamma", init=0.2, min=0.0, max=1.0, signed=False)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        by_name = build_algorithm({"name": "grpo", "lever": "my_levers:half-bonus"})
        assert EntropyControl(by_name).metrics()["beta"] == 0.1
        by_class = build_algorithm({"name": "grpo", "lever": "my_levers:Unregistered"})
        assert EntropyControl(by_class).metrics()["gamma"] == 0.2
        with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
            build_algorithm({"name": "grpo", "lever": "no_such_module:x"})
        with pytest.raises(
            ValueError, match="lever 'my_levers:nothing': module 'my_levers' has no 'nothing'"
        ):
            build_algorithm({"name": "grpo", "lever": "my_levers:nothing"})
    finally:
        for key in ("half-bonus", "my_levers:half-bonus", "my_levers:Unregistered"):
            LEVERS._parts.pop(key, None)
