"""Small envs with tools shared by the tool tests (an importable module, so env workers can
build them from ``tool_envs:...`` ids)."""

from __future__ import annotations

import time

import gymnasium as gym

from entrogym.envs.base import Turn
from entrogym.envs.tool_env import ToolEnv
from entrogym.envs.tools import tool

CONTACTS = {"Bob": "555-0101", "Ann": "555-0102"}
TASKS = {"bob": ("hi", "Bob"), "ann": ("see you", "Ann")}


class PhoneEnv(ToolEnv):
    """Send a text to a contact: look the phone up, send the message, say done."""

    def __init__(self, max_turns: int = 6, demonstration: bool = False) -> None:
        super().__init__(max_turns=max_turns)
        self.sent: list[tuple[str, str]] = []
        self.with_demo = demonstration

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def task_ids(self, split: str | None = None) -> list[str]:
        self.resolve_split(split)
        return sorted(TASKS)

    def _start_task(self, task_id: str) -> tuple[str, dict]:
        self.sent = []
        text, name = TASKS[task_id]
        info = {"demonstration": demonstration()} if self.with_demo else {}
        return f"Send '{text}' to {name}.", info

    @tool
    def find_contact(self, name: str) -> str:
        """Look up a contact's phone number by name.

        Args:
            name: The contact's name.
        """
        return CONTACTS[name]

    @tool
    def send_message(self, phone: str, text: str, urgent: bool = False) -> str:
        """Send a text message to a phone number.

        Args:
            phone: The phone number.
            text: The message.
            urgent: Whether to mark it urgent.
        """
        self.sent.append((phone, text))
        return "sent"

    @tool
    def complete_task(self) -> str:
        """Say the task is complete."""
        self.request_end()
        return "ok"

    def _grade(self) -> Turn:
        text, name = TASKS[self.task_id]
        ok = self.sent == [(CONTACTS[name], text)]
        return Turn(done=True, reward=float(ok), success=ok, reward_parts={"sent": float(ok)})


def demonstration() -> list[dict]:
    return [
        {"role": "user", "content": "Send 'yo' to Zoe."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"name": "find_contact", "arguments": {"name": "Zoe"}}]},
        {"role": "tool", "content": "555-0199"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"name": "send_message", "arguments": {"phone": "555-0199", "text": "yo"}}]},
        {"role": "tool", "content": "sent"},
        {"role": "assistant", "content": "done"},
    ]  # fmt: skip


class SlowToolEnv(PhoneEnv):
    """A tool that hangs (the env worker's time limit must end it)."""

    @tool
    def wait(self, seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "waited"


gym.register(id="ToolPhone-v0", entry_point=PhoneEnv)
gym.register(id="ToolSlow-v0", entry_point=SlowToolEnv)
