"""Controllers on scripted entropy sequences, each against an independent statement of its rule:
the paper's listing, ADAPO's rule, TRL's adaptive entropy update, and the PI law."""

from __future__ import annotations

import json
import random

import pytest

from entrogym.algos import CONTROLLERS, Coefficient
from entrogym.algos.controllers import (
    AdditiveParams,
    ControllerParams,
    MultiplicativeParams,
    PaperParams,
    PIParams,
)

ZETA_R = Coefficient("zeta", init=1e-3, min=1e-4, max=0.05)
ZETA_D = Coefficient("zeta", init=1e-3, min=1e-3, max=10.0)
EPS = Coefficient("eps_high", init=0.28, min=0.2, max=0.32, signed=False)
KL = Coefficient("kl_coef", init=1.0, min=0.0, max=10.0, signed=False)


def make(name: str, coefficient: Coefficient, **knobs):
    params = CONTROLLERS.params(name, knobs)
    return CONTROLLERS.get(name)(params, coefficient, coefficient.init)


def steps(controller, entropies, target=1.0) -> list[float]:
    out = []
    for h in entropies:
        controller.update(h, target)
        out.append(controller.applied())
    return out


# ---------------------------------------------------------------- paper (appendix listing)


def _listing(zeta, h, target, zeta_min, zeta_max, factor=2.0):
    """The appendix listing 'Adaptive controller', written out independently."""
    if h > target:
        if zeta >= 0:
            zeta = zeta / factor
            return -zeta_min if zeta < zeta_min else zeta
        return max(-zeta_max, zeta * factor)
    if h < target:
        if zeta >= 0:
            return min(zeta_max, zeta * factor)
        zeta = zeta / factor
        return zeta_min if zeta > -zeta_min else zeta
    return zeta


def test_paper_controller_scripted_sequence():
    c = make("paper", ZETA_R)
    # below target: double until the cap
    assert steps(c, [0.5] * 8)[:5] == [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]
    assert c.applied() == 0.05
    # above target: halve ... then flip sign to -min
    c = make("paper", ZETA_R, init=4e-4)
    assert steps(c, [2.0] * 3) == [2e-4, 1e-4, -1e-4]
    # still above: a negative zeta doubles in magnitude; below again: halves, flips to +min
    assert steps(c, [2.0] * 2) == [-2e-4, -4e-4]
    assert steps(c, [0.1] * 3) == [-2e-4, -1e-4, 1e-4]
    assert steps(c, [1.0]) == [1e-4]  # equal: unchanged
    c = make("paper", ZETA_D, init=-6.0)
    assert steps(c, [2.0]) == [-10.0]


def test_paper_controller_matches_the_listing_on_random_sequences():
    rng = random.Random(7)
    for factor in (2.0, 1.25, 1.0):
        c = make("paper", ZETA_D, factor=factor)
        zeta = 1e-3
        for _ in range(500):
            h = rng.choice([0.5, 1.0, 1.5])
            zeta = _listing(zeta, h, 1.0, 1e-3, 10.0, factor)
            c.update(h, 1.0)
            assert c.applied() == zeta
            assert 1e-3 <= abs(zeta) <= 10.0 or factor == 1.0


def test_paper_controller_needs_a_signed_coefficient_and_a_valid_range():
    with pytest.raises(ValueError, match="cannot be negative"):
        make("paper", KL)
    with pytest.raises(ValueError, match="0 < min <= max"):
        make("paper", ZETA_R, min=0.0)
    with pytest.raises(ValueError, match="algo.controller.factor must be >= 1"):
        PaperParams(factor=0.5)
    with pytest.raises(ValueError, match="outside the coefficient's range"):
        make("paper", ZETA_R, init=0.5)


# ---------------------------------------------------------------- multiplicative (ADAPO)


def test_multiplicative_controller_follows_adapo():
    c = make("multiplicative", EPS)
    assert steps(c, [0.5, 0.5]) == pytest.approx([0.28 * 1.05, 0.28 * 1.05**2])
    assert steps(c, [0.5, 0.5]) == pytest.approx([0.32, 0.32])  # capped
    values = steps(c, [2.0] * 10)
    assert values[0] == pytest.approx(0.32 * 0.95) and values[-1] == pytest.approx(0.2)
    assert steps(c, [1.0]) == pytest.approx([0.2])  # equal: unchanged
    with pytest.raises(ValueError, match=r"^algo.controller.up must be >= 1, got 0.9$"):
        MultiplicativeParams(up=0.9)
    with pytest.raises(ValueError, match=r"^algo.controller.down must be in \(0, 1\], got 0$"):
        MultiplicativeParams(down=0)


# ---------------------------------------------------------------- additive (TRL)


class TRLAdaptiveEntropy:
    """TRL 1.16 GRPOTrainer's use_adaptive_entropy state, as its loss computation runs it once
    per optimizer step: the coefficient applied in a step is the one left by the previous step,
    gated on the previous step's entropy (inf before the first); after the step's loss the
    coefficient moves by +delta if the step's entropy <= target, else -delta, clamped."""

    def __init__(self, coef, target, delta, lo, hi):
        self.coef, self.target, self.delta, self.lo, self.hi = coef, target, delta, lo, hi
        self.last = float("inf")

    def step(self, entropy: float) -> float:
        applied = self.coef if self.last <= self.target else 0.0
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.hi)
        else:
            self.coef = max(self.coef - self.delta, self.lo)
        self.last = entropy
        return applied


