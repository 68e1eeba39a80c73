"""``entrogym theory [--json]``: the numerical checks of Cor. 1, Thm 2, Thm 3 and the softmax fix;
exit code 1 when Cor. 1's correlation is below 0.99 or Thm 2's bound is violated."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from entrogym.commands.options import make_parser, parse_options, run_command

PROG = "entrogym theory"


@dataclass
class TheoryOptions:
    """Sample sizes of the checks.

    Args:
        n_policies: Cor. 1: random tabular policies (>= 200).
        n_pairs: Thm 2: policy pairs (>= 1000).
        n_bf16: Thm 3: bf16-rounded samples.
        seed: seed of every check.
        json: print one JSON object instead of the table.
    """

    n_policies: int = 500
    n_pairs: int = 1500
    n_bf16: int = 2_000_000
    seed: int = 0
    json: bool = False

    def __post_init__(self) -> None:
        if self.n_policies < 200 or self.n_pairs < 1000:
            raise ValueError(
                f"n_policies must be >= 200 and n_pairs >= 1000 (got {self.n_policies}, "
                f"{self.n_pairs}): fewer samples would not test the claims"
            )
        if self.n_bf16 < 1:
            raise ValueError(f"n_bf16 must be >= 1, got {self.n_bf16}")


def build_parser() -> Any:
    return make_parser(PROG, __doc__.split("\n")[0], TheoryOptions)


def cli(argv: list[str]) -> int:
    def body() -> int:
        from entrogym.theory.checks import print_human, run_checks

        opts = parse_options(build_parser(), argv, TheoryOptions)
        result = run_checks(opts.n_policies, opts.n_pairs, opts.n_bf16, opts.seed)
        if opts.json:
            print(json.dumps(result))
        else:
            print_human(result)
        return 0 if result["passed"] else 1

    return run_command(PROG, body)
