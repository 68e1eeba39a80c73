"""The world's apps, tasks and grading (entrogym/envs/world), without an env or a model.

Grading is checked against an independent computation: hand-written expected checks for
right, partial, duplicated, wrong-argument and collateral-damage action sequences, and a
reference grader written here from the state's JSON diff for random action sequences."""

from __future__ import annotations

import contextlib
import json
import random
from collections import Counter
from dataclasses import asdict

import pytest

from entrogym.envs.world.apps import Apps, WorldError, WorldState
from entrogym.envs.world.demos import DEMONSTRATIONS, demonstration
from entrogym.envs.world.grading import (
    BlockGoal,
    EventGoal,
    MessageGoal,
    OrderGoal,
    grade,
    normalize,
    reward,
    task_goal_completed,
)
from entrogym.envs.world.tasks import (
    CHALLENGE_TEMPLATES,
    TEST_POOLS,
    TRAIN_POOLS,
    TRAIN_TEMPLATES,
    Task,
    generate,
    scenario_of,
    scenario_tasks,
)


def task_of(template: str, split: str = "train", number: int = 0, variant: int = 0) -> Task:
    return scenario_tasks(split, template, number)[variant]


def run(task: Task, calls: list[tuple[str, dict]]) -> dict[str, bool]:
    apps = Apps(task.state.copy())
    for name, arguments in calls:
        with contextlib.suppress(WorldError):  # a refused call changes nothing
            getattr(apps, name)(**arguments)
    return {c.name: c.passed for c in grade(task.goals, task.state, apps.state)}


def other_contact(task: Task, *names: str):
    return next(c for c in task.state.contacts if c.name not in names)


# ----- hand-written expected checks -------------------------------------------------------


def test_message_checks() -> None:
    task = task_of("msg")
    (goal,) = task.goals
    assert isinstance(goal, MessageGoal)
    sent, text = f"message_sent[{goal.name}]", f"message_text[{goal.name}]"
    right = ("send_message", {"phone": goal.phone, "text": goal.text})
    other = other_contact(task, goal.name)
    cases = [
        ([], {sent: False, text: False, "no_collateral": True}),
        ([("find_contact", {"name": goal.name}), right],
         {sent: True, text: True, "no_collateral": True}),
        # the comparison ignores case and end punctuation
        ([("send_message", {"phone": goal.phone, "text": goal.text.upper() + "!"})],
         {sent: True, text: True, "no_collateral": True}),
        ([("send_message", {"phone": goal.phone, "text": "something else"})],
         {sent: True, text: False, "no_collateral": True}),
        ([right, right], {sent: True, text: False, "no_collateral": True}),
        ([("send_message", {"phone": other.phone, "text": goal.text})],
         {sent: False, text: False, "no_collateral": False}),
        ([right, ("add_event", {"title": "x", "day": "Monday"})],
         {sent: True, text: True, "no_collateral": False}),
        # a refused call (a name where the phone goes) changes nothing
        ([("send_message", {"phone": goal.name, "text": goal.text})],
         {sent: False, text: False, "no_collateral": True}),
    ]  # fmt: skip
    for calls, expected in cases:
        assert run(task, calls) == expected, calls


def test_event_order_and_block_checks() -> None:
    event = task_of("event")
    (eg,) = event.goals
    assert isinstance(eg, EventGoal)
    added, day = f"event_added[{eg.title}]", f"event_day[{eg.title}]"
    wrong_day = next(d for d in ("Monday", "Friday") if d != eg.day)
    assert run(event, [("add_event", {"title": eg.title.title(), "day": eg.day.lower()})]) == {
        added: True, day: True, "no_collateral": True}  # fmt: skip
    assert run(event, [("add_event", {"title": eg.title, "day": wrong_day})]) == {
        added: True, day: False, "no_collateral": True}  # fmt: skip
    assert run(event, [("add_event", {"title": eg.title + " appointment", "day": eg.day})]) == {
        added: False, day: False, "no_collateral": False}  # fmt: skip

    timed = task_of("event_time")
    (tg,) = timed.goals
    assert isinstance(tg, EventGoal) and tg.time
    timed_checks = [f"event_added[{tg.title}]", f"event_day[{tg.title}]", f"event_time[{tg.title}]"]
    hour = str(int(tg.time[:2])) + tg.time[2:]  # 09:15 written 9:15 is the same time
    assert run(timed, [("add_event", {"title": tg.title, "day": tg.day, "time": hour})]) == {
        **dict.fromkeys(timed_checks, True), "no_collateral": True}  # fmt: skip
    assert run(timed, [("add_event", {"title": tg.title, "day": tg.day})]) == {
        **dict(zip(timed_checks, (True, True, False), strict=True)), "no_collateral": True}  # fmt: skip
    assert run(timed, [("add_event", {"title": tg.title, "day": tg.day, "time": "9am"})]) == {
        **dict.fromkeys(timed_checks, False), "no_collateral": True}  # fmt: skip

    buy = task_of("buy")
    (og,) = buy.goals
    assert isinstance(og, OrderGoal) and og.quantity >= 2
    placed, quantity = f"order_placed[{og.item}]", f"order_quantity[{og.item}]"
    assert run(buy, [("buy", {"item": og.item + "s", "quantity": og.quantity})]) == {
        placed: True, quantity: True, "no_collateral": True}  # fmt: skip
    assert run(buy, [("buy", {"item": og.item})]) == {
        placed: True, quantity: False, "no_collateral": True}  # fmt: skip
    split = [("buy", {"item": og.item}), ("buy", {"item": og.item, "quantity": og.quantity - 1})]
    assert run(buy, split) == {placed: True, quantity: True, "no_collateral": True}
    other_item = next(i for i in TRAIN_POOLS.items if i != og.item)
    assert run(buy, [("buy", {"item": other_item, "quantity": og.quantity})]) == {
        placed: False, quantity: False, "no_collateral": False}  # fmt: skip

    block = task_of("block")
    (bg,) = block.goals
    assert isinstance(bg, BlockGoal)
    blocked = f"contact_blocked[{bg.name}]"
    other = other_contact(block, bg.name)
    assert run(block, [("find_contact", {"name": bg.name}),
                       ("block_contact", {"name": bg.name.lower()})]) == {
        blocked: True, "no_collateral": True}  # fmt: skip
    assert run(block, [("block_contact", {"name": other.name})]) == {
        blocked: False, "no_collateral": False}  # fmt: skip


