"""Worked examples the agent sees before its task, as chat turns (the reset info's
``"demonstration"``): a user instruction, the assistant's tool calls with the tools' real
results, and the closing "done". They run on a world of their own, whose names and values no
split uses, so a demonstration never gives a task's answer away.

Which tools the demonstrations show is part of the task mix: the ``buy`` and ``block``
templates need an API no demonstration calls (discovery).
"""

from __future__ import annotations

from typing import Any

from entrogym.envs.tool_env import format_result
from entrogym.envs.world.apps import Apps, Contact, WorldState
from entrogym.envs.world.tasks import CATALOG

DONE = "done"
_WORLD = WorldState(
    contacts=[Contact("Zoe", "555-0199"), Contact("Max", "555-0142")], catalog=CATALOG
)
# name -> (instruction, [(tool, arguments)])
DEMONSTRATIONS: dict[str, tuple[str, list[tuple[str, dict[str, Any]]]]] = {
    "msg-zoe": (
        "Send 'lunch?' to Zoe.",
        [("find_contact", {"name": "Zoe"}),
         ("send_message", {"phone": "555-0199", "text": "lunch?"})],
    ),
    "msg-max": (
        "Send 'back at 5' to Max.",
        [("find_contact", {"name": "Max"}),
         ("send_message", {"phone": "555-0142", "text": "back at 5"})],
    ),
    "event": (
        "Add 'standup' to my calendar on Tuesday.",
        [("add_event", {"title": "standup", "day": "Tuesday"})],
    ),
}  # fmt: skip
DEFAULT_DEMONSTRATIONS = ("event", "msg-zoe")


def demonstration(names: tuple[str, ...] = DEFAULT_DEMONSTRATIONS) -> list[dict[str, Any]]:
    """The chat messages of the demonstrations ``names``, in order, with real tool results."""
    messages: list[dict[str, Any]] = []
    for name in names:
        if name not in DEMONSTRATIONS:
            raise ValueError(f"unknown demonstration {name!r}; choose from {list(DEMONSTRATIONS)}")
        instruction, calls = DEMONSTRATIONS[name]
        apps = Apps(_WORLD.copy())
        messages.append({"role": "user", "content": instruction})
        for tool, arguments in calls:
            result = getattr(apps, tool)(**arguments)
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [{"name": tool, "arguments": arguments}]})  # fmt: skip
            messages.append({"role": "tool", "content": format_result(result)})
        messages.append({"role": "assistant", "content": DONE})
    return messages
