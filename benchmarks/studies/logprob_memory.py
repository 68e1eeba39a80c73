"""Peak memory and time of token log-probs (and exact entropies): full fp32 logits vs entrogym.

Each case (path x quantity x vocab) runs forward + backward (gradient w.r.t. the hidden states,
LM head frozen as under LoRA) in a fresh subprocess. On Linux the process's peak resident set
(VmHWM) is reset through /proc/self/clear_refs just before the measured call, after the inputs
exist, so the figure is the extra memory the computation itself needed; elsewhere ru_maxrss
minus the RSS before the call is used. CUDA runs use torch.cuda.max_memory_allocated instead.

    python benchmarks/studies/logprob_memory.py --tokens 1024 --hidden 1024
prints one JSON object with every figure and the naive / entrogym ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

PATHS = ("naive", "entrogym", "cce_torch_compile")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> int:
    """Reset the kernel's peak-RSS counter; return the RSS it restarts from (KiB)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _rss_kib("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_kib() -> int:
    try:
        return _rss_kib("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_case(path: str, quantity: str, tokens: int, hidden: int, vocab: int, device: str) -> dict:
    import torch

    from entrogym.train.learner.logprobs import token_entropy, token_logprobs

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, device=device).requires_grad_()
    w = torch.randn(vocab, hidden, device=device) / hidden**0.5
    t = torch.randint(0, vocab, (tokens,), device=device)

    def step() -> None:
        if path == "naive":
            logp = torch.log_softmax(h @ w.T, -1)
            if quantity == "logprobs":
                out = logp.gather(1, t[:, None])[:, 0]
            else:
                out = -(logp.exp() * logp).sum(-1)
        elif quantity == "logprobs":
            impl = "torch_compile" if path == "cce_torch_compile" else "auto"
            out = token_logprobs(h, w, t, impl=impl, softmax_fix=False)
        else:
            out = token_entropy(h, w)
        out.sum().backward()
        h.grad = None

    if path == "cce_torch_compile":
        step()  # compile outside the measured call
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _reset_peak() * 1024
    start = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _peak_kib() * 1024 - base
    first = time.perf_counter() - start
    start = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    return {
        "peak_mib": round(peak / 2**20, 1),
        "seconds": round(min(first, time.perf_counter() - start), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--with-cce-torch-compile",
        action="store_true",
        help="also measure Cut Cross-Entropy's torch.compile path (log-probs only)",
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: path:quantity:vocab
    args = parser.parse_args()

    if args.case:
        path, quantity, vocab = args.case.split(":")
        result = run_case(path, quantity, args.tokens, args.hidden, int(vocab), args.device)
        print(json.dumps(result))
        return

    report: dict = {
        "tokens": args.tokens,
        "hidden": args.hidden,
        "device": args.device,
        "cases": {},
    }
    for vocab in args.vocab:
        for quantity in ("logprobs", "entropy"):
            paths = ["naive", "entrogym"]
            if args.with_cce_torch_compile and quantity == "logprobs":
                paths.append("cce_torch_compile")
            row = {}
            for path in paths:
                cmd = [
                    sys.executable, __file__, "--case", f"{path}:{quantity}:{vocab}",
                    "--tokens", str(args.tokens), "--hidden", str(args.hidden),
                    "--device", args.device,
                ]  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                row[path] = json.loads(done.stdout.strip().splitlines()[-1])
            row["memory_ratio_naive_over_entrogym"] = round(
                row["naive"]["peak_mib"] / max(row["entrogym"]["peak_mib"], 1e-9), 2
            )
            row["time_ratio_entrogym_over_naive"] = round(
                row["entrogym"]["seconds"] / max(row["naive"]["seconds"], 1e-9), 2
            )
            report["cases"][f"{quantity}_V{vocab}"] = row
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
