"""``entrogym train --help`` groups its options: run, rollout, learner, algorithm, eval."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import pytest

from entrogym.commands.options import make_parser
from entrogym.commands.train import OPTION_GROUPS, build_parser
from entrogym.train.config import TrainConfig


def _sections(text: str) -> dict[str, str]:
    """Help text split at its section headings (a line ending in ':' at column 0)."""
    parts = re.split(r"^([a-z][^\n]*):\n", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_every_option_is_in_exactly_one_section_in_the_run_rollout_learner_order():
    sections = _sections(build_parser().format_help())
    titles = [t for t in sections if t.split(":")[0] in ("run", "rollout", "learner",
                                                          "algorithm", "eval")]  # fmt: skip
    assert [t.split(":")[0] for t in titles] == ["run", "rollout", "learner", "algorithm", "eval"]
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-") + " "
        holders = [
            t
            for t in titles
            if re.search(rf"^  {re.escape(flag)}", sections[t], re.M)
            or re.search(rf"^  {re.escape(flag.strip())}$", sections[t], re.M)
        ]
        assert len(holders) == 1, (f.name, holders)
        assert f.name in OPTION_GROUPS[holders[0]]


def test_the_grouped_parser_still_parses_every_section():
    from entrogym.commands.train import parse_config

    c = parse_config(["--out", "runs/x", "--lr", "0.001", "--eval-every", "3",
                      "--eval-env", "entrogym/Arithmetic-v0", "--tasks-per-iter", "2",
                      "--algo", "grpo"])  # fmt: skip
    assert (c.out, c.lr, c.eval_every, c.tasks_per_iter, c.algo.name) == (
        "runs/x", 0.001, 3, 2, "grpo")  # fmt: skip


@dataclass
class Two:
    """Args:
    a: one.
    b: two.
    """

    a: int = 1
    b: int = 2


def test_a_field_left_out_of_the_groups_is_refused():
    with pytest.raises(ValueError, match=r"in no group \['b'\]"):
        make_parser("x", "x", Two, groups={"first": ("a",)})
    with pytest.raises(ValueError, match=r"unknown \['c'\]"):
        make_parser("x", "x", Two, groups={"first": ("a", "b", "c")})
    with pytest.raises(ValueError, match=r"in two groups \['a'\]"):
        make_parser("x", "x", Two, groups={"first": ("a", "b"), "second": ("a",)})
