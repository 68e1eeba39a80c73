"""Text envs: registry, check_env, seeding, the math and arithmetic envs, bad input."""

from __future__ import annotations

import runpy
import string
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import entrogym  # noqa: F401
from entrogym.envs import (
    BUILTIN_ENV_IDS,
    TextEnv,
    TextEnvCheckError,
    UnicodeText,
    check_text_env,
    is_text_env,
    make_text_env,
    task_ids_of,
)
from entrogym.envs.arithmetic import ArithmeticEnv, evaluate
from entrogym.envs.datasets import load_problems, parse_jsonl
from entrogym.envs.math_env import MathEnv

ROOT = Path(__file__).resolve().parents[2]
MINE = {
    "entrogym/AIME-v0": 30,
    "entrogym/AIME2025-v0": 30,
    "entrogym/AMC-v0": 40,
    "entrogym/AIMETrain-v0": 918,
    "entrogym/Arithmetic-v0": 1000,
}


def test_registry_lists_every_id_lazily() -> None:
    for env_id in [*MINE, "entrogym/Bandit-v0", "entrogym/AppWorld-v0"]:
        assert env_id in gym.registry and env_id in BUILTIN_ENV_IDS
    assert gym.registry["entrogym/Bandit-v0"].entry_point == "entrogym.envs.bandit:BanditEnv"
    assert (
        gym.registry["entrogym/AppWorld-v0"].entry_point == "entrogym.envs.appworld.env:AppWorldEnv"
    )
    assert gym.registry["entrogym/AIME-v0"].kwargs == {"dataset": "aime_2024"}


def test_import_stays_light() -> None:
    code = "import sys, entrogym; print(sorted({'torch', 'vllm', 'sympy', 'lm_eval'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("env_id", list(MINE))
def test_make_and_check_env(env_id: str) -> None:
    env = gym.make(env_id)
    assert is_text_env(env)
    assert len(task_ids_of(env)) == MINE[env_id]
    check_env(env.unwrapped)
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and obs in env.observation_space
    assert info["task_id"] in task_ids_of(env)
    env.close()


def test_spaces_accept_any_unicode_up_to_the_bound() -> None:
    space = UnicodeText(10, min_length=1)
    assert space.contains("∫ λ 中文\n$") and space.contains("😀")
    assert not space.contains("") and not space.contains("x" * 11) and not space.contains(b"ab")
    assert not gym.spaces.Text(10).contains("$x$")  # why this space exists
    space.seed(3)
    samples = [space.sample() for _ in range(20)]
    assert all(space.contains(s) for s in samples)
    assert space == UnicodeText(10, min_length=1) and space != UnicodeText(11, min_length=1)


def test_reset_sampling_is_reproducible_by_seed() -> None:
    env = gym.make("entrogym/AIMETrain-v0")
    first = [env.reset(seed=s)[1]["task_id"] for s in range(8)]
    again = [env.reset(seed=s)[1]["task_id"] for s in range(8)]
    assert first == again and len(set(first)) > 4
    env.reset(seed=123)
    chain = [env.reset()[1]["task_id"] for _ in range(5)]
    env.reset(seed=123)
    assert [env.reset()[1]["task_id"] for _ in range(5)] == chain
    other = gym.make("entrogym/AIMETrain-v0")
    assert [other.reset(seed=s)[1]["task_id"] for s in range(8)] == first


def test_arithmetic_task_set_is_a_function_of_task_seed() -> None:
    a, b, c = ArithmeticEnv(task_seed=1), ArithmeticEnv(task_seed=1), ArithmeticEnv(task_seed=2)
    ids = a.task_ids("train")
    assert [a.problem(i) for i in ids] == [b.problem(i) for i in ids]
    assert [a.problem(i) for i in ids[:50]] != [c.problem(i) for i in ids[:50]]
    train = {a.problem(i).expression for i in a.task_ids("train")}
    test = {a.problem(i).expression for i in a.task_ids("test")}
    assert len(train) == 1000 and len(test) == 200 and not train & test
    for i in ids[:200]:
        p = a.problem(i)
        left, op, right = p.expression.split()
        assert op in "+-" and 0 <= int(left) < 100 and 0 <= int(right) < 100
        assert p.answer == (int(left) + int(right) if op == "+" else int(left) - int(right)) >= 0


