"""``entrogym/ReasoningGym-v0`` on the real reasoning-gym package (the ``reasoning-gym`` extra)."""

from __future__ import annotations

import pytest

import entrogym  # noqa: F401  (registers the built-in ids)
from entrogym.envs import TextEnvProtocol, check_text_env, make_text_env
from entrogym.envs.reasoning_gym_env import TEST_SEED_OFFSET, dataset_names, extract_answer

ENV = "entrogym/ReasoningGym-v0"


def test_the_package_has_its_hundred_datasets() -> None:
    names = dataset_names()
    assert len(names) >= 100 and "leg_counting" in names and "composite" not in names


# Every dataset of reasoning-gym 0.1.25 passes (105 of 105; docs/envs.md); each check is ~0.1 s.
@pytest.mark.parametrize("dataset", dataset_names())
def test_every_dataset_passes_the_text_env_check(dataset: str) -> None:
    env = make_text_env(ENV, dataset=dataset, size=4, test_size=2)
    try:
        assert isinstance(env.unwrapped, TextEnvProtocol)
        check_text_env(env, max_tasks=2)
        check_text_env(env, split="test", max_tasks=1, seed=1)
    finally:
        env.close()


def test_reward_is_the_datasets_own_score_and_success_is_a_full_score() -> None:
    env = make_text_env(ENV, dataset="leg_counting", size=5, test_size=3)
    inner = env.unwrapped
    entry = inner.entry("test-00001")
    assert set(entry) >= {"question", "answer", "metadata"}
    prompt, info = env.reset(options={"task_id": "test-00001"})
    assert entry["question"] in prompt and "<answer>" in prompt  # reasoning-gym's convention
    assert entry["answer"] not in prompt.replace(entry["question"], "")  # the agent never sees it
    _, reward, done, _, info = env.step(f"so <answer>{entry['answer']}</answer>")
    assert done and reward == 1.0 and info["success"] is True
    env.reset(options={"task_id": "test-00001"})
    _, reward, _, _, info = env.step(f"the legs: \\boxed{{{entry['answer']}}}")  # boxed works too
    assert reward == 1.0 and info["success"] is True
    env.reset(options={"task_id": "test-00001"})
    _, reward, _, _, info = env.step("<answer>-1</answer>")
    assert reward == inner._score("-1", "test-00001") < 1 and info["success"] is False


def test_partial_credit_is_kept_and_is_not_success() -> None:
    # spell_backward's own score_answer gives partial credit for a near-miss
    env = make_text_env(ENV, dataset="spell_backward", size=3)
    entry = env.unwrapped.entry("train-00000")
    near = entry["answer"][:-1] + ("x" if entry["answer"][-1] != "x" else "y")
    env.reset(options={"task_id": "train-00000"})
    _, reward, _, _, info = env.step(f"<answer>{near}</answer>")
    assert reward == env.unwrapped._sources["train"].score_answer(near, entry)
    assert 0 < reward < 1 and info["success"] is False


def test_train_and_test_come_from_disjoint_seeds() -> None:
    env = make_text_env(ENV, dataset="basic_arithmetic", size=200, test_size=50, seed=7)
    inner = env.unwrapped
    assert inner._sources["train"].seed == 7
    assert inner._sources["test"].seed == 7 + TEST_SEED_OFFSET
    train = {inner.entry(t)["question"] for t in inner.task_ids("train")}
    test = {inner.entry(t)["question"] for t in inner.task_ids("test")}
    assert len(train) == 200 and len(test) == 50 and not train & test
    again = make_text_env(ENV, dataset="basic_arithmetic", size=200, test_size=50, seed=7)
    assert again.unwrapped.entry("test-00003") == inner.entry("test-00003")  # reproducible