def test_challenge_checks_each_goal() -> None:
    task = task_of("event_msg", split="test_challenge")
    eg, mg = task.goals
    assert isinstance(eg, EventGoal) and isinstance(mg, MessageGoal)
    half = run(task, [("add_event", {"title": eg.title, "day": eg.day})])
    assert half == {f"event_added[{eg.title}]": True, f"event_day[{eg.title}]": True,
                    f"message_sent[{mg.name}]": False, f"message_text[{mg.name}]": False,
                    "no_collateral": True}  # fmt: skip
    checks = grade(task.goals, task.state, task.state)
    assert reward(checks) == pytest.approx(1 / 5) and not task_goal_completed(checks)
    task2 = task_of("msg2", split="test_challenge")
    a, b = task2.goals
    both = [("send_message", {"phone": g.phone, "text": g.text}) for g in (a, b)]
    assert all(run(task2, both).values())
    assert run(task2, both[:1])["no_collateral"]  # the second is a goal, not collateral


# ----- a reference grader, from the state's JSON diff --------------------------------------


def records(state: WorldState) -> Counter:
    """Every record of the state as a hashable (table, JSON) pair."""
    out: Counter = Counter()
    for table in ("contacts", "messages", "events", "orders"):
        for r in getattr(state, table):
            out[(table, json.dumps(asdict(r), sort_keys=True))] += 1
    return out


def reference(task: Task, final: WorldState) -> dict[str, bool]:
    added = records(final) - records(task.state)
    removed = records(task.state) - records(final)
    new = [(t, json.loads(r)) for t, r in added.elements()]
    expected: dict[str, bool] = {}
    explained: set[int] = set()
    for g in task.goals:
        if isinstance(g, MessageGoal):
            mine = [i for i, (t, r) in enumerate(new) if t == "messages" and r["phone"] == g.phone]
            expected[f"message_sent[{g.name}]"] = bool(mine)
            expected[f"message_text[{g.name}]"] = [normalize(new[i][1]["text"]) for i in mine] == [
                normalize(g.text)]  # fmt: skip
        elif isinstance(g, EventGoal):
            mine = [i for i, (t, r) in enumerate(new)
                    if t == "events" and normalize(r["title"]) == normalize(g.title)]  # fmt: skip
            expected[f"event_added[{g.title}]"] = bool(mine)
            expected[f"event_day[{g.title}]"] = [new[i][1]["day"] for i in mine] == [g.day]
            if g.time:
                expected[f"event_time[{g.title}]"] = [new[i][1]["time"] for i in mine] == [g.time]
        elif isinstance(g, OrderGoal):
            mine = [i for i, (t, r) in enumerate(new) if t == "orders" and r["item"] == g.item]
            expected[f"order_placed[{g.item}]"] = bool(mine)
            expected[f"order_quantity[{g.item}]"] = (
                sum(new[i][1]["quantity"] for i in mine) == g.quantity
            )
        else:
            mine = [i for i, (t, r) in enumerate(new) if t == "contacts" and r["name"] == g.name]
            expected[f"contact_blocked[{g.name}]"] = any(new[i][1]["blocked"] for i in mine)
        explained |= set(mine)
    blocked_names = {g.name for g in task.goals if isinstance(g, BlockGoal)}
    unexplained_removals = [
        (t, r) for t, r in removed.elements()
        if not (t == "contacts" and json.loads(r)["name"] in blocked_names)
    ]  # fmt: skip
    expected["no_collateral"] = len(explained) == len(new) and not unexplained_removals
    return expected