def test_arithmetic_knobs() -> None:
    assert evaluate([2, 3, 4], ["+", "*"]) == 14 and evaluate([10, 2, 3], ["-", "-"]) == 5
    env = ArithmeticEnv(num_operands=3, min_digits=2, max_digits=3, operations="*+", num_train=50)
    for i in env.task_ids("train"):
        p = env.problem(i)
        tokens = p.expression.split()
        assert len(tokens) == 5 and set(tokens[1::2]) <= {"*", "+"}
        assert all(10 <= int(t) < 1000 for t in tokens[::2])
    with pytest.raises(ValueError, match="operations"):
        ArithmeticEnv(operations="/")
    with pytest.raises(ValueError, match="max_digits"):
        ArithmeticEnv(min_digits=3, max_digits=2)
    with pytest.raises(ValueError, match="distinct"):
        ArithmeticEnv(max_digits=1, operations="+", num_train=90, num_test=40)


def test_arithmetic_absolute_value_task() -> None:
    env = ArithmeticEnv(
        max_digits=1, operations="-", allow_negative=True, absolute=True, num_train=60, num_test=40
    )
    signed = ArithmeticEnv(
        max_digits=1, operations="-", allow_negative=True, num_train=60, num_test=40
    )
    negative_inside = 0
    for i in env.task_ids("train") + env.task_ids("test"):
        p, q = env.problem(i), signed.problem(i)
        # the same draws, written inside bars and graded by their absolute value
        assert p.expression == f"|{q.expression}|" and p.answer == abs(q.answer)
        left, _, right = p.expression.strip("|").split()
        assert p.answer == abs(int(left) - int(right))
        negative_inside += q.answer < 0
    assert 0 < negative_inside < 100
    task = next(i for i in env.task_ids("test") if signed.problem(i).answer < 0)
    prompt, _ = env.reset(options={"task_id": task})
    assert f"|{signed.problem(task).expression}|" in prompt
    for action, reward in [
        (str(env.problem(task).answer), 1.0),
        (str(signed.problem(task).answer), 0.0),
    ]:
        env.reset(options={"task_id": task})
        assert env.step(action)[1] == reward
    with pytest.raises(ValueError, match="absolute"):
        ArithmeticEnv(absolute="yes")


def test_arithmetic_negative_only_keeps_negative_values() -> None:
    env = ArithmeticEnv(
        max_digits=1, operations="-", allow_negative=True, negative_only=True, absolute=True,
        num_train=25, num_test=20,
    )  # fmt: skip
    ids = env.task_ids("train") + env.task_ids("test")
    assert len({env.problem(i).expression for i in ids}) == 45  # every one-digit a - b < 0
    for i in ids:
        left, _, right = env.problem(i).expression.strip("|").split()
        assert int(left) < int(right) and env.problem(i).answer == int(right) - int(left)
    with pytest.raises(ValueError, match="set allow_negative true"):
        ArithmeticEnv(max_digits=1, negative_only=True)
    with pytest.raises(ValueError, match="negative_only must be true or false"):
        ArithmeticEnv(max_digits=1, allow_negative=True, negative_only=1)


def test_arithmetic_rewards_boxed_and_bare_answers() -> None:
    env = gym.make("entrogym/Arithmetic-v0")
    obs, info = env.reset(options={"task_id": "train-00000"})
    answer = env.unwrapped.problem("train-00000").answer
    assert "\\boxed{}" in obs and len(obs) < 80
    for action, reward in [
        (f"\\boxed{{{answer}}}", 1.0),
        (f"The sum is {answer}", 1.0),
        (f"{answer + 1}", 0.0),
        ("no idea", 0.0),
    ]:
        env.reset(options={"task_id": "train-00000"})
        obs, r, terminated, truncated, info = env.step(action)
        assert (r, terminated, truncated) == (reward, True, False)
        assert info["success"] is (reward == 1.0) and info["reward_parts"] == {"correct": reward}


def test_math_env_episode() -> None:
    env = gym.make("entrogym/AIME-v0")
    obs, info = env.reset(options={"task_id": "2024-I-1"})
    assert "Aya" in obs and "\\boxed{}" in obs and info["max_response_tokens"] == 4096
    assert info["task_id"] == "2024-I-1" and "reference" not in info
    obs, reward, terminated, truncated, info = env.step("... so it takes \\boxed{204} minutes.")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["reward_parts"] == {"correct": 1.0}
    assert info["extracted_answer"] == "204" and info["grade_timed_out"] is False
    env.reset(options={"task_id": "2024-I-1"})
    _, reward, _, _, info = env.step("The final answer is 205.")
    assert reward == 0.0 and info["success"] is False
    with pytest.raises(RuntimeError, match="ended"):
        env.step("again")


