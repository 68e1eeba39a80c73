"""A new entropy lever in one class plus one registry line, trained with ``entrogym train``.

``SampledEntropyBonus`` adds an entropy bonus beta * H to the objective, with H's gradient
estimated from the sampled tokens alone (no full-vocabulary logits, so the LLM scorer does no
extra work). For a ~ pi, grad H = -E[log pi(a) grad log pi(a)], so the loss term is
beta * mean(sg(log pi) * log pi) over action tokens (sg = stop-gradient). In expectation it is
the paper's entropy bonus, as REPO-D is (appendix "Connection to entropy regularization");
unlike REPO-D it sits outside the clipped surrogate.

Its coefficient is ``beta``; any controller moves it (``--algo.controller pi``), and its knob
``scale`` shows how a lever takes knobs of its own. Any command reaches it as
``module:name``; the module only has to be importable::

    PYTHONPATH=examples entrogym train --algo grpo \\
        --algo.lever custom_entropy_control:sampled-entropy-bonus \\
        --algo.controller fixed --algo.controller.init 0.05

Run this file to do exactly that on SmolLM2-135M for 2 iterations (about a minute on 2 cores):
``python examples/custom_entropy_control.py --out runs/custom-lever``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from entrogym.algos import Coefficient, Lever, register_lever


def sampled_entropy_bonus_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """The loss term of + beta * H: beta * mean over action tokens of sg(log pi) * log pi.

    Its gradient, beta * log pi * grad log pi, is -beta times a one-sample estimate of grad H,
    so descending the loss ascends the entropy.
    """
    return beta * (logprobs.detach() * logprobs * mask).sum() / mask.sum()


@dataclass(frozen=True)
class SampledBonusParams:
    """Knobs of the sampled entropy bonus.

    Args:
        scale: multiplies beta (a knob of this lever alone, set with --algo.lever.scale).
    """

    scale: float = 1.0


@register_lever("sampled-entropy-bonus")  # the registry line: commands can now name it
class SampledEntropyBonus(Lever):
    """J + beta * H with a sampled-token gradient estimate of H."""

    Params = SampledBonusParams
    coefficient = Coefficient("beta", init=0.05, min=1e-3, max=1.0)
    default_controller = "fixed"  # for presets without a lever of their own (grpo)

    def extra_loss(
        self,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None,
        mask: torch.Tensor,
        coef: float | None,
        *,
        advantages: torch.Tensor | None = None,
        target: float | None = None,
    ) -> torch.Tensor:
        return sampled_entropy_bonus_loss(logprobs, mask, self.params.scale * coef)


def train_command(out: Path, model: str, iterations: int) -> list[str]:
    """The ``entrogym train`` command line that trains GRPO with this lever."""
    return [
        sys.executable, "-m", "entrogym", "train",
        "--algo", "grpo",
        "--algo.lever", "custom_entropy_control:sampled-entropy-bonus",
        "--algo.controller", "fixed",
        "--algo.controller.init", "0.05",
        "--model", model, "--engine", "hf", "--engine-dtype", "fp32",
        "--env", "entrogym/Arithmetic-v0", "--env-kwargs", '{"max_digits": 1, "num_train": 100, "num_test": 40}',
        "--iterations", str(iterations), "--tasks-per-iter", "2", "--samples", "2",
        "--early-stop-min-per-task", "2",
        "--max-response-tokens", "16", "--lr", "1e-3",
        "--out", str(out),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/custom-lever", help="run folder (new or empty)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--iterations", type=int, default=2)
    args = parser.parse_args()
    # `module:name` is imported by the command: make this file's folder importable there.
    here = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
    }
    return subprocess.call(train_command(Path(args.out), args.model, args.iterations), env=env)


if __name__ == "__main__":
    sys.exit(main())
