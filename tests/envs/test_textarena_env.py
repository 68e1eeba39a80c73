"""``entrogym/TextArena-v0`` on the real TextArena package (the ``textarena`` extra)."""

from __future__ import annotations

import random

import pytest

import entrogym  # noqa: F401  (registers the built-in ids)
from entrogym.envs import TextEnvProtocol, check_text_env, make_text_env
from entrogym.envs.textarena_env import MissingRunTimeData, single_player_games

ENV = "entrogym/TextArena-v0"
GAMES = ["TowerOfHanoi-v0", "Minesweeper-v0-small", "GuessTheNumber-v0", "FrozenLake-v0",
         "LightsOut-v0", "Sudoku-v0-very-easy"]  # fmt: skip


@pytest.mark.parametrize("game", GAMES)
def test_games_pass_the_text_env_check(game: str) -> None:
    env = make_text_env(ENV, game=game, num_train=3, num_test=2)
    try:
        assert isinstance(env.unwrapped, TextEnvProtocol)
        check_text_env(env, max_tasks=2)
        check_text_env(env, split="test", max_tasks=1, seed=2)
    finally:
        env.close()


def _play(env, task_id: str, moves) -> list[tuple]:
    prompt, _ = env.reset(options={"task_id": task_id})
    steps, observation = [], prompt
    while True:
        step = env.step(moves(observation))
        steps.append(step)
        observation = step[0]
        if step[2] or step[3]:
            return steps


def test_tower_of_hanoi_solved_by_scripted_moves_pays_the_games_reward() -> None:
    env = make_text_env(ENV, game="TowerOfHanoi-v0")
    solution = iter(["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"])
    steps = _play(env, "train-00000", lambda _: next(solution))
    assert len(steps) == 7 and [s[1] for s in steps] == [0.0] * 6 + [1.0]
    assert steps[-1][4]["success"] is True and steps[-1][2] is True
    # each observation is the latest feedback (the new board), not the replayed history
    assert steps[3][0].count("Current Board") == 1 and "C: [3]" in steps[3][0]
    assert "[A C]" not in steps[0][0]  # the agent's own move is not echoed back


def test_guess_the_number_by_bisection_on_the_games_hints() -> None:
    env = make_text_env(ENV, game="GuessTheNumber-v0", num_train=5)
    for task in ["train-00000", "train-00004"]:
        low, high, guess = 1, 20, None

        def bisect(observation: str) -> str:
            nonlocal low, high, guess
            if guess is not None and "higher" in observation.lower():
                low = guess + 1
            elif guess is not None and "lower" in observation.lower():
                high = guess - 1
            guess = (low + high) // 2
            return f"[{guess}]"

        steps = _play(env, task, bisect)
        assert 1 < len(steps) <= 5 or steps[-1][1] == 1.0
        assert steps[-1][1] == 1.0 and steps[-1][4]["success"] is True


def test_invalid_moves_follow_the_games_rules() -> None:
    env = make_text_env(ENV, game="TowerOfHanoi-v0")
    env.reset(options={"task_id": "train-00000"})
    observation, reward, done, _, _ = env.step("no move here")
    assert not done and reward == 0.0 and "invalid move" in observation  # a warning first
    observation, reward, done, _, info = env.step("still nothing")
    assert done and reward == 0.0 and info["success"] is False and info["invalid_move"] is True


def test_a_task_is_a_fixed_deal_and_leaves_global_random_alone() -> None:
    env = make_text_env(ENV, game="Minesweeper-v0-small", num_train=4, num_test=4)
    state = random.getstate()
    first = env.reset(options={"task_id": "train-00002"})[0]
    env.step("[2 2]")
    assert random.getstate() == state  # TextArena seeds the global random; this env does not
    other = make_text_env(ENV, game="Minesweeper-v0-small", num_train=4, num_test=4)
    other.reset(options={"task_id": "test-00001"})
    assert env.reset(options={"task_id": "train-00002"})[0] == first
    seeds = {
        env.unwrapped.task_seed(t) for s in ("train", "test") for t in env.unwrapped.task_ids(s)
    }
    assert len(seeds) == 8  # train and test deals come from disjoint seeds


def test_entrogyms_turn_cap_ends_an_episode_without_success() -> None:
    env = make_text_env(ENV, game="TowerOfHanoi-v0", max_turns=2)
    steps = _play(env, "train-00000", lambda _: "[A C]")
    assert len(steps) == 2 and steps[-1][3] is True and steps[-1][1] == 0.0


@pytest.mark.parametrize(
    ("game", "error", "message"),
    [
        ("TowerOfHanoy-v0", ValueError, "unknown TextArena game.*TowerOfHanoi-v0"),
        ("Chess-v0", ValueError, "needs more than one player.*single-player games only"),
        ("Wordle-v0", MissingRunTimeData, "needs the NLTK data .*never downloaded"),
        ("Hangman-v0", MissingRunTimeData, "needs the NLTK data \\['words'\\]"),
        ("TwentyQuestions-v0", MissingRunTimeData, "online LLM game master"),
        ("Klondike-v0", ValueError, "does not load in textarena"),
    ],
)
def test_refused_games_are_one_line_errors(game: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        make_text_env(ENV, game=game)
    assert "\n" not in str(caught.value)


def test_the_single_player_list_holds_the_games() -> None:
    games = single_player_games()
    assert set(GAMES) <= set(games) and "Chess-v0" not in games
    assert not any(g.endswith(("-raw", "-train")) for g in games)
