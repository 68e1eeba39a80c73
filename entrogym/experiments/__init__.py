"""The experiment runners, apart from the library they measure: the SmolLM2 demo
(``entrogym demo``, what ``make demo`` runs), the sequential experiment (``entrogym sequential``)
and the bandit lab with its sweeps (``entrogym bandit``, ``entrogym bandit sweep``).

=======================================  ===========================================================
module                                   what it holds
=======================================  ===========================================================
``config``                               the demo's settings, runs and goal constants
``run``, ``pool``, ``pass_at_k``         the demo's jobs, their process pool, each adapter's pass@k
``report``, ``log_labels``               the demo's goal, table and plots; each run's log prefix
``sequential``, ``sequential_report``    task A then task B from each stage-1 policy; its report
``world_record``                         the world's presets against GRPO, recorded for the demo
``data/``                                the recorded sequential and world results, shipped
``lab``, ``lab_config``, ``lab_report``  the bandit lab: its runs, settings, summary and plot
``lab_sweep``                            the lab over a grid of knobs
=======================================  ===========================================================

The demo: entropy control against GRPO on SmolLM2, on a CPU budget. SmolLM2-135M-Instruct is
RL-trained on one-digit arithmetic with each run (by default ``grpo``, the paper's ``repo-r`` and
``held``, the entropy-constraint lever) for each seed, through the real trainer (fp32 log-probs, LoRA, the run's entropy control); the base model and each
adapter (after the first and the last update) are evaluated on held-out tasks. The runs are
jobs on a pool of worker processes (``run.py``), each with its own ``hf`` engine, and each
run's log lines carry its short label. Writes ``OUT/seed<S>/<run>/`` run folders,
``OUT/plots/*.png`` (the paper's Figure 1 panels: entropy per iteration, accuracy against
cumulative entropy, with each target's band) and ``OUT/summary.json``, prints the table (at
most 100 columns) and says per seed whether the goal held: a controlled run stays within
+-25 % of its target at every iteration from the 3rd on, while GRPO ends at <= 0.5 of its
first iteration's entropy and the run's held-out accuracy is no more than 0.05 below GRPO's
(``report.py``). docs/demo.md is the guide.

The runner and its grader are public too, for work that measures against the demo's own runs
(``benchmarks/entropy_hold.py``): ``plan_jobs`` (every run and seed as a job), ``run_job`` (one
job's body), ``run_jobs`` (a process pool, ``pool.py``), ``announce_demo`` (a job's line),
``held_out_accuracy`` (the eval rows' grader for any
adapter) and ``tracking`` (a run's tracking error and largest excursion from its target); and
the sequential experiment's registered task pairs (``PAIRS``), whose tasks the base-rate
screen measures.
"""

from entrogym.experiments.config import (
    ACCURACY_SLACK,
    AGENT,
    BAND,
    DEFAULT_ITERATIONS,
    DEFAULT_LR,
    DEFAULT_RUNS,
    DEFAULT_SEEDS,
    DEMO_UPDATE,
    ENV,
    ENV_KWARGS,
    FALL,
    FIRST_TRACKED,
    SAMPLES,
    SYSTEM_PROMPT,
    TASKS,
    DemoRun,
    demo_agent,
    demo_config,
)
from entrogym.experiments.pool import run_jobs
from entrogym.experiments.report import goal, plot_demo, report, tracking, verdict
from entrogym.experiments.run import (
    announce_demo,
    evaluate_base,
    held_out_accuracy,
    plan_jobs,
    run_demo,
    run_job,
    train_one,
)
from entrogym.experiments.sequential import PAIRS
from entrogym.experiments.world_record import record_world

__all__ = [
    "ACCURACY_SLACK", "AGENT", "announce_demo", "BAND", "DEFAULT_ITERATIONS", "DEFAULT_LR", "DEFAULT_RUNS",
    "DEFAULT_SEEDS", "DEMO_UPDATE", "DemoRun", "ENV", "ENV_KWARGS", "FALL", "FIRST_TRACKED", "PAIRS",
    "SAMPLES", "SYSTEM_PROMPT", "TASKS", "demo_agent", "demo_config", "evaluate_base", "goal",
    "held_out_accuracy", "plan_jobs", "plot_demo", "report", "run_demo", "run_job", "run_jobs",
    "record_world", "tracking", "train_one", "verdict",
]  # fmt: skip
