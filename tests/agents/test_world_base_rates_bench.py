"""benchmarks/world_base_rates.py on a tiny model, through the real rollout path: the counts
per split and template add up, turns are classified as the call format reads them, and bad
input is one line before any model loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import world_base_rates  # noqa: E402

from entrogym.agents.tool_format import get_tool_format  # noqa: E402
from entrogym.envs.world.env import WorldEnv  # noqa: E402


def test_turn_kinds() -> None:
    tools, fmt = WorldEnv(train_scenarios=1, test_scenarios=1).tool_schemas, get_tool_format("call")
    assert world_base_rates.turn_kind('find_contact(name="Amy")', tools, fmt) == "call"
    assert world_base_rates.turn_kind('buy(item="cup", quantity=2)', tools, fmt) == "call"
    assert world_base_rates.turn_kind('buy(item="cup", quantity="two")', tools, fmt) == "bad_call"
    assert world_base_rates.turn_kind('sell(item="cup")', tools, fmt) == "bad_call"
    assert world_base_rates.turn_kind("find_contact(name=Amy)", tools, fmt) == "bad_call"
    assert world_base_rates.turn_kind("done", tools, fmt) == "text"


def test_a_tiny_model_run_adds_up(tmp_path: Path) -> None:
    out = tmp_path / "rates.json"
    report = world_base_rates.main([
        "--model", "tiny-random-llama", "--scenarios", "1", "--samples", "2",
        "--max-turns", "2", "--max-turn-tokens", "8", "--decode", "generate",
        "--templates", "msg", "block", "msg2", "--out", str(out),
    ])  # fmt: skip
    assert json.loads(out.read_text()) == report
    normal, challenge = report["splits"]["test_normal"], report["splits"]["test_challenge"]
    assert set(normal["templates"]) == {"msg", "block"} and set(challenge["templates"]) == {"msg2"}
    for split in (normal, challenge):
        total = split["all"]
        assert total["episodes"] == sum(t["episodes"] for t in split["templates"].values())
        assert all(t["episodes"] == 1 * 3 * 2 for t in split["templates"].values())
        assert total["failed"] == 0 and 1 <= total["mean_turns"] <= 2
        assert sum(total["turn_kinds"].values()) == pytest.approx(
            total["mean_turns"] * total["episodes"]
        )
        # doing nothing still passes the no-collateral check: every reward is above 0
        assert 0 < total["mean_reward"] <= 1 and 0 <= total["tgc"] <= total["mean_reward"]
        assert 0 <= total["sgc"] <= total["tgc"] + 1e-9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--templates", "nope"], "unknown template(s) ['nope']"),
        (["--demonstrations", "nope"], "demonstrations must be a list of names"),
        (["--splits", "dev"], "unknown split 'dev'"),
        (["--adapter", "no-such-folder"], "is not a peft adapter folder"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        world_base_rates.main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_an_adapter_is_what_gets_measured(tmp_path: Path) -> None:
    """``--adapter`` samples through the LoRA (other actions than the base under one seed)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from entrogym.train.learner.policy import load_base_model

    torch.manual_seed(0)
    lora = get_peft_model(
        load_base_model("tiny-random-llama", dtype="fp32"),
        LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "down_proj"],
                   init_lora_weights=False, task_type="CAUSAL_LM"),
    )  # fmt: skip
    lora.save_pretrained(str(tmp_path / "adapter"))
    argv = ["--model", "tiny-random-llama", "--scenarios", "1", "--samples", "2",
            "--max-turns", "2", "--max-turn-tokens", "8", "--decode", "generate",
            "--splits", "test_normal", "--templates", "msg", "--all-episodes"]  # fmt: skip
    base = world_base_rates.main(argv)
    tuned = world_base_rates.main([*argv, "--adapter", str(tmp_path / "adapter")])
    assert base["adapter"] is None and tuned["adapter"] == str((tmp_path / "adapter").resolve())

    def actions(report: dict) -> list:
        return [e["actions"] for e in report["splits"]["test_normal"]["episodes"]]

    assert actions(base) == actions(world_base_rates.main(argv))  # the seed fixes the sample
    assert actions(tuned) != actions(base)
