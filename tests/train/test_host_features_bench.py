"""benchmarks/host_features.py: the CPU's features as /proc/cpuinfo gives them, the kernel each
phase takes (the very choice the static decoder makes), and benchmarks/multiturn_rollout.py's
report on a tiny run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import host_features  # noqa: E402

from entrogym.agents.engines import decode_kernel, make_engine  # noqa: E402
from entrogym.models import resolve_model  # noqa: E402

AMX_HOST = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8
"""


def test_features_come_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AMX_HOST)
    host = host_features.host_features(cpuinfo)
    assert host["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert all(host["features"].values())
    cpuinfo.write_text(AMX_HOST.replace(" amx_tile amx_bf16 amx_int8", ""))
    features = host_features.host_features(cpuinfo)["features"]
    assert features["avx512_bf16"] and not features["amx_bf16"] and not features["amx_tile"]
    line = host_features.describe(host_features.host_features(cpuinfo), {"learner": {"x": "y"}})
    assert "Platinum 8480+" in line and "avx512_bf16" in line and "amx" not in line
    assert "learner: x y" in line


def test_the_reported_generation_kernels_are_the_decoders():
    kernels = host_features.phase_kernels(resolve_model("tiny-random-llama"), "fp32")
    with make_engine(
        "hf", "tiny-random-llama", dtype="fp32", max_model_len=64, decode="static"
    ) as engine:
        engine.generate([[1, 2, 3]], engine_params())
        (decoder,) = engine._decoders.values()
    assert {k: v for k, v in kernels["generation"].items() if k != "dtype"} == decoder.kernel_names
    assert kernels["learner"]["dtype"] == "fp32"


def test_the_plan_names_each_choice():
    cpu = torch.device("cpu")
    none = decode_kernel.plan(cpu, torch.float32, 2, 32, packed=False, kernels=False)
    assert none == {"packed": False, "kernels": False, "stream": False}
    assert decode_kernel.plan_names(none) == {
        "projections": "torch matmul (input-major weights)", "step_ops": "torch ops"
    }  # fmt: skip
    packed = decode_kernel.plan_names({"packed": True, "kernels": True, "stream": False})
    assert packed["projections"].startswith("oneDNN") and packed["step_ops"].startswith("entrogym")


def engine_params():
    from entrogym.agents.engines import SamplingParams

    return SamplingParams(max_tokens=2)


def test_multiturn_rollout_reports_each_mode(tmp_path):
    out = tmp_path / "report.json"
    cmd = [sys.executable, str(BENCHMARKS / "multiturn_rollout.py"), "--turns", "2",
           "--latency-ms", "0", "--reps", "1", "--tasks", "1", "--samples", "2",
           "--turn-tokens", "4", "--chunk-tokens", "2", "--env-workers", "1", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["host"]["cpu_model"]
    modes = {c["mode"]: c for c in report["cells"]}
    assert set(modes) == {"full", "kept", "chunked", "overlap"}
    reused = {r["mode"]: r["reused_tokens"] for r in report["runs"]}
    assert reused["full"] == 0 and reused["kept"] > 0 and reused["overlap"] > 0
    assert all(c["generated_tokens"] > 0 for c in report["cells"])