def test_additive_controller_with_gate_reproduces_trl_step_for_step():
    rng = random.Random(3)
    entropies = [rng.uniform(0.1, 0.4) for _ in range(300)]
    trl = TRLAdaptiveEntropy(0.0, 0.25, 0.005, 0.0, 1.0)
    mine = make("additive", KL, init=0.0, min=0.0, max=1.0, delta=0.005, gate=True)
    gated = 0
    for h in entropies:
        applied = mine.applied()  # what the lever uses in this step
        assert applied == trl.step(h)
        gated += applied == 0.0 and mine.value > 0
        mine.update(h, 0.25)
    assert mine.value == trl.coef > 0 and gated > 10  # both the ramp and the gate were hit


def test_additive_controller_without_gate_and_bounds():
    c = make("additive", KL, init=0.5, min=0.4, max=0.52, delta=0.01)
    assert steps(c, [1.0]) == pytest.approx([0.51])  # equal counts as below (TRL's <=)
    assert steps(c, [0.5, 0.5]) == pytest.approx([0.52, 0.52])  # below: +delta, capped
    assert steps(c, [2.0] * 20)[-1] == pytest.approx(0.4)  # above: -delta, floored
    with pytest.raises(ValueError, match="algo.controller.delta must be > 0"):
        AdditiveParams(delta=0.0)


# ---------------------------------------------------------------- pi


def test_pi_controller_follows_the_pi_law_inside_its_range():
    c = make("pi", ZETA_D, kp=0.2, ki=0.05, max=1.0, init=0.0)
    integral = 0.0
    for h in (0.8, 0.9, 1.1, 0.95):
        e = (1.0 - h) / 1.0
        integral += e
        c.update(h, 1.0)
        assert c.applied() == pytest.approx(0.0 + 1.0 * (0.2 * e + 0.05 * integral))


def test_pi_controller_changes_sign_and_saturates_with_anti_windup():
    c = make("pi", ZETA_D, kp=0.5, ki=0.5, max=0.2, init=0.0)
    assert c.bounds() == (-0.2, 0.2)  # a signed lever: free to change sign within [-max, max]
    assert steps(c, [2.0])[0] < 0  # entropy above target: pushed down, below zero
    assert steps(c, [0.0] * 30)[-1] == 0.2  # far below for long: saturated at max
    # anti-windup: the integral sits where the output is exactly at the bound, so one update
    # past the target brings the coefficient off the bound at once
    assert steps(c, [1.1])[0] < 0.2
    without = make("pi", ZETA_D, kp=0.5, ki=0.5, max=0.2, init=0.0)
    without.integral = 30.0  # what an unclamped integral would have reached
    without.update(1.1, 1.0)
    assert without.applied() == 0.2  # a wound-up integral keeps it pinned


def test_pi_controller_dead_band_and_one_sided_range():
    c = make("pi", ZETA_D, kp=1.0, ki=0.0, max=1.0, init=0.0, deadband=0.1)
    assert steps(c, [0.95, 1.05]) == [0.0, 0.0]  # within +-10 %: no action
    assert steps(c, [0.7])[0] == pytest.approx(0.2)  # 30 % error - 10 % band
    one_sided = make("pi", ZETA_D, kp=1.0, ki=0.0, max=1.0, min=0.0, init=0.0)
    assert steps(one_sided, [1.5]) == [0.0]  # min 0: never negative
    unsigned = make("pi", KL, kp=1.0, ki=0.0, init=1.0)
    assert unsigned.bounds() == (0.0, 10.0)  # a coefficient that cannot be negative
    with pytest.raises(ValueError, match=r"^algo.controller.kp must be >= 0, got -1.0$"):
        PIParams(kp=-1.0)
    with pytest.raises(ValueError, match=r"^algo.controller.ki must be >= 0, got nan$"):
        PIParams(ki=float("nan"))
    with pytest.raises(ValueError, match="algo.controller.deadband"):
        PIParams(deadband=1.0)


def test_common_knobs_are_checked():
    with pytest.raises(ValueError, match="algo.controller.target must be > 0"):
        ControllerParams(target=0.0)
    with pytest.raises(ValueError, match="algo.controller.min must be <= algo.controller.max"):
        ControllerParams(min=1.0, max=0.5)
    with pytest.raises(ValueError, match="algo.controller.max must be > 0"):
        ControllerParams(max=-1.0)


def test_fixed_controller_holds_its_value():
    c = make("fixed", KL, init=2.5)
    assert steps(c, [0.1, 5.0, 1.0]) == [2.5, 2.5, 2.5]


@pytest.mark.parametrize("name", ["paper", "multiplicative", "additive", "pi", "fixed"])
def test_state_round_trips_through_json(name):
    coefficient = EPS if name == "multiplicative" else ZETA_D
    c = make(name, coefficient)
    for h in (0.5, 1.5, 0.7):
        c.update(h, 1.0)
    state = json.loads(json.dumps(c.state_dict()))  # checkpoints hold it as JSON
    d = make(name, coefficient)
    d.load_state_dict(state)
    assert d.state_dict() == c.state_dict()
    c.update(0.6, 1.0)
    d.update(0.6, 1.0)
    assert d.applied() == c.applied()
