"""The presets side by side on the world (``entrogym/World-v0``): does a preset that keeps
entropy end with a higher held-out TGC than GRPO where the agent must find which tools to call?

Each preset and seed trains as ``examples/configs/world-quickstart.yaml`` does (20 iterations,
4 tasks x 4 samples), one thread a run and ``--lanes`` runs at a time, evaluated on
``test_normal``'s first 40 tasks after iterations 0, 10 and 19, with the input dependence every 5
iterations; its final adapter is then evaluated on ``test_challenge`` into ``RUN/challenge``.
A run whose challenge evaluation exists is not run again, and a training run stopped part way
(``kill -TERM`` to the study's process group checkpoints it) resumes from its newest checkpoint
(``entrogym train --resume``, exact), so a stopped study goes on where it stopped.
``--archive DIR`` copies each finished run's small files (metrics, config, the challenge
evaluation; no adapters) into ``DIR/NAME-sSEED``, where ``entrogym compare DIR/*`` reads them
again without the runs. At the end it prints ``entrogym compare`` over every finished run.
``--record FILE`` then writes the demo's record of every run kept in the archive (each
entropy-keeping configuration's TGC minus GRPO's, paired by seed; entrogym.experiments.
world_record), with ``--provenance`` saying where its runs are.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/studies/world_presets.py --seeds 1 2 \
        --out runs/world-presets --archive benchmarks/results/world-presets
    PYTHONPATH=$PWD .venv/bin/python benchmarks/studies/world_presets.py --presets grpo held \
        --seeds 0 --archive-only --out runs/world-presets --archive benchmarks/results/world-presets
    PYTHONPATH=$PWD .venv/bin/python benchmarks/studies/world_presets.py --archive-only \
        --archive benchmarks/results/world-presets \
        --record entrogym/experiments/data/world-presets.json --provenance "..."
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The shared benchmark modules (demo_workload.py, ...) sit one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo_workload import DEFAULT_RUNS, record_world  # noqa: E402

from entrogym.atomic import atomic_write_text  # noqa: E402
from entrogym.commands.demo_runs import split_run  # noqa: E402
from entrogym.train.folder.layout import has_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "world-quickstart.yaml"
ENTROGYM = [sys.executable, "-m", "entrogym"]
# The demo's held run: the entropy constraint holding the policy's exact entropy on fixed probe
# states at its start (docs/demo.md); held-half holds half of it.
HELD = dict(split_run(text) for text in DEFAULT_RUNS)["held"]
PRESETS: dict[str, str] = {
    "grpo": "grpo",
    # the preset's own update: one on-policy step on all 16 rows, no minibatches
    "rloo": "rloo --algo.minibatch-size none",
    "dapo": "dapo",
    "gspo": "gspo",
    "adapo": "adapo",
    "repo-r": "repo-r",
    "repo-d": "repo-d",
    "held": HELD,
    "held-half": f"{HELD} --algo.controller.target 0.5",
}
# what the comparison fixed for every run beside the quickstart's settings
RUN_OPTIONS = ["--threads", "1", "--eval-every", "10", "--input-dependence-every", "5"]
# the eval settings the quickstart trains with (docs/envs.md, "Training on it")
CHALLENGE = ["--env", "entrogym/World-v0", "--split", "test_challenge", "--tool-format", "call",
             "--engine", "hf", "--engine-dtype", "fp32", "--max-response-tokens", "48",
             "--max-context-tokens", "2048"]  # fmt: skip
# what --archive keeps of a run: all that `entrogym compare` and the results log read
KEPT = ("metrics.jsonl", "config.yaml", "entrogym-run.json", "challenge/eval.json")
# the adapter after the quickstart's 20th (last) iteration
FINAL_ADAPTER = Path("checkpoints", "iter-000019", "adapter")


def train_command(preset: str, seed: int, folder: Path, *, resume: bool = False) -> list[str]:
    """``entrogym train`` for one preset and seed: the preset's spec as ``--algo`` options;
    ``--resume`` to go on from the folder's newest checkpoint."""
    name, *options = PRESETS[preset].split()
    return [*ENTROGYM, "train", "--config", str(CONFIG), "--algo", name, *options,
            "--seed", str(seed), *RUN_OPTIONS, "--out", str(folder),
            *(["--resume"] if resume else [])]  # fmt: skip


