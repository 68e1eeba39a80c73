"""The world's tasks: templates, splits and scenarios, generated from a seed.

A *scenario* is one world (contacts with their phones, some earlier messages, events and
orders) and one template; its three *variants* are tasks in that world with different targets
(AppWorld's scenarios likewise share a task generator). Task ids are
``SPLIT-TEMPLATE-NNNN-V`` (e.g. ``train-msg-0007-2``); the scenario id drops ``-V``.

Splits:

- ``train``: the :data:`TRAIN_TEMPLATES`, with names, texts, titles and items drawn from the
  training pools;
- ``test_normal``: the same templates with names and values never used in ``train``;
- ``test_challenge``: the :data:`CHALLENGE_TEMPLATES`, combinations of goals (and step counts)
  never seen in ``train``, with the test pools.

Every scenario is drawn from its own random stream (``task_seed``, split, template, number),
so a task's content does not depend on how many tasks a split has.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from entrogym.envs.world.apps import DAYS, Contact, Event, Message, Order, WorldState, plural
from entrogym.envs.world.grading import BlockGoal, EventGoal, Goal, MessageGoal, OrderGoal

SPLITS = ("train", "test_normal", "test_challenge")
VARIANTS = 3
CONTACTS_PER_WORLD = 6


@dataclass(frozen=True)
class Pools:
    """What one split's tasks draw their values from."""

    names: tuple[str, ...]
    texts: tuple[str, ...]
    titles: tuple[str, ...]
    items: tuple[str, ...]


TRAIN_POOLS = Pools(
    names=("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy",
           "Karl", "Laura", "Mike", "Nina", "Oscar", "Paula", "Quinn", "Rita", "Sam", "Tina",
           "Uma", "Victor", "Wendy", "Adam", "Beth", "Chris", "Diana", "Eric", "Fiona",
           "George", "Hannah", "Isaac", "Julia", "Kevin", "Lily", "Mark", "Nora", "Owen"),
    texts=("hello", "see you soon", "call me", "good morning", "thanks", "on my way",
           "happy birthday", "good night", "dinner at 7", "meeting moved", "I am home",
           "bring snacks", "see you at noon", "congrats", "call you later", "let's talk"),
    titles=("dentist", "yoga", "team meeting", "haircut", "piano lesson", "doctor", "gym",
            "book club", "soccer practice", "lunch with mom", "dance class", "interview"),
    items=("apple", "notebook", "pen", "candle", "mug", "towel", "lamp", "pillow", "plate",
           "sponge"),
)  # fmt: skip
TEST_POOLS = Pools(
    names=("Peter", "Rose", "Steve", "Tara", "Ursula", "Vince", "Will", "Amy", "Ben", "Clara",
           "Dylan", "Emma", "Felix", "Gina", "Henry", "Iris", "Jack", "Kate", "Leo", "Mia"),
    texts=("where are you", "all done", "be right there", "good luck", "miss you",
           "welcome back", "sounds good", "take care"),
    titles=("car service", "vet", "movie night", "swimming", "bank appointment", "tennis"),
    items=("cup", "bottle", "spoon", "jar", "basket", "blanket"),
)  # fmt: skip
CATALOG = tuple(sorted(TRAIN_POOLS.items + TEST_POOLS.items + ("chair", "rug")))


@dataclass(frozen=True)
class Task:
    """One task: its instruction, the world it starts in and the goals its checks grade."""

    task_id: str
    scenario_id: str
    template: str
    split: str
    instruction: str
    state: WorldState
    goals: tuple[Goal, ...]


class _Draw:
    """Random choices of one scenario: its world and its variants' values."""

    def __init__(self, rng: np.random.Generator, pools: Pools, world: WorldState) -> None:
        self.rng, self.pools, self.world = rng, pools, world

    def pick(self, values: tuple | list, exclude: tuple = ()) -> str:
        left = [v for v in values if v not in exclude]
        return str(left[int(self.rng.integers(len(left)))])

    def contact(self, exclude: tuple = ()) -> Contact:
        name = self.pick([c.name for c in self.world.contacts], exclude)
        return next(c for c in self.world.contacts if c.name == name)

    def message(self, exclude: tuple = ()) -> tuple[MessageGoal, str]:
        c, text = self.contact(exclude), self.pick(self.pools.texts)
        return MessageGoal(c.name, c.phone, text), f"send '{text}' to {c.name}"

    def event(self) -> tuple[EventGoal, str]:
        title, day = self.pick(self.pools.titles), self.pick(DAYS)
        return EventGoal(title, day), f"add '{title}' to my calendar on {day}"

    def timed_event(self) -> tuple[EventGoal, str]:
        goal, text = self.event()
        time = f"{int(self.rng.integers(8, 20)):02d}:{self.pick(('00', '15', '30', '45'))}"
        return EventGoal(goal.title, goal.day, time), f"{text} at {time}"

    def order(self) -> tuple[OrderGoal, str]:
        item, quantity = self.pick(self.pools.items), int(self.rng.integers(2, 6))
        return OrderGoal(item, quantity), f"buy {quantity} {plural(item)}"

    def block(self) -> tuple[BlockGoal, str]:
        name = self.contact().name
        return BlockGoal(name), f"block {name}"


