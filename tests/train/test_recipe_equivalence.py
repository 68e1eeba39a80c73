"""``entrogym train`` records what it recorded before the trainer was split into parts.

Each case runs the command as a user types it (tiny random model, hf engine, fp32, one thread,
fixed seed) and compares what the run leaves behind against ``data/recipe_golden.json``: the
token ids of every batch the update saw (hashed), the metrics rows without their timings, the
run folder's files, the history's events and the newest checkpoint's weights. The sync case
also draws a target probe and runs the sampler entropy check; the async case (K = 1) runs three
iterations, so a stale batch is rescored under its sampling version and an adapter is pruned.

Regenerate the fixture (only for a change that is meant to change what a run samples or
records): ``python tests/train/test_recipe_equivalence.py --record``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import vowel_env  # noqa: F401  (registers test/Vowel-v0)

from entrogym.algos import UpdateBatch
from entrogym.cli import main
from entrogym.train.folder.checkpoint import latest_checkpoint, read_training_state

GOLDEN = Path(__file__).parent / "data" / "recipe_golden.json"

COMMON = [
    "--env", "test/Vowel-v0", "--model", "tiny-random-llama", "--engine", "hf",
    "--engine-dtype", "fp32", "--tasks-per-iter", "2", "--samples", "3",
    "--early-stop-min-per-task", "3", "--early-stop-fraction", "1.0",
    "--max-response-tokens", "4", "--on-turn-budget", "step", "--max-context-tokens", "256",
    "--micro-batch-size", "4", "--lr", "1e-2", "--max-grad-norm", "1.0",
    "--threads", "1", "--seed", "11", "--checkpoint-every", "1",
]  # fmt: skip
# The golden runs tracked the sampled entropy, the controllers' default when they were recorded.
SAMPLED = ["--algo.controller.estimator", "sampled"]
CASES = {
    "sync": [
        "--max-staleness", "0", "--iterations", "2",
        "--algo", "grpo-entropy-bonus", "--algo.controller", "pi",
        "--algo.controller.target-probe", "2", "--sampler-entropy-check", "true",
        *SAMPLED,
    ],
    "async": ["--max-staleness", "1", "--iterations", "3", "--algo", "repo-r", *SAMPLED],
}  # fmt: skip
# Metrics added on purpose after the golden runs were recorded: the entropy a controller
# tracked (here always ``entropy``, since the cases pin the sampled estimator), and the
# per-turn metrics (entrogym.train.folder.turn_metrics).
ADDED = (
    "entropy_tracked",
    "turns_mean", "turns_max", "turns_hist", "end_reasons", "tool_calls", "tool_errors",
    "reward_by_turns", "entropy_by_turn", "turns_cut",
)  # fmt: skip
# Files a run writes beside what the golden run wrote: each adapter's own checksums.
ADDED_FILES = ("entrogym_adapter.json",)


def _timing(key: str) -> bool:
    """Wall-clock readings differ from run to run; everything else must not."""
    return key.endswith("_s") or key == "tokens_per_s"


def record_run(case: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Train ``case`` into ``out`` and return what it recorded deterministically."""
    batches: list[dict[str, Any]] = []
    compute = UpdateBatch.compute_advantages

    def watched(self: UpdateBatch, *args: Any, **kwargs: Any) -> Any:
        ids = self.input_ids * self.attention_mask  # padding is not what was sampled
        digest = hashlib.sha256(json.dumps(ids.tolist()).encode()).hexdigest()[:16]
        batches.append({"tokens": digest, "versions": self.versions.tolist()})
        return compute(self, *args, **kwargs)

    monkeypatch.setattr(UpdateBatch, "compute_advantages", watched)
    assert main(["train", *COMMON, *CASES[case], "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    history = [json.loads(line) for line in (out / "config_history.jsonl").read_text().splitlines()]
    weights = read_training_state(latest_checkpoint(out))
    return {
        "batches": batches,
        "rows": [{k: v for k, v in row.items() if not (_timing(k) or k in ADDED)} for row in rows],
        "phases": sorted(rows[0]["phases_s"]),
        "files": sorted(
            str(p.relative_to(out))
            for p in out.rglob("*")
            if p.is_file() and "tb" not in p.parts and p.name not in ADDED_FILES
        ),
        "events": [(r["event"], r.get("from_iteration")) for r in history],
        "optimizer_steps": _optimizer_steps(weights),
    }


def _optimizer_steps(state: dict[str, Any]) -> list[float]:
    """The Adam step counts and moment sums in the newest checkpoint: they move with every
    loss, every gradient and every step the run took."""
    out = []
    for entry in state["optimizer"]["state"].values():
        out += [float(entry["step"]), float(entry["exp_avg"].abs().sum())]
    return out


def _close(got: Any, want: Any, where: str) -> None:
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            _close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: {len(got)} items, want {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6), f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_records_what_the_golden_run_recorded(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = json.loads(GOLDEN.read_text())[case]
    got = json.loads(json.dumps(record_run(case, tmp_path / case, monkeypatch)))  # tuples: lists
    _close(got, golden, case)


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import tempfile

    fixture: dict[str, Any] = {
        "_comment": "written by `python tests/train/test_recipe_equivalence.py --record` "
        "(tiny-random-llama, hf engine, fp32, CPU, one thread)"
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            patch = pytest.MonkeyPatch()
            try:
                fixture[name] = record_run(name, Path(tmp) / name, patch)
            finally:
                patch.undo()
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
