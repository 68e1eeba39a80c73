"""Shared pieces of ``benchmarks/iteration.py``: the workload both frameworks run, matmul
ceilings, learner FLOP counting and process-tree RSS sampling. Imports only torch (and
psutil where present) so that both the entrogym venv and ``.venv-bench`` (TRL) can use it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

# The GRPO iteration both workers run: the demo's shapes (48 response tokens, 256 context tokens,
# one epoch in two minibatches, LoRA 16/32, the TrainConfig defaults it keeps) at 6 tasks x 4
# samples and lr 1e-3, the batch docs/performance.md measures (``--tasks``/``--samples`` change it).
DEMO = {
    "tasks": 6,
    "samples": 4,
    "minibatch_size": 12,  # tasks * samples // 2: two optimizer steps per iteration
    "micro_batch_size": 6,
    "max_response_tokens": 48,
    "max_context_tokens": 256,
    "lr": 1e-3,
    "weight_decay": 0.01,  # TrainConfig's defaults (the paper's), which the demo keeps
    "max_grad_norm": 0.1,
    "eps_low": 0.2,
    "eps_high": 0.2,
    "lora_rank": 16,
    "lora_alpha": 32,
    "temperature": 1.0,
    # entrogym.train.learner.policy.LORA_TARGETS (the paper's: attention and MLP, not the LM head)
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


@dataclass
class Workload:
    """What one benchmark worker runs: the same for entrogym and TRL."""

    model_dir: str
    prompts: list[list[dict]]  # per iteration order: chat messages of each task, tasks*iters
    answers: list[str]
    iterations: int
    device: str = "cpu"
    dtype: str = "fp32"
    threads: int | None = None
    seed: int = 0
    settings: dict = field(default_factory=lambda: dict(DEMO))
    # The multi-turn workload (``bench_multiturn.py``): {"turns", "latency_ms"}; the prompts
    # are then the rows of multiturn_env's TalkTools conversations; None: the demo's tasks.
    multiturn: dict | None = None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Workload:
        return cls(**json.loads(Path(path).read_text()))


def matmul_ceiling(dtype: torch.dtype, device: str = "cpu", n: int = 2048, reps: int = 5) -> float:
    """Best-of-``reps`` GFLOP/s of an n x n matmul in ``dtype`` with this process's threads, by
    the faster of torch's matmul and, on CPU, oneDNN's kernel over a packed weight
    (``roofline.onednn_kernel``: MKL's sgemm can be far from the machine's rate)."""
    from roofline import onednn_kernel

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for kernel in filter(None, [lambda: a @ b, onednn_kernel(a, b)]):
        kernel()  # warm-up (oneDNN primitive creation)
        for _ in range(reps):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            c = kernel()
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
            del c
    return 2 * n**3 / best / 1e9


@dataclass
class ModelShape:
    body_params: int  # parameters outside the embedding and the LM head (LoRA included)
    layers: int
    hidden: int
    vocab: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        skip = {id(head.weight), id(embed.weight)}
        body = sum(p.numel() for p in model.parameters() if id(p) not in skip)
        cfg = model.config
        return cls(body, cfg.num_hidden_layers, cfg.hidden_size, head.weight.shape[0])

    def forward_flops(self, row_lengths: list[int], head_positions: int) -> float:
        """Matmul FLOPs of one forward: 2 per body parameter per token, causal attention
        (QK^T and AV: 2 * L * D * T^2 per row) and the LM head at the scored positions."""
        tokens = sum(row_lengths)
        attention = 2 * self.layers * self.hidden * sum(t * t for t in row_lengths)
        return (
            2 * self.body_params * tokens
            + attention
            + 2 * self.hidden * self.vocab * head_positions
        )

    def backward_flops(self, row_lengths: list[int], head_positions: int) -> float:
        """Frozen base weights need only activation gradients (about one forward; LoRA's
        weight gradients are negligible); the chunked head recomputes its logits and forms
        both gradients (two more head products)."""
        head = 2 * self.hidden * self.vocab * head_positions
        return self.forward_flops(row_lengths, head_positions) + 2 * head


class PeakRss:
    """Samples the summed RSS of a process and all its descendants every ``interval`` s."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        import psutil

        self.proc, self.interval, self.peak = psutil.Process(pid), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
                total = 0
                for p in procs:
                    with contextlib.suppress(psutil.Error):  # exited since children()
                        total += p.memory_info().rss
                self.peak = max(self.peak, total)
            except psutil.Error:
                return
            self._stop.wait(self.interval)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def run_worker(cmd: list[str], result: Path, timeout: float) -> dict:
    """Runs one benchmark worker process (``benchmarks/`` on its path) and returns the JSON it
    wrote to ``result``, with the peak RSS of its process tree; a failure exits with its
    output's tail."""
    env = dict(os.environ, BENCH_SPAWN_TIME=repr(time.time()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    rss = PeakRss(proc.pid)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        peak = rss.stop()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        tail = output.decode(errors="replace")[-3000:]
        raise SystemExit(f"benchmark worker {cmd[1]} failed ({proc.returncode}):\n{tail}")
    out = json.loads(result.read_text())
    out["peak_rss_mb"] = peak
    return out