def _sentence(*parts: str) -> str:
    text = " and ".join(parts)
    return text[0].upper() + text[1:] + "."


Template = Callable[[_Draw], tuple[tuple[Goal, ...], str]]


def _goals(*parts: Callable[[_Draw], tuple[Goal, str]]) -> Template:
    """A template whose goals ``parts`` draw in order, asked for in one sentence."""

    def template(d: _Draw) -> tuple[tuple[Goal, ...], str]:
        drawn = [part(d) for part in parts]
        return tuple(g for g, _ in drawn), _sentence(*(text for _, text in drawn))

    return template


def _msg2(d: _Draw) -> tuple[tuple[Goal, ...], str]:
    first, _ = d.message()
    second = d.contact(exclude=(first.name,))
    goals = (first, MessageGoal(second.name, second.phone, first.text))
    return goals, f"Send '{first.text}' to {first.name} and to {second.name}."


TRAIN_TEMPLATES: dict[str, Template] = {
    "msg": _goals(_Draw.message),
    "event": _goals(_Draw.event),
    "event_time": _goals(_Draw.timed_event),
    "buy": _goals(_Draw.order),
    "block": _goals(_Draw.block),
}
CHALLENGE_TEMPLATES: dict[str, Template] = {
    "event_msg": _goals(_Draw.event, _Draw.message),
    "buy_msg": _goals(_Draw.order, _Draw.message),
    "msg2": _msg2,
}
TEMPLATES: dict[str, Template] = {**TRAIN_TEMPLATES, **CHALLENGE_TEMPLATES}
_SPLIT_CODES = {s: i for i, s in enumerate(SPLITS)}


def _world(rng: np.random.Generator, pools: Pools) -> WorldState:
    """A scenario's world: contacts with distinct phones, and a little history in each app."""
    names = rng.choice(len(pools.names), CONTACTS_PER_WORLD, replace=False)
    numbers = rng.choice(np.arange(100, 1000), CONTACTS_PER_WORLD, replace=False)
    contacts = [
        Contact(pools.names[int(i)], f"555-{int(n):04d}")
        for i, n in zip(names, numbers, strict=True)
    ]
    d = _Draw(rng, pools, WorldState(contacts=contacts))
    messages = [Message(d.contact().phone, d.pick(pools.texts)) for _ in range(2)]
    events = [
        Event(d.pick(pools.titles), d.pick(DAYS)),
        Event(d.pick(pools.titles), d.pick(DAYS), "18:00"),
    ]
    orders = [Order(d.pick(pools.items), int(rng.integers(1, 4)))]
    return WorldState(contacts, messages, events, orders, CATALOG)


def scenario_tasks(split: str, template: str, number: int, task_seed: int = 0) -> list[Task]:
    """The :data:`VARIANTS` tasks of scenario ``number`` of ``template`` in ``split``."""
    # the template's name (not its place in a list) seeds its stream: adding a template
    # changes no other template's tasks
    template_code = zlib.crc32(template.encode())
    rng = np.random.default_rng([task_seed, _SPLIT_CODES[split], template_code, number])
    pools = TRAIN_POOLS if split == "train" else TEST_POOLS
    world = _world(rng, pools)
    scenario = f"{split}-{template}-{number:04d}"
    drawn: dict[str, tuple[Goal, ...]] = {}
    while len(drawn) < VARIANTS:  # distinct variants (a few redraws at most)
        goals, instruction = TEMPLATES[template](_Draw(rng, pools, world))
        drawn.setdefault(instruction, goals)
    return [
        Task(f"{scenario}-{v}", scenario, template, split, instruction, world, goals)
        for v, (instruction, goals) in enumerate(drawn.items(), start=1)
    ]


def scenario_of(task_id: str) -> str:
    """The scenario id of a world task id (``train-msg-0007-2`` -> ``train-msg-0007``)."""
    scenario, sep, variant = task_id.rpartition("-")
    if not sep or not variant.isdigit():
        raise ValueError(f"{task_id!r} is not a world task id of the form SPLIT-TEMPLATE-NNNN-V")
    return scenario


def split_templates(split: str) -> tuple[str, ...]:
    return tuple(CHALLENGE_TEMPLATES if split == "test_challenge" else TRAIN_TEMPLATES)


def generate(split: str, scenarios: int, task_seed: int = 0,
             templates: tuple[str, ...] | None = None) -> list[Task]:  # fmt: skip
    """``scenarios`` scenarios of each template of ``split`` (all of them, or ``templates``),
    interleaved by scenario number so that a prefix of the split covers every template."""
    names = split_templates(split) if templates is None else templates
    return [t for n in range(scenarios) for name in names
            for t in scenario_tasks(split, name, n, task_seed)]  # fmt: skip