def test_math_env_options_via_make() -> None:
    env = gym.make(
        "entrogym/AMC-v0", max_response_tokens=512, prompt_template="Q: {problem}\nA (boxed):"
    )
    obs, info = env.reset(seed=0)
    assert obs.startswith("Q: ") and obs.endswith("A (boxed):")
    assert info["max_response_tokens"] == 512
    for bad in ("no field", "{problem} {other}", "{problem} {"):
        with pytest.raises(ValueError, match="prompt_template"):
            gym.make("entrogym/AMC-v0", prompt_template=bad)
    with pytest.raises(ValueError, match="max_response_tokens"):
        gym.make("entrogym/AIME-v0", max_response_tokens=0)


def test_truncated_action_is_reported() -> None:
    env = gym.make("entrogym/AIME-v0")
    env.reset(seed=1)
    env.unwrapped.flag_action_truncated()
    *_, info = env.step("a long response cut at the token budget")
    assert info["action_truncated"] is True
    env.reset(seed=1)
    *_, info = env.step("\\boxed{1}")
    assert "action_truncated" not in info


def test_shipped_data_loads() -> None:
    problems = load_problems("aime_2024")
    assert len(problems) == 30 and all(p.answer.isdigit() for p in problems)
    assert len({p.id for p in load_problems("aime_1983_2023")}) == 918


# ----- bad input ---------------------------------------------------------------------------


def test_unknown_task_and_split_leave_state_alone() -> None:
    env = ArithmeticEnv(num_test=0)
    env.reset(options={"task_id": "train-00007"})
    with pytest.raises(ValueError, match="unknown task_id 'nope'"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(ValueError, match="split 'test' has no tasks"):
        env.reset(options={"split": "test"})
    with pytest.raises(ValueError, match="split 'test' has no tasks"):
        env.task_ids("test")
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        env.task_ids("valid")
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"task": "train-00001"})
    with pytest.raises(TypeError, match="task_id"):
        env.reset(options={"task_id": 7})
    assert env.task_id == "train-00007"  # the episode in progress survived every failed reset
    _, reward, terminated, _, info = env.step(f"\\boxed{{{env.problem('train-00007').answer}}}")
    assert reward == 1.0 and terminated and info["task_id"] == "train-00007"
    with pytest.raises(ValueError, match="unknown split"):
        ArithmeticEnv(split="dev")
    with pytest.raises(ValueError, match="only the split 'test'"):
        MathEnv("aime_2024", split="train")


@pytest.mark.parametrize(
    ("action", "error", "match"),
    [
        ("", ValueError, "empty"),
        (None, TypeError, "must be a str"),
        (42, TypeError, "must be a str"),
        (["\\boxed{1}"], TypeError, "must be a str"),
        ("x" * 70_000, ValueError, "more than the bound"),
    ],
)
def test_bad_actions_raise_and_keep_the_episode(action: Any, error: type, match: str) -> None:
    env = gym.make("entrogym/Arithmetic-v0", disable_env_checker=True)
    env.reset(options={"task_id": "train-00003"})
    with pytest.raises(error, match=match):
        env.step(action)
    inner = env.unwrapped
    assert inner.task_id == "train-00003" and inner.turn == 0
    _, _, terminated, _, _ = env.step("1")  # the episode goes on as if nothing happened
    assert terminated


def test_step_before_reset() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        ArithmeticEnv().step("1")


