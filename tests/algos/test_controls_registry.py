"""The entropy-control registry: one class per control, knobs per preset, old checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from entrogym.algos import (
    ALGORITHMS,
    CONTROLS,
    AlgorithmConfig,
    EntropyControl,
    entropy_bonus_loss,
    get_algorithm,
    make_control,
    preset_knobs,
    register_control,
    repo_d,
    repo_r,
)

# What EntropyControl.state_dict() wrote before the registry (ae5ef0f), as checkpoints hold it.
OLD_STATES = {
    "grpo": {"target": 1.25, "history": [1.25, 1.1], "zeta": None, "eps_high": None},
    "repo-r": {
        "target": 1.25,
        "history": [1.25, 1.1, 1.0],
        "zeta": {"zeta_min": 1e-4, "zeta_max": 0.05, "zeta": 4e-3},
        "eps_high": None,
    },
    "repo-d": {
        "target": 0.5,
        "history": [0.5, 0.7],
        "zeta": {"zeta_min": 1e-3, "zeta_max": 10.0, "zeta": -2e-3},
        "eps_high": None,
    },
    "grpo-entropy-bonus": {
        "target": 0.9,
        "history": [0.9, 0.8],
        "zeta": {"zeta_min": 1e-3, "zeta_max": 10.0, "zeta": 8e-3},
        "eps_high": None,
    },
    "adapo": {
        "target": 2.0,
        "history": [2.0, 1.9],
        "zeta": None,
        "eps_high": {"eps_high": 0.2940, "lower": 0.2, "upper": 0.32, "up": 1.05, "down": 0.95},
    },
}


def test_every_builtin_control_is_registered_and_named_by_its_presets():
    assert set(CONTROLS) >= {"none", "repo-r", "repo-d", "adapo", "entropy-bonus"}
    assert {preset.control for preset in ALGORITHMS.values()} <= set(CONTROLS)
    for name, preset in ALGORITHMS.items():
        control = make_control(preset)
        assert type(control) is CONTROLS[preset.control] and control.name == preset.control, name
    assert ALGORITHMS["grpo"].control == "none"
    # needs_entropy is read from the control in use (REPO's depends on repo_centering)
    assert make_control(ALGORITHMS["grpo-entropy-bonus"]).needs_entropy
    assert make_control(ALGORITHMS["repo-r"]).needs_entropy is False


def test_each_control_shapes_the_update_as_its_formula_says():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(4, generator=g)
    lp = -torch.rand(4, 3, generator=g) * 3
    ent, mask = torch.rand(4, 3, generator=g), torch.ones(4, 3)
    r, d = make_control(ALGORITHMS["repo-r"]), make_control(ALGORITHMS["repo-d"])
    torch.testing.assert_close(r.shape_advantages(adv, lp), repo_r(adv, lp, 1e-3))
    torch.testing.assert_close(d.shape_advantages(adv, lp), repo_d(adv, lp, 1e-3))
    bonus = make_control(ALGORITHMS["grpo-entropy-bonus"])
    torch.testing.assert_close(bonus.extra_loss(lp, ent, mask), entropy_bonus_loss(ent, mask, 1e-3))
    with pytest.raises(ValueError, match="needs score\\(\\) to return entropies"):
        bonus.extra_loss(lp, None, mask)
    none = make_control(ALGORITHMS["grpo"])
    assert none.shape_advantages(adv, lp) is adv and none.extra_loss(lp, ent, mask) is None
    adapo = make_control(ALGORITHMS["adapo"])
    adapo.observe(1.0)  # sets the target
    adapo.observe(0.5)  # entropy fell: the upper clip opens
    assert adapo.upper_clip == pytest.approx(0.28 * 1.05) and adapo.lower_clip == 0.2
    assert adapo.metrics() == {"eps_high": pytest.approx(0.294)}
    assert r.metrics() == {"eps_high": 0.2, "zeta": 1e-3}
    assert bonus.metrics() == {"eps_high": 0.2, "beta": 1e-3}


def test_knobs_are_the_common_ones_plus_the_controls_own():
    assert "zeta_max" in preset_knobs("repo-r") and "zeta_max" not in preset_knobs("grpo")
    assert "eps_high_up" in preset_knobs("adapo") and "zeta_init" not in preset_knobs("adapo")
    assert "minibatch_size" in preset_knobs("grpo")
    assert get_algorithm("repo-r", zeta_max=0.5).zeta_max == 0.5
    with pytest.raises(ValueError, match="'zeta_max' does not apply to preset 'grpo'") as err:
        get_algorithm("grpo", zeta_max=0.5)
    assert "its knobs: advantage, epochs, minibatch_size" in str(err.value)
    with pytest.raises(ValueError, match="'zeta_maxx' is not a knob of preset 'repo-r'") as err:
        get_algorithm("repo-r", zeta_maxx=0.5)
    assert "zeta_init, zeta_min, zeta_max" in str(err.value)
    with pytest.raises(ValueError, match="zeta_min <= zeta_max"):
        get_algorithm("repo-r", zeta_min=1.0, zeta_max=0.5)  # values checked by the control
    with pytest.raises(ValueError, match="known presets"):
        preset_knobs("ppo")


def test_an_unregistered_control_lists_the_registered_ones():
    with pytest.raises(ValueError, match="'repo-x' is not a registered entropy control") as err:
        AlgorithmConfig("mine", control="repo-x")
    assert "none, repo-r, repo-d, entropy-bonus, adapo" in str(err.value)


@pytest.mark.parametrize("preset", list(OLD_STATES))
def test_control_state_of_old_checkpoints_loads(preset):
    old = json.loads(json.dumps(OLD_STATES[preset]))  # checkpoints store it as JSON
    control = make_control(ALGORITHMS[preset])
    control.load_state_dict(old)
    assert control.target == old["target"] and control.history == old["history"]
    if old["zeta"] is not None:
        assert control.coefficient == old["zeta"]["zeta"]
    if old["eps_high"] is not None:
        assert control.upper_clip == old["eps_high"]["eps_high"]
    state = control.state_dict()  # the new format: the control's name and its own parts
    kept = {key: value for key, value in old.items() if value is not None}
    assert state == {"control": ALGORITHMS[preset].control, **kept}
    again = make_control(ALGORITHMS[preset])
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.state_dict() == state
    control.observe(old["target"] - 0.5)  # resumes steering from the loaded state
    assert control.history[-1] == old["target"] - 0.5


def test_state_of_another_control_is_refused():
    state = make_control(ALGORITHMS["repo-r"]).state_dict()
    with pytest.raises(ValueError, match="holds 'repo-r' state, this preset uses 'adapo'"):
        make_control(ALGORITHMS["adapo"]).load_state_dict(state)


def test_a_new_control_is_one_class_and_one_registry_line():
    try:

        @register_control("test-fixed-repo-d")
        class FixedRepoD(EntropyControl):
            knobs = ("zeta_init",)

            def shape_advantages(self, advantages, logprobs):
                return repo_d(advantages, logprobs, self.config.zeta_init)

        cfg = AlgorithmConfig("fixed", advantage="grpo", control="test-fixed-repo-d")
        assert "zeta_init" in cfg.knobs and "zeta_max" not in cfg.knobs
        control = make_control(cfg.with_overrides(zeta_init=0.5))
        adv, lp = torch.ones(2), torch.full((2, 1), -2.0)
        torch.testing.assert_close(control.shape_advantages(adv, lp), torch.full((2, 1), 2.0))
        with pytest.raises(ValueError, match="already registered"):
            register_control("repo-r")(FixedRepoD)
        with pytest.raises(ValueError, match="EntropyControl subclass"):
            register_control("test-not-a-control")(dict)
    finally:
        CONTROLS.pop("test-fixed-repo-d", None)
