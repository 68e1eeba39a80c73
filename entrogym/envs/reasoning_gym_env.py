"""reasoning-gym's procedural datasets as single-turn text envs (``entrogym/ReasoningGym-v0``).

``gymnasium.make("entrogym/ReasoningGym-v0", dataset="leg_counting", size=500, seed=0)`` makes
one dataset; ``datasets={"leg_counting": 1, "basic_arithmetic": 2}`` mixes several with
weights, as reasoning-gym's ``CompositeDataset`` does. Every entry is generated offline by
the ``reasoning-gym`` package (the ``reasoning-gym`` extra), lazily, when its task is first
used.

- The prompt is the entry's question followed by reasoning-gym's own answer convention:
  the final answer between ``<answer>`` and ``</answer>``. A ``\\boxed{}`` answer is accepted
  too (when there is no ``<answer>`` tag).
- ``bare_number=True`` (off by default: it changes what is graded) also takes the response's
  last number as its answer when it has neither a tag nor a box, as ``Arithmetic-v0`` does:
  a 135M model rarely tags its answer, so on a dataset with numeric answers this is what puts
  the task within its reach. Where an answer is not a number it never matches.
- The reward is the dataset's own ``score_answer`` (in [0, 1]); ``info["success"]`` is
  ``score == 1``.
- Splits ``train`` (``size`` entries) and ``test`` (``test_size``) come from disjoint seed
  ranges: reasoning-gym draws entry ``i`` of a dataset seeded ``s`` from ``Random(s + i)``, so
  train uses seeds ``seed .. seed + size - 1`` and test starts :data:`TEST_SEED_OFFSET` later.
- ``env.unwrapped.entry(task_id)`` is the reasoning-gym entry (``question``, ``answer``,
  ``metadata``) behind a task, for evaluation tooling; the agent never sees it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from entrogym.envs.answers import _last_box, last_number
from entrogym.envs.base import TextEnv, Turn
from entrogym.extras import require

ANSWER_INSTRUCTION = (
    "Give your final answer between <answer> and </answer> tags, for example <answer>42</answer>."
)
# Test entries are drawn from seeds this far above the training seeds (sizes stay below it).
TEST_SEED_OFFSET = 100_000_000
# Only the last part of a response is searched for the answer: extraction stays linear-time.
MAX_SEARCHED_CHARS = 1_000_000


def dataset_names() -> list[str]:
    """The names of reasoning-gym's registered datasets (``composite`` excluded)."""
    require("reasoning-gym")
    import reasoning_gym  # noqa: F401  (registers the datasets)
    from reasoning_gym.factory import DATASETS

    return sorted(name for name in DATASETS if name != "composite")


def extract_answer(response: str, *, bare_number: bool = False) -> str | None:
    """The last ``<answer>...</answer>`` of ``response`` (reasoning-gym's convention), else
    the content of its last ``\\boxed{}``, else (with ``bare_number``) its last number written
    plainly (no thousands commas, an ASCII minus), else None."""
    from reasoning_gym.utils import extract_answer as tagged

    text = response[-MAX_SEARCHED_CHARS:]
    answer = tagged(text, tag_name="answer")
    if answer is None:
        boxed = _last_box(text)
        answer = boxed.strip() if boxed is not None else None
    if answer is None and bare_number:
        number = last_number(text)
        answer = number.replace(",", "").replace("−", "-") if number is not None else None
    return answer


def _check_names(names: list[str]) -> None:
    known = dataset_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown reasoning-gym dataset(s) {unknown}; the {len(known)} available: "
            f"{', '.join(known)}"
        )


def _is_weight(weight: Any) -> bool:
    """A mix weight is a finite number > 0 (reasoning-gym's sampler refuses an infinite total
    only when the first task is drawn)."""
    number = isinstance(weight, int | float) and not isinstance(weight, bool)
    return number and math.isfinite(weight) and weight > 0


def _composite_specs(datasets: Any, config: Mapping[str, Any]) -> list[Any]:
    """``DatasetSpec``s from ``{name: weight}`` or ``[{name, weight, config}, ...]``."""
    from reasoning_gym.composite import DatasetSpec

    if isinstance(datasets, Mapping):
        items = [{"name": n, "weight": w, "config": dict(config.get(n, {}))}
                 for n, w in datasets.items()]  # fmt: skip
    elif isinstance(datasets, list | tuple):
        items = [dict(d) for d in datasets]
    else:
        raise ValueError(
            "datasets must be {name: weight, ...} or a list of {name, weight, config}, "
            f"got {datasets!r}"
        )
    specs = []
    for item in items:
        unknown = set(item) - {"name", "weight", "config"}
        if unknown or "name" not in item:
            raise ValueError(f"a datasets entry takes name, weight and config; got {item!r}")
        weight = item.get("weight", 1.0)
        if not _is_weight(weight):
            raise ValueError(
                f"dataset {item['name']!r}: weight must be a finite number > 0, got {weight!r}"
            )
        specs.append(DatasetSpec(item["name"], float(weight), dict(item.get("config") or {})))
    if not specs:
        raise ValueError("datasets is empty; name at least one reasoning-gym dataset")
    _check_names([s.name for s in specs])
    return specs