def challenge_command(seed: int, folder: Path) -> list[str]:
    """``entrogym eval`` of a finished run's final adapter on ``test_challenge``."""
    return [*ENTROGYM, "eval", *CHALLENGE, "--seed", str(seed),
            "--adapter", str(folder / FINAL_ADAPTER), "--out", str(folder / "challenge")]  # fmt: skip


def finished(folder: Path) -> bool:
    return (folder / "challenge" / "eval.json").is_file()


def run_one(preset: str, seed: int, out: Path) -> Path:
    """Train and evaluate one run, logging each command's output beside its folder. A folder
    left by a stopped training run resumes from its newest checkpoint, its log appended to; one
    without a checkpoint is started again from nothing."""
    folder = out / f"{preset}-s{seed}"
    if finished(folder):
        return folder
    print(f"{time.strftime('%H:%M:%S')} start {folder.name}", flush=True)
    if not (folder / FINAL_ADAPTER).is_dir():
        resume = has_checkpoint(folder)
        if not resume:
            shutil.rmtree(folder, ignore_errors=True)
        _logged(train_command(preset, seed, folder, resume=resume),
                out / f"{folder.name}.train.log", append=resume)  # fmt: skip
    _logged(challenge_command(seed, folder), out / f"{folder.name}.challenge.log")
    print(f"{time.strftime('%H:%M:%S')} done {folder.name}", flush=True)
    return folder


def _logged(command: list[str], log: Path, *, append: bool = False) -> None:
    # one thread a command: `entrogym eval` has no --threads, and torch reads OMP_NUM_THREADS
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("a" if append else "w") as stream:
        done = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[2:4])} failed ({done.returncode}); see {log}")


def archive(folder: Path, into: Path) -> Path:
    """Copy a finished run's KEPT files into ``into/<run folder's name>``."""
    target = into / folder.name
    for name in KEPT:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(folder / name, target / name)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=[p for p in PRESETS if p != "held-half"],
                        choices=list(PRESETS))  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--lanes", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--out", type=Path, default=Path("runs/world-presets"))
    parser.add_argument("--archive", type=Path, help="copy finished runs' small files here")
    parser.add_argument("--archive-only", action="store_true", help="run nothing; archive")
    parser.add_argument("--record", type=Path, help="write the demo's record of the archive here")
    parser.add_argument("--provenance", help="the record's provenance: where its runs are")
    opts = parser.parse_args(argv)
    if (opts.archive_only or opts.record) and not opts.archive:
        parser.error("--archive-only and --record need --archive DIR")
    if opts.record and not opts.provenance:
        parser.error("--record needs --provenance TEXT (where the record's runs are)")
    opts.out.mkdir(parents=True, exist_ok=True)
    grid = [(preset, seed) for seed in opts.seeds for preset in opts.presets]
    if not opts.archive_only:
        with ThreadPoolExecutor(opts.lanes) as lanes:
            list(lanes.map(lambda job: run_one(*job, opts.out), grid))
    done = [f for f in (opts.out / f"{p}-s{s}" for p, s in grid) if finished(f)]
    if opts.archive:
        done = [archive(folder, opts.archive) for folder in done]
    if done:
        subprocess.run([*ENTROGYM, "compare", *map(str, done)], check=True, cwd=ROOT)
    if opts.record:
        write_record(opts.archive, opts.record, opts.provenance)
    return 0


def write_record(archive_dir: Path, into: Path, provenance: str) -> dict:
    """The demo's record of every run kept in ``archive_dir``, written to ``into``."""
    kept = sorted(p for p in archive_dir.iterdir() if (p / "metrics.jsonl").is_file())
    if not kept:
        raise SystemExit(f"--record: no kept runs in {archive_dir}; finish or archive some first")
    made = record_world(kept, date=time.strftime("%Y-%m-%d"), provenance=provenance)
    atomic_write_text(into, json.dumps(made, indent=1) + "\n")
    print(f"recorded {made['runs']} runs in {into}")
    return made


if __name__ == "__main__":
    raise SystemExit(main())