def random_calls(task: Task, rng: random.Random) -> list[tuple[str, dict]]:
    names = [c.name for c in task.state.contacts]
    phones = [c.phone for c in task.state.contacts]
    goal_texts = [g.text for g in task.goals if isinstance(g, MessageGoal)]
    goal_titles = [g.title for g in task.goals if isinstance(g, EventGoal)]
    goal_items = [g.item for g in task.goals if isinstance(g, OrderGoal)]
    goal_times = [g.time for g in task.goals if isinstance(g, EventGoal) and g.time]
    options = [
        lambda: ("send_message", {"phone": rng.choice(phones),
                                  "text": rng.choice(goal_texts + ["hi"])}),
        lambda: ("add_event", {"title": rng.choice(goal_titles + ["gym"]),
                               "day": rng.choice(["Monday", "Friday"]),
                               "time": rng.choice(["", "18:00"] + goal_times)}),
        lambda: ("buy", {"item": rng.choice(goal_items + ["mug"]),
                         "quantity": rng.randint(1, 5)}),
        lambda: ("block_contact", {"name": rng.choice(names)}),
        lambda: ("find_contact", {"name": rng.choice(names)}),
    ]  # fmt: skip
    return [rng.choice(options)() for _ in range(rng.randint(0, 4))]


@pytest.mark.parametrize("split", ["train", "test_challenge"])
def test_grading_matches_reference_on_random_calls(split: str) -> None:
    rng = random.Random(0)
    tasks = generate(split, 4)
    seen = Counter()
    for task in tasks:
        for _ in range(40):
            calls = random_calls(task, rng)
            # the goals themselves, in some episodes
            if rng.random() < 0.3:
                calls += [("send_message", {"phone": g.phone, "text": g.text})
                          for g in task.goals if isinstance(g, MessageGoal)]  # fmt: skip
            apps = Apps(task.state.copy())
            for name, arguments in calls:
                getattr(apps, name)(**arguments)
            got = {c.name: c.passed for c in grade(task.goals, task.state, apps.state)}
            assert got == reference(task, apps.state), (task.task_id, calls)
            seen[all(got.values())] += 1
            seen[got["no_collateral"]] += 0 if got["no_collateral"] else 1
    assert seen[True] > 0 and seen[False] > 0  # both outcomes were exercised


# ----- apps ---------------------------------------------------------------------------------


def test_refused_calls_change_nothing() -> None:
    task = task_of("msg")
    apps = Apps(task.state.copy())
    for name, arguments in [
        ("find_contact", {"name": "Nobody"}),
        ("send_message", {"phone": "Bob", "text": "x"}),
        ("send_message", {"phone": "555-0101", "text": "  "}),
        ("add_event", {"title": "x", "day": "Someday"}),
        ("add_event", {"title": "x", "day": "Monday", "time": "25:00"}),
        ("buy", {"item": "spaceship"}),
        ("buy", {"item": "mug", "quantity": 0}),
        ("block_contact", {"name": "Nobody"}),
    ]:
        with pytest.raises(WorldError):
            getattr(apps, name)(**arguments)
    assert apps.state == task.state


def test_demonstrations_show_real_results() -> None:
    messages = demonstration(tuple(DEMONSTRATIONS))
    assert [m["role"] for m in messages[:6]] == ["user", "assistant", "tool", "assistant",
                                                 "tool", "assistant"]  # fmt: skip
    assert json.loads(messages[2]["content"]) == {"name": "Zoe", "phone": "555-0199"}
    assert messages[-1] == {"role": "assistant", "content": "done"}
    with pytest.raises(ValueError, match="unknown demonstration"):
        demonstration(("nope",))


# ----- tasks and splits ---------------------------------------------------------------------


def test_generation_is_deterministic_and_prefix_stable() -> None:
    assert generate("train", 3) == generate("train", 3)
    assert generate("train", 5)[: 3 * len(TRAIN_TEMPLATES) * 3] == generate("train", 3)
    assert generate("train", 3, task_seed=1) != generate("train", 3)


def test_splits_are_disjoint() -> None:
    train, normal, challenge = (generate(s, 8) for s in ("train", "test_normal",
                                                         "test_challenge"))  # fmt: skip
    ids = [t.task_id for t in train + normal + challenge]
    assert len(set(ids)) == len(ids)
    assert set(TRAIN_POOLS.names).isdisjoint(TEST_POOLS.names)
    assert set(TRAIN_POOLS.texts).isdisjoint(TEST_POOLS.texts)
    assert set(TRAIN_POOLS.items).isdisjoint(TEST_POOLS.items)
    train_names = {c.name for t in train for c in t.state.contacts}
    assert train_names.isdisjoint({c.name for t in normal + challenge for c in t.state.contacts})
    assert {t.template for t in train} == {t.template for t in normal} == set(TRAIN_TEMPLATES)
    assert {t.template for t in challenge} == set(CHALLENGE_TEMPLATES)
    for t in train + normal + challenge:
        assert scenario_of(t.task_id) == t.scenario_id
    by_scenario = Counter(t.scenario_id for t in normal)
    assert set(by_scenario.values()) == {3}
    # a scenario's variants are distinct tasks (scenarios may repeat an instruction: their
    # worlds differ)
    assert len({(t.scenario_id, t.instruction) for t in normal}) == len(normal)
    with pytest.raises(ValueError, match="SPLIT-TEMPLATE-NNNN-V"):
        scenario_of("msg")