class ReasoningGymEnv(TextEnv):
    """One reasoning-gym dataset, or a weighted mix of several, as a single-turn text env.

    Args:
        dataset: a reasoning-gym dataset name (e.g. ``leg_counting``); or None with
            ``datasets``.
        datasets: a weighted mix instead of one dataset: ``{name: weight}``, or a list of
            ``{"name", "weight", "config"}`` (reasoning-gym's ``DatasetSpec``).
        config: the dataset's own options (its config dataclass's fields, e.g.
            ``{"min_animals": 3}``); for a mix given as ``{name: weight}``, ``{name: {...}}``.
        size: entries in the ``train`` split.
        test_size: entries in the ``test`` split (drawn from disjoint seeds).
        seed: seed of the train entries (the test entries use ``seed + TEST_SEED_OFFSET``).
        split: the split ``reset`` draws from without a ``task_id``.
        instruction: text appended to each question (the answer format).
        bare_number: also grade a response's last number when it has no tagged or boxed
            answer (module docstring).
    """

    eval_split = "test"

    def __init__(
        self,
        dataset: str | None = None,
        *,
        datasets: Any = None,
        config: Mapping[str, Any] | None = None,
        size: int = 500,
        test_size: int = 100,
        seed: int = 0,
        split: str = "train",
        instruction: str = ANSWER_INSTRUCTION,
        bare_number: bool = False,
        render_mode: str | None = None,
    ) -> None:
        require("reasoning-gym")
        if not isinstance(bare_number, bool):
            raise ValueError(f"bare_number must be true or false, got {bare_number!r}")
        for name, value, low in (("size", size, 1), ("test_size", test_size, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max(size, test_size) >= TEST_SEED_OFFSET:
            raise ValueError(f"size and test_size must be below {TEST_SEED_OFFSET}")
        if (dataset is None) == (datasets is None):
            raise ValueError(
                "name one reasoning-gym dataset (dataset=NAME) or a weighted mix "
                "(datasets={NAME: WEIGHT, ...}), not both or neither"
            )
        if config is not None and not isinstance(config, Mapping):
            raise ValueError(f"config must be a mapping of the dataset's options, got {config!r}")
        self.dataset, self.datasets = dataset, datasets
        self.config = dict(config or {})
        self.size, self.test_size, self.seed = size, test_size, seed
        self.instruction, self.bare_number = instruction, bare_number
        self._sources = {
            "train": self._build(size, seed),
            "test": self._build(test_size, seed + TEST_SEED_OFFSET),
        }
        self._entries: dict[str, dict[str, Any]] = {}
        super().__init__(split=split, max_turns=1, render_mode=render_mode)
        self.resolve_split(split)

    def _build(self, size: int, seed: int) -> Any:
        import reasoning_gym

        try:
            if self.dataset is not None:
                _check_names([self.dataset])
                return reasoning_gym.create_dataset(
                    self.dataset, **{**self.config, "size": size, "seed": seed}
                )
            from reasoning_gym.composite import CompositeConfig, CompositeDataset

            specs = _composite_specs(self.datasets, self.config)
            return CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))
        except (TypeError, AssertionError) as exc:  # a bad config field or value
            name = self.dataset or "composite"
            raise ValueError(
                f"reasoning-gym dataset {name!r}: bad config {self.config}: {exc}"
            ) from exc

    # ----- tasks ---------------------------------------------------------------------------

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def task_ids(self, split: str | None = None) -> list[str]:
        name = self.resolve_split(split)
        return [f"{name}-{i:05d}" for i in range(len(self._sources[name]))]

    def has_task(self, task_id: str) -> bool:
        return self._locate(task_id) is not None

    def _locate(self, task_id: str) -> tuple[str, int] | None:
        split, _, index = task_id.partition("-")
        if split not in self._sources or not index.isdigit():
            return None
        i = int(index)
        return (split, i) if i < len(self._sources[split]) else None

    def entry(self, task_id: str) -> dict[str, Any]:
        """The reasoning-gym entry (``question``, ``answer``, ``metadata``) of ``task_id``."""
        where = self._locate(task_id)
        if where is None:
            raise ValueError(f"unknown task_id {task_id!r}; list the valid ones with task_ids()")
        if task_id not in self._entries:
            split, i = where
            self._entries[task_id] = self._sources[split][i]
        return self._entries[task_id]

    def _score(self, answer: str | None, task_id: str) -> float:
        entry = self.entry(task_id)
        source = self._sources[task_id.partition("-")[0]]
        name = entry.get("metadata", {}).get("source_dataset")
        scorer = getattr(source, "datasets", {}).get(name, source)  # a mix: the entry's own
        return float(scorer.score_answer(answer, entry))

    # ----- episode -------------------------------------------------------------------------

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        entry = self.entry(task_id)
        dataset = entry.get("metadata", {}).get("source_dataset", self.dataset)
        return f"{entry['question']}\n\n{self.instruction}", {"dataset": dataset}

    def _respond(self, action: str) -> Turn:
        assert self._task_id is not None
        answer = extract_answer(action, bare_number=self.bare_number)
        score = self._score(answer, self._task_id)
        return Turn(
            done=True,
            reward=score,
            success=score == 1.0,
            reward_parts={"score": score},
            info={"extracted_answer": answer},
        )