def test_malformed_dataset_lines_are_named(tmp_path: Path) -> None:
    good = '{"id": "a", "problem": "1+1?", "answer": "2"}'
    cases = {
        "not valid JSON": "{oops",
        "a JSON object": "[1, 2]",
        "missing field": '{"id": "b", "problem": "x"}',
        "'answer' must be": '{"id": "b", "problem": "x", "answer": null}',
        "duplicate id 'a'": good,
    }
    for message, bad in cases.items():
        path = tmp_path / "set.jsonl"
        path.write_text(f"{good}\n\n{bad}\n", encoding="utf-8")
        with pytest.raises(ValueError, match=f"set.jsonl, line 3: .*{message}"):
            load_problems(path)
        with pytest.raises(ValueError, match="line 3"):
            MathEnv(str(path))
    with pytest.raises(ValueError, match="neither a shipped dataset"):
        MathEnv("aime_1999")
    assert parse_jsonl(good + "\n", "mem")[0].answer == "2"
    path = tmp_path / "mine.jsonl"
    path.write_text(good + '\n{"id": "b", "problem": "2+2?", "answer": 4}\n', encoding="utf-8")
    env = MathEnv(str(path), grading_timeout=2.0)
    assert env.task_ids() == ["a", "b"] and env.split == "train"
    env.reset(options={"task_id": "b"})
    assert env.step("\\boxed{4}")[1] == 1.0


# ----- user envs -------------------------------------------------------------------------


class PlainEnv(gym.Env):
    """Not a TextEnv: plain Gymnasium with Text spaces and a task_ids method."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Text(
            64, min_length=0, charset=string.ascii_letters + string.digits + " "
        )
        self.action_space = gym.spaces.Text(64)
        self._task = "t0"

    def task_ids(self, split: str | None = None) -> list[str]:
        return ["t0", "t1"]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._task = (options or {}).get("task_id", "t0")
        return f"say {self._task}", {"task_id": self._task}

    def step(self, action: str):
        ok = action == self._task
        return "", float(ok), True, False, {"task_id": self._task, "success": ok}


def test_plain_user_env_works_with_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gym.register(id="usertest/Plain-v0", entry_point=PlainEnv)
    env = make_text_env("usertest/Plain-v0")
    assert task_ids_of(env) == ["t0", "t1"]
    env.reset(options={"task_id": "t1"})
    assert env.step("t1")[1] == 1.0
    # "module:id" imports the module that registers the env, as gymnasium.make does
    (tmp_path / "userenvmod.py").write_text(
        textwrap.dedent(
            """
            import gymnasium as gym

            class ModEnv(gym.Env):
                def __init__(self):
                    self.observation_space = gym.spaces.Text(64)
                    self.action_space = gym.spaces.Text(64)

                def task_ids(self, split=None):
                    return ["m0", "m1", "m2"]

            gym.register(id="usertest/Mod-v0", entry_point=ModEnv)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_text_env("userenvmod:usertest/Mod-v0")
    assert task_ids_of(env, "any") == ["m0", "m1", "m2"]
    with pytest.raises(TypeError, match="not a text env"):
        make_text_env("CartPole-v1")
    with pytest.raises(ValueError, match="cannot make env"):
        make_text_env("entrogym/NoSuchEnv-v0")
    with pytest.raises(ValueError, match="cannot make env"):
        make_text_env("no_such_module_xyz:usertest/Mod-v0")


def test_custom_env_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    namespace = runpy.run_path(str(ROOT / "examples" / "custom_env.py"), run_name="custom_env_test")
    rewards = namespace["main"]()
    assert rewards and all(r == 0.75 for r in rewards.values())
    env: TextEnv = gym.make("examples/Unscramble-v0").unwrapped
    obs, _ = env.reset(options={"task_id": "train-planet"})
    for guess in ("a", "b"):
        assert env.step(guess)[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step("c")
    assert (reward, terminated, truncated) == (0.0, False, True)  # turn limit
    assert info["success"] is False and info["turn_limit_reached"]

    class Reshuffled(namespace["UnscrambleEnv"]):  # a new scramble at every reset
        def _start_task(self, task_id):
            letters = "".join(self.np_random.permutation(list(self._word(task_id))))
            return f"Unscramble '{letters}'.", {}

    with pytest.raises(TextEnvCheckError) as caught:
        check_text_env(Reshuffled())
    assert caught.value.check == "check_prompt_is_stable"
    assert caught.value.task_id == "train-planet"


def test_render_ansi() -> None:
    env = ArithmeticEnv(render_mode="ansi")
    obs, _ = env.reset(options={"task_id": "train-00001"})
    env.step("42")
    text = env.render()
    assert text is not None and obs in text and "[agent] 42" in text
    assert ArithmeticEnv().render() is None
    with pytest.raises(ValueError, match="render_mode"):
        ArithmeticEnv(render_mode="human")
