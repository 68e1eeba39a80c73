"""What switching to a new adapter version costs the ``hf`` engine, with and without writing it
into the evicted version's LoRA layers (``entrogym.agents.engines.adapter_slots``).

Each timed call publishes a new version of a non-zero adapter (as a training run does every
iteration) and samples one token for the demo's batch with ``static-cdf``: the call's time is
the switch (loading the version; merging and packing the sampling copy) and one prefill. The
two ways alternate call by call in one engine (``peft-load``: peft's ``load_adapter`` builds new
layers, as before the slots; ``slot``: the saved tensors are copied into the evicted layers),
so that both see the same machine. Prints one JSON object with every call's seconds and the
medians, per dtype.

    .venv/bin/python benchmarks/studies/adapter_switch.py --calls 10
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The shared benchmark modules (demo_workload.py, roofline.py, ...) sit one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode_throughput import publish  # noqa: E402
from demo_workload import AGENT, demo_prompts  # noqa: E402
from jsonargparse import ArgumentParser  # noqa: E402

from entrogym.agents.engines import SamplingParams, hf, make_engine  # noqa: E402
from entrogym.dtypes import cpu_has_native  # noqa: E402
from entrogym.models import resolve_model  # noqa: E402
from entrogym.train.learner.policy import LoraSettings, load_policy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", default=AGENT.model)
    p.add_argument("--calls", type=int, default=10, help="timed calls per dtype, half each way")
    p.add_argument("--dtypes", type=list[str], default=["fp32", "bf16"])
    args = p.parse_args(argv)
    _, prompts = demo_prompts(args.model, 6, 4)
    policy = load_policy(resolve_model(args.model), lora=LoraSettings())
    one = SamplingParams(max_tokens=1, temperature=1.0, ignore_eos=True)
    slot = hf.load_into_slot
    ways = {"peft-load": lambda *a, **k: False, "slot": slot}
    result: dict = {"model": args.model, "prompts": len(prompts)}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes:
            if dtype == "bf16" and not cpu_has_native("bf16"):
                result[dtype] = {"skipped": "this CPU has no native bf16"}
                continue
            seconds: dict[str, list[float]] = {way: [] for way in ways}
            engine = make_engine("hf", args.model, dtype=dtype, max_model_len=256,
                                 max_num_seqs=len(prompts), decode="static-cdf")  # fmt: skip
            with engine:
                engine.generate(prompts[:1], one)
                # two untimed calls first: the first adapter is always built anew
                for call in range(args.calls + 2):
                    way = list(ways)[call % 2]
                    hf.load_into_slot = ways[way]
                    adapter = publish(policy, f"{tmp}/{dtype}", call + 1)
                    t0 = time.perf_counter()
                    engine.generate(prompts, one, adapter=adapter)
                    if call >= 2:
                        seconds[way].append(round(time.perf_counter() - t0, 3))
            hf.load_into_slot = slot
            result[dtype] = {
                way: {"seconds": s, "median": statistics.median(s)} for way, s in seconds.items()
            }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
