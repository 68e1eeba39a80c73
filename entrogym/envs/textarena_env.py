"""TextArena's single-player games as multi-turn text envs (``entrogym/TextArena-v0``).

``gymnasium.make("entrogym/TextArena-v0", game="TowerOfHanoi-v0")`` wraps one game of the
``textarena`` package (the ``textarena`` extra). A task is one game seeded by its task id:
``train`` and ``test`` use disjoint seed ranges, and the same task always deals the same
board. Each turn's observation is what the game said since the agent's last move (the move's
outcome and the new board), not the replayed history: the agent keeps its own transcript.

- The terminal reward is the game's own (TextArena's single-player rewards lie in [-1, 1]:
  1 for a win, a completion share or -1 when the game ends otherwise). ``info["success"]`` is
  a reward of 1. Invalid moves follow the game's rules: TextArena warns once and ends the
  game on the next invalid move.
- Games that need a second player are refused: this env plays single-player games only.
- Games that need data fetched at run time (NLTK corpora such as ``words``) are refused in one
  line naming the missing data, unless it is already installed: nothing is downloaded.
- TextArena seeds Python's global ``random``; every game call here runs on the env's own
  random state, so the trainer's and other envs' randomness is left alone.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from entrogym.envs.base import TextEnv, Turn
from entrogym.extras import require

# Test games are seeded this far above the training seeds.
TEST_SEED_OFFSET = 100_000_000
# NLTK resources the games load, and where nltk.data.find looks for each.
NLTK_PATHS = {
    "words": "corpora/words",
    "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng",
}
_RANDOM_LOCK = threading.Lock()
# Games whose module uses this play against a hosted LLM (a network service).
ONLINE_MARKER = "OpenRouterAgent"


class MissingRunTimeData(ValueError):
    """A game needs data that would have to be downloaded at run time."""


def _registry() -> dict[str, Any]:
    require("textarena")
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def _module_source(entry_point: Any) -> str:
    """The source text of a game's module, read without importing it (importing some games
    downloads NLTK data)."""
    if not isinstance(entry_point, str) or not entry_point.startswith("textarena."):
        return ""
    import textarena

    # Found by path: importlib's find_spec would import the game's package, and with it the
    # game (some fail to import, some download data as they do).
    relative = entry_point.split(":")[0].split(".")[1:]
    path = Path(textarena.__file__).parent.joinpath(*relative).with_suffix(".py")
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def single_player_games() -> list[str]:
    """TextArena's registered single-player game ids (the ``-raw`` and ``-train`` wrapper
    variants left out: this env takes the game itself)."""
    games = []
    for game_id, spec in _registry().items():
        if game_id.endswith(("-raw", "-train")):
            continue
        if "SinglePlayerState" in _module_source(spec.entry_point):
            games.append(game_id)
    return sorted(games)


def _version() -> str:
    from importlib.metadata import version

    return version("textarena")


def _nltk_missing() -> list[str]:
    import nltk

    missing = []
    for name, path in NLTK_PATHS.items():
        try:
            nltk.data.find(path)
        except LookupError:
            missing.append(name)
    return missing


@contextlib.contextmanager
def _no_downloads(game: str) -> Iterator[None]:
    """``nltk.download`` refuses while a game is imported or played: a resource that is
    installed is found, one that is not is a :class:`MissingRunTimeData` naming it."""
    import nltk

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        names = info_or_id if isinstance(info_or_id, list | tuple) else [info_or_id]
        missing = [n for n in names if n in _nltk_missing() or n not in NLTK_PATHS]
        if missing:
            raise MissingRunTimeData(
                f"TextArena game {game!r} needs the NLTK data {missing}, which is not installed "
                "and is never downloaded at run time; install it beforehand "
                f"(python -m nltk.downloader {' '.join(map(str, missing))}) or pick another game"
            )
        return True

    original = nltk.download
    nltk.download = refuse
    try:
        yield
    except LookupError as exc:  # a corpus read without a download attempt
        raise MissingRunTimeData(
            f"TextArena game {game!r} needs NLTK data that is not installed "
            f"({str(exc).strip().splitlines()[0] if str(exc).strip() else exc}); install it "
            "beforehand or pick another game"
        ) from exc
    finally:
        nltk.download = original


class TextArenaEnv(TextEnv):
    """One single-player TextArena game; a task is a seeded deal of it.

    Args:
        game: a TextArena game id, e.g. ``TowerOfHanoi-v0``, ``Minesweeper-v0-small``,
            ``GuessTheNumber-v0``, ``FrozenLake-v0``.
        game_kwargs: options of the game's constructor, over its registered ones.
        num_train, num_test: tasks (seeds) in the ``train`` and ``test`` splits.
        seed: the first training seed (test seeds start ``TEST_SEED_OFFSET`` higher).
        split: the split ``reset`` draws from without a ``task_id``.
        max_turns: moves per episode before entrogym ends it (reward 0, not a success);
            None = the game's own turn limit only.
    """

    eval_split = "test"
    reward_range = (-1.0, 1.0)

    def __init__(
        self,
        game: str = "TowerOfHanoi-v0",
        *,
        game_kwargs: dict[str, Any] | None = None,
        num_train: int = 1000,
        num_test: int = 100,
        seed: int = 0,
        split: str = "train",
        max_turns: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        registry = _registry()
        for name, value, low in (("num_train", num_train, 1), ("num_test", num_test, 1),
                                 ("seed", seed, 0)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max(num_train, num_test) >= TEST_SEED_OFFSET:
            raise ValueError(f"num_train and num_test must be below {TEST_SEED_OFFSET}")
        spec = registry.get(game)
        if spec is None or game.endswith(("-raw", "-train")):
            raise ValueError(
                f"unknown TextArena game {game!r}; the single-player games: "
                f"{', '.join(single_player_games())}"
            )
        source = _module_source(spec.entry_point)
        if "SinglePlayerState" not in source:
            raise ValueError(
                f"TextArena game {game!r} needs more than one player; entrogym/TextArena-v0 "
                f"plays single-player games only: {', '.join(single_player_games())}"
            )
        if ONLINE_MARKER in source:
            raise MissingRunTimeData(
                f"TextArena game {game!r} needs an online LLM game master ({ONLINE_MARKER}), "
                "and entrogym reaches no service at run time; pick another game"
            )
        self.game, self.game_kwargs = game, dict(game_kwargs or {})
        self.num_train, self.num_test, self.seed = num_train, num_test, seed
        self._random = random.Random(seed)
        self._game: Any = None
        self._factory = self._game_factory(spec)
        self._game_reward: float | None = None
        super().__init__(split=split, max_turns=max_turns or 1_000_000, render_mode=render_mode)
        self.resolve_split(split)

    def _game_factory(self, spec: Any) -> Any:
        """The game's class with its registered kwargs, without TextArena's wrappers (they
        replay the history into each observation; here the agent keeps the transcript)."""
        entry = spec.entry_point
        with _no_downloads(self.game):
            if isinstance(entry, str):
                module, _, name = entry.partition(":")
                try:
                    entry = getattr(importlib.import_module(module), name)
                except (ImportError, SyntaxError, AttributeError) as exc:
                    raise ValueError(
                        f"TextArena game {self.game!r} does not load in textarena "
                        f"{_version()} ({type(exc).__name__}: {exc}); pick another game"
                    ) from exc
            kwargs = {**spec.kwargs, **self.game_kwargs}
            try:
                entry(**kwargs)  # a bad game_kwargs fails here, at construction
            except TypeError as exc:
                raise ValueError(f"TextArena game {self.game!r}: bad game_kwargs: {exc}") from exc
        return lambda: entry(**kwargs)

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run a game call on this env's random state (TextArena uses the global one)."""
        with _RANDOM_LOCK, _no_downloads(self.game):
            saved = random.getstate()
            random.setstate(self._random.getstate())
            try:
                yield
            finally:
                self._random.setstate(random.getstate())
                random.setstate(saved)

    # ----- tasks ---------------------------------------------------------------------------

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def task_ids(self, split: str | None = None) -> list[str]:
        name = self.resolve_split(split)
        count = self.num_train if name == "train" else self.num_test
        return [f"{name}-{i:05d}" for i in range(count)]

    def has_task(self, task_id: str) -> bool:
        split, _, index = task_id.partition("-")
        count = {"train": self.num_train, "test": self.num_test}.get(split, 0)
        return index.isdigit() and int(index) < count

    def task_seed(self, task_id: str) -> int:
        """The seed that deals ``task_id``'s game."""
        split, _, index = task_id.partition("-")
        return self.seed + int(index) + (TEST_SEED_OFFSET if split == "test" else 0)

    # ----- episode -------------------------------------------------------------------------

    def _observation(self) -> str:
        """What the game said since the last call (the agent's own move is not repeated)."""
        from textarena import ObservationType

        _, messages = self._game.get_observation()
        texts = (str(m[1]).strip() for m in messages if m[2] != ObservationType.PLAYER_ACTION)
        return "\n".join(t for t in texts if t)

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        with self._own_random():
            random.seed(self.task_seed(task_id))
            game = self._factory()
            game.reset(num_players=1, seed=self.task_seed(task_id))
            self._game = game
            observation = self._observation()
        self._game_reward = None
        return observation, {"game": self.game, "game_seed": self.task_seed(task_id)}

    def _respond(self, action: str) -> Turn:
        with self._own_random():
            done, step_info = self._game.step(action)
            observation = self._observation()
            if not done:
                return Turn(observation=observation, info={"game_info": dict(step_info or {})})
            rewards, game_info = self._game.close()
        reward = float((rewards or {}).get(0, 0.0))
        info = dict((game_info or {}).get(0, {}))
        return Turn(
            observation=observation,
            done=True,
            reward=reward,
            success=reward >= 1.0,
            reward_parts={"game": reward},
            info={"reason": info.get("reason"), "invalid_move": bool(info.get("invalid_move"))},
        )

    def _on_truncate(self) -> Turn:
        return Turn(done=True, reward=0.0, success=False, reward_parts={"game": 0.0},
                    info={"reason": "entrogym's max_turns or the agent's context ran out"})  # fmt: skip
