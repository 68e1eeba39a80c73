"""``entrogym demo`` (what ``make demo`` runs): entropy control against GRPO on SmolLM2, on a CPU budget.

SmolLM2-135M-Instruct is RL-trained on one-digit arithmetic with each run (by default ``grpo``,
the paper's ``repo-r`` and ``held``, the entropy-constraint lever) for each seed, through the
real trainer (fp32 log-probs, LoRA, the run's entropy control); the base model and each
adapter (after the first and the last update) are evaluated on held-out tasks. The runs are
jobs on a pool of worker processes (``run.py``), each with its own ``hf`` engine, and each
run's log lines carry its short label. Writes ``OUT/seed<S>/<run>/`` run folders,
``OUT/plots/*.png`` (the paper's Figure 1 panels: entropy per iteration, accuracy against
cumulative entropy, with each target's band) and ``OUT/summary.json``, prints the table (at
most 100 columns) and says per seed whether the goal held: a controlled run stays within
+-25 % of its target at every iteration from the 3rd on, while GRPO ends at <= 0.5 of its
first iteration's entropy and the run's held-out accuracy is no more than 0.05 below GRPO's
(``report.py``). docs/demo.md is the guide.
"""

from entrogym.demo.config import (
    ACCURACY_SLACK,
    AGENT,
    BAND,
    DEFAULT_ITERATIONS,
    DEFAULT_LR,
    DEFAULT_RUNS,
    DEFAULT_SEEDS,
    ENV,
    ENV_KWARGS,
    FALL,
    FIRST_TRACKED,
    SYSTEM_PROMPT,
    demo_config,
    parse_run,
    parsed_run,
    split_run,
)
from entrogym.demo.report import goal, plot_demo, report, verdict
from entrogym.demo.run import evaluate_base, run_demo, train_one

__all__ = [
    "AGENT", "DEFAULT_ITERATIONS", "DEFAULT_LR", "DEFAULT_RUNS", "DEFAULT_SEEDS", "ENV",
    "ENV_KWARGS", "FALL", "BAND", "ACCURACY_SLACK", "FIRST_TRACKED", "SYSTEM_PROMPT", "demo_config", "evaluate_base", "goal",
    "parse_run", "parsed_run", "plot_demo", "report", "run_demo", "split_run", "train_one", "verdict",
]  # fmt: skip