def test_a_weighted_mix_of_datasets() -> None:
    env = make_text_env(
        ENV, datasets={"leg_counting": 1, "basic_arithmetic": 3}, size=40, test_size=4
    )
    check_text_env(env, max_tasks=3)
    sources = [
        env.unwrapped.entry(t)["metadata"]["source_dataset"] for t in env.unwrapped.task_ids()
    ]
    assert set(sources) == {"leg_counting", "basic_arithmetic"}
    assert sources.count("basic_arithmetic") > sources.count("leg_counting")
    task = next(t for t in env.unwrapped.task_ids() if "leg" not in str(env.unwrapped.entry(t)))
    entry = env.unwrapped.entry(task)
    env.reset(options={"task_id": task})
    assert env.step(f"<answer>{entry['answer']}</answer>")[1] == 1.0
    spec = [{"name": "leg_counting", "weight": 1, "config": {"min_animals": 2, "max_animals": 2}}]
    listed = make_text_env(ENV, datasets=spec, size=3)
    assert listed.unwrapped.entry("train-00000")["metadata"]["num_animals"] == 2


def test_answer_extraction() -> None:
    assert extract_answer("a <answer>1</answer> b <answer> 2 </answer>") == "2"
    assert extract_answer("so \\boxed{x+1}.") == "x+1"
    assert extract_answer("<answer>7</answer> \\boxed{8}") == "7"  # the tag wins
    assert extract_answer("no answer here") is None
    assert extract_answer("there are 12 legs") is None  # a bare number only when asked for


def test_bare_number_answers_are_graded_only_when_asked_for() -> None:
    assert extract_answer("so 3, then 1,024 legs", bare_number=True) == "1024"
    assert extract_answer("the value is −7.", bare_number=True) == "-7"
    assert extract_answer("<answer>5</answer> not 6", bare_number=True) == "5"  # the tag wins
    assert extract_answer("no number", bare_number=True) is None
    plain = make_text_env(ENV, dataset="leg_counting", size=2, test_size=2)
    bare = make_text_env(ENV, dataset="leg_counting", size=2, test_size=2, bare_number=True)
    answer = plain.unwrapped.entry("test-00000")["answer"]
    wrong = str(int(answer) + 1)
    for env, expected in ((plain, 0.0), (bare, 1.0)):
        env.reset(options={"task_id": "test-00000"})
        _, reward, _, _, info = env.step(f"I count {wrong}, no: {answer} legs in all.")
        assert reward == expected, env.unwrapped.bare_number
    assert info["extracted_answer"] == answer
    bare.reset(options={"task_id": "test-00000"})
    assert bare.step(f"{answer} or so, <answer>{wrong}</answer>")[1] == 0.0  # the tag counts
    check_text_env(bare, max_tasks=2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "leg_countin"}, "unknown reasoning-gym dataset.*leg_counting"),
        ({}, "name one reasoning-gym dataset"),
        ({"dataset": "leg_counting", "datasets": {"gcd": 1}}, "not both"),
        ({"datasets": {"gcd": 0}}, "weight must be a finite number > 0"),
        ({"datasets": {"nope": 1}}, "unknown reasoning-gym dataset"),
        ({"dataset": "leg_counting", "config": {"no_such_field": 1}}, "bad config"),
        ({"dataset": "leg_counting", "size": 0}, "size must be"),
        ({"dataset": "leg_counting", "bare_number": "yes"}, "bare_number must be true or false"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        make_text_env(ENV, **kwargs)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("env_kwargs", "module", "extra"),
    [
        ({"dataset": "leg_counting"}, "reasoning_gym", "reasoning-gym"),
        ({"game": "TowerOfHanoi-v0"}, "textarena", "textarena"),
    ],
)
def test_a_missing_extra_is_named(env_kwargs: dict, module: str, extra: str, monkeypatch) -> None:
    import entrogym.extras as extras

    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name == module else real(name, *a))  # fmt: skip
    env_id = ENV if "dataset" in env_kwargs else "entrogym/TextArena-v0"
    with pytest.raises(ValueError, match=rf'pip install -e "\.\[{extra}\]"') as caught:
        make_text_env(env_id, **env_kwargs)
    assert "\n" not in str(caught.value)
