"""What trackers recorded, read back for tests: wandb's offline run file, and the rows of
``metrics.jsonl`` as the trackers name them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest


def same(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]]) -> bool:
    """The same steps, and at each the same names and values."""
    return sorted(got) == sorted(want) and all(got[s] == pytest.approx(want[s]) for s in want)


def expected(rows: list[dict]) -> dict[int, dict[str, float]]:
    """step -> the numeric fields of metrics.jsonl's rows, as the trackers name them."""

    def flat(row: dict, prefix: str) -> dict[str, float]:  # nested fields as outer/inner
        out = {}
        for k, v in row.items():
            if isinstance(v, dict):
                out |= flat(v, f"{prefix}{k}/")
            elif isinstance(v, int | float):
                out[prefix + k] = float(v)
        return out

    steps: dict[int, dict[str, float]] = {}
    for row in rows:
        fields = {k: v for k, v in row.items() if k not in ("iteration", "step", "kind")}
        scalars = flat(fields, "eval/" if row["kind"] == "eval" else "")
        steps.setdefault(row["step"], {}).update(scalars)
    return steps


def wandb_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """The history records of wandb's offline run file (its LevelDB-style log of protobufs)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, payload, history = path.read_bytes(), 7, b"", {}
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}  # fmt: skip
                step = items.pop("_step")
                history.setdefault(step, {}).update(
                    {k: v for k, v in items.items() if not k.startswith("_")}
                )
        elif kind == 0:
            break
    return history
