"""Grading as AppWorld grades: checks on the world's final state, not on the agent's actions.

Each goal of a task contributes its checks (a message sent to the right person, with the right
text; an event on the right day; ...), and every task has one more, ``no_collateral``: nothing
outside the task's goals changed. A goal owns a *slot* of the state (the messages to one
phone, the events of one title, the orders of one item, one contact); the goal's checks read
the records its slot gained, and ``no_collateral`` compares everything outside the slots with
the initial state. Training reward = the fraction of checks passed; success (TGC) = all pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from entrogym.envs.world.apps import Contact, WorldState

_PUNCTUATION = " .!?'\""


def normalize(text: str) -> str:
    """Text as the checks compare it: case, runs of spaces and end punctuation ignored."""
    return " ".join(text.casefold().split()).strip(_PUNCTUATION)


@dataclass(frozen=True)
class MessageGoal:
    """``text`` was sent to ``name``'s phone, once."""

    name: str
    phone: str
    text: str


@dataclass(frozen=True)
class EventGoal:
    """One event titled ``title``, on ``day`` (at ``time``, when one is asked for)."""

    title: str
    day: str
    time: str = ""


@dataclass(frozen=True)
class OrderGoal:
    """``quantity`` of ``item`` bought in all."""

    item: str
    quantity: int


@dataclass(frozen=True)
class BlockGoal:
    """The contact ``name`` is blocked."""

    name: str


Goal = MessageGoal | EventGoal | OrderGoal | BlockGoal


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool


def _gained(before: Iterable, after: Iterable) -> list:
    """Records of ``after`` beyond those of ``before`` (multisets: a duplicate counts)."""
    return list((Counter(after) - Counter(before)).elements())


def _goal_checks(goal: Goal, initial: WorldState, final: WorldState) -> list[Check]:
    if isinstance(goal, MessageGoal):
        new = _gained(
            [m for m in initial.messages if m.phone == goal.phone],
            [m for m in final.messages if m.phone == goal.phone],
        )
        texts = [normalize(m.text) for m in new]
        return [
            Check(f"message_sent[{goal.name}]", bool(new)),
            Check(f"message_text[{goal.name}]", texts == [normalize(goal.text)]),
        ]
    if isinstance(goal, EventGoal):
        title = normalize(goal.title)
        new = _gained(
            [e for e in initial.events if normalize(e.title) == title],
            [e for e in final.events if normalize(e.title) == title],
        )
        checks = [
            Check(f"event_added[{goal.title}]", bool(new)),
            Check(f"event_day[{goal.title}]", [e.day for e in new] == [goal.day]),
        ]
        if goal.time:
            checks.append(Check(f"event_time[{goal.title}]", [e.time for e in new] == [goal.time]))
        return checks
    if isinstance(goal, OrderGoal):
        new = _gained(
            [o for o in initial.orders if o.item == goal.item],
            [o for o in final.orders if o.item == goal.item],
        )
        return [
            Check(f"order_placed[{goal.item}]", bool(new)),
            Check(f"order_quantity[{goal.item}]", sum(o.quantity for o in new) == goal.quantity),
        ]
    blocked = [c.blocked for c in final.contacts if c.name == goal.name]
    return [Check(f"contact_blocked[{goal.name}]", blocked == [True])]


def _outside(records: Iterable, inside: Iterable[bool]) -> Counter:
    return Counter(r for r, slot in zip(records, inside, strict=True) if not slot)


def no_collateral(goals: Iterable[Goal], initial: WorldState, final: WorldState) -> bool:
    """Everything outside the goals' slots is as it was: no message to anyone else, no other
    event, order or contact changed."""
    goals = list(goals)
    phones = {g.phone for g in goals if isinstance(g, MessageGoal)}
    titles = {normalize(g.title) for g in goals if isinstance(g, EventGoal)}
    items = {g.item for g in goals if isinstance(g, OrderGoal)}
    names = {g.name for g in goals if isinstance(g, BlockGoal)}

    def contacts(state: WorldState) -> Counter:
        # a blocked target may change only its ``blocked`` flag
        return Counter(Contact(c.name, c.phone) if c.name in names else c for c in state.contacts)

    return (
        contacts(final) == contacts(initial)
        and _outside(final.messages, [m.phone in phones for m in final.messages])
        == _outside(initial.messages, [m.phone in phones for m in initial.messages])
        and _outside(final.events, [normalize(e.title) in titles for e in final.events])
        == _outside(initial.events, [normalize(e.title) in titles for e in initial.events])
        and _outside(final.orders, [o.item in items for o in final.orders])
        == _outside(initial.orders, [o.item in items for o in initial.orders])
    )


def grade(goals: Iterable[Goal], initial: WorldState, final: WorldState) -> list[Check]:
    """The checks of a task whose goals are ``goals``, on the state it left: the goals' own
    checks in order, then ``no_collateral``."""
    goals = list(goals)
    checks = [c for g in goals for c in _goal_checks(g, initial, final)]
    return checks + [Check("no_collateral", no_collateral(goals, initial, final))]


def reward(checks: list[Check]) -> float:
    """Training reward: the fraction of checks passed (AppWorld's partial credit)."""
    return sum(c.passed for c in checks) / len(checks)


def task_goal_completed(checks: list[Check]) -> bool:
    """Whether the task is completed: every check passes (AppWorld's TGC counts these)."""
    return all(c.passed for c in checks)
