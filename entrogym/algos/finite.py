"""Every number finite: the one check every option and knob of a float type passes.

An option given as ``inf`` or ``nan`` (``--algo.controller.kp inf``, ``lr: .nan`` in a YAML
file) would pass range checks written as ``value >= 0`` and then stop training without a
word: a controller at an infinite gain skips every step, a lever samples at T = inf. So every
float value of a config dataclass is checked here, by its field, wherever configs are read: the
parts' knobs (``Registry.params``), an algorithm's own settings (``AlgorithmConfig``) and every
command's options (``entrogym.commands.options.config_from``). A field whose documentation
names infinity as a value (``upper_slack``: ``inf`` is a one-sided constraint) says so in its
metadata, ``field(default=..., metadata=ALLOWS_INF)``; NaN is never a value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

ALLOWS_INF = {"allows_inf": True}  # dataclass field metadata: +-inf is a documented value


def check_finite_values(values: Mapping[str, Any], cls: type, prefix: str = "") -> None:
    """Every float in ``values`` (field name -> value, or a list of values) of the dataclass
    ``cls`` is finite, unless its field allows infinity; a ValueError names the first other one
    as ``{prefix}{name}``."""
    allowed = (
        {f.name for f in fields(cls) if f.metadata.get("allows_inf")}
        if is_dataclass(cls)
        else set()
    )
    for name, value in values.items():
        for item in value if isinstance(value, list | tuple) else (value,):
            if not isinstance(item, float) or math.isfinite(item):
                continue
            if name in allowed and not math.isnan(item):
                continue
            raise ValueError(f"{prefix}{name} must be a finite number, got {item}")


def check_finite_fields(config: Any, prefix: str = "") -> None:
    """:func:`check_finite_values` of a dataclass instance's own fields."""
    check_finite_values(
        {f.name: getattr(config, f.name) for f in fields(config)}, type(config), prefix
    )
