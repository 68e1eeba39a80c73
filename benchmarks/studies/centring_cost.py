"""What exact REPO centring (``--algo.lever.centering exact``) costs the LLM scorer.

Exact centring needs H(s) at every scored position, so the trainer scores with
``sequence_logprobs_and_entropy`` instead of ``sequence_logprobs``. This measures both on a real
policy (SmolLM2-135M-Instruct + the trainer's default LoRA adapter, fp32, CPU by default) at
the shapes the trainer scores, in two modes:

* ``score``: under ``torch.no_grad()``, as when old log-probs are scored;
* ``train``: forward + backward of a loss on the log-probs, with the entropies used only
  detached (as REPO uses them).

A third path, ``exact_nograd``, computes the entropies outside autograd. It shows what the
``train`` mode would cost if the scorer did not differentiate entropies that REPO only uses
detached (``sequence_logprobs_and_entropy`` differentiates them for the entropy bonus).

Each (path, mode, shape) runs in a fresh subprocess. The peak is the process's extra resident
memory during the measured calls (glibc's free heap trimmed, then VmHWM reset through
/proc/self/clear_refs, after the model, the inputs and a warm-up call exist), or CUDA's
max_memory_allocated on a GPU. Times are the median of ``--reps`` calls
after one warm-up, as wall time and as the process's CPU time: on a shared machine the CPU time
(with one torch thread, ``--threads 1``) is the steadier figure.

    nice -n 10 python benchmarks/studies/centring_cost.py --shapes 8x110,8x512 --reps 3
prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PATHS = ("raw", "exact", "exact_nograd")
MODES = ("score", "train")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _scorer(path: str):
    """``fn(model, ids, mask) -> (logprobs, entropies or None)`` for one path."""
    import torch

    from entrogym.train.learner import logprobs as lp

    if path == "raw":
        return lambda m, ids, mask: (lp.sequence_logprobs(m, ids, mask), None)
    if path == "exact":
        return lp.sequence_logprobs_and_entropy

    def nograd(m, ids, mask):
        def both(h, w, t):
            with torch.no_grad():
                ent = lp.token_entropy(h.detach(), w.detach())
            return torch.stack([lp.token_logprobs(h, w, t), ent], -1)

        out = lp._score_sequences(m, ids, mask, both)
        return out[..., 0], out[..., 1].detach()

    return nograd


def run_case(
    path: str, mode: str, rows: int, tokens: int, reps: int, device: str, threads: int
) -> dict:
    import torch

    torch.set_num_threads(threads)
    from entrogym.train.learner.policy import load_policy

    torch.manual_seed(0)
    model = load_policy("smollm2-135m-instruct", dtype="fp32", device=device, seed=0)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (rows, tokens), device=device)
    mask = torch.ones_like(ids)
    score = _scorer(path)

    def call() -> None:
        if mode == "score":
            with torch.no_grad():
                score(model, ids, mask)
            return
        logprobs, entropies = score(model, ids, mask)
        # REPO's use: the centred log-prob is a detached constant in the advantage.
        weight = 1.0 if entropies is None else 1.0 + entropies.detach()
        (logprobs * weight).sum().backward()
        model.zero_grad(set_to_none=True)

    call()  # warm-up: lazy allocations, thread pools
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        # Hand the warm-up's freed heap back first, or the measured calls reuse it unseen.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        base = _rss_kib("VmRSS") * 1024
    times, cpu = [], []
    for _ in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _rss_kib("VmHWM") * 1024 - base
    n = rows * tokens
    return {
        "path": path,
        "mode": mode,
        "rows": rows,
        "tokens": tokens,
        "seconds": statistics.median(times),
        "seconds_all": times,
        "us_per_token": 1e6 * statistics.median(times) / n,
        "cpu_seconds": statistics.median(cpu),
        "cpu_seconds_all": cpu,
        "cpu_us_per_token": 1e6 * statistics.median(cpu) / n,
        "peak_extra_mib": peak / 2**20,
        "peak_extra_kib_per_token": peak / 1024 / n,
    }


def _ratios(cases: list[dict]) -> dict[str, dict[str, float]]:
    """exact / raw (and exact_nograd / raw) time and peak per (mode, shape)."""
    by_key = {(c["path"], c["mode"], c["rows"], c["tokens"]): c for c in cases}
    out = {}
    for (path, mode, rows, tokens), case in by_key.items():
        raw = by_key.get(("raw", mode, rows, tokens))
        if path == "raw" or raw is None:
            continue
        out[f"{path}/raw {mode} {rows}x{tokens}"] = {
            "time": case["seconds"] / raw["seconds"],
            "cpu_time": case["cpu_seconds"] / raw["cpu_seconds"],
            "peak": case["peak_extra_mib"] / max(raw["peak_extra_mib"], 1e-9),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="8x110,8x512", help="ROWSxTOKENS,...")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per case")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # path,mode,rows,tokens (child)
    args = parser.parse_args(argv)
    if args.case:
        path, mode, rows, tokens = args.case.split(",")
        result = run_case(path, mode, int(rows), int(tokens), args.reps, args.device, args.threads)
        print(json.dumps(result))
        return result
    cases = []
    for shape in args.shapes.split(","):
        rows, tokens = (int(x) for x in shape.split("x"))
        for mode in args.modes.split(","):
            for path in args.paths.split(","):
                case = f"{path},{mode},{rows},{tokens}"
                cmd = [sys.executable, __file__, "--case", case, "--reps", str(args.reps)]
                cmd += ["--device", args.device, "--threads", str(args.threads)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                cases.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(json.dumps(cases[-1]), file=sys.stderr, flush=True)
    result = {
        "model": "smollm2-135m-instruct (fp32, LoRA r=16 default)",
        "device": args.device,
        "torch_threads": args.threads,
        "load_average": list(os.getloadavg()),
        "cases": cases,
        "ratios": _ratios(cases),
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
