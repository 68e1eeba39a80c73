"""The world's apps: contacts, messages, calendar and a shop, as APIs over an in-memory state.

:class:`WorldState` holds every record (immutable records in lists, so a state copies cheaply
and compares by value); :class:`Apps` is the API the agent calls. Its public methods are the
env's tools: type hints and Google-style docstrings, from which the tools' JSON schemas are
built. An API that cannot do what it was asked raises :class:`WorldError` with a message the
agent reads (AppWorld's APIs answer a bad request the same way), and changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MAX_QUANTITY = 10
PHONE_PATTERN = re.compile(r"555-\d{4}")
TIME_PATTERN = re.compile(r"([01]?\d|2[0-3]):[0-5]\d")


class WorldError(Exception):
    """An API call the world refuses (unknown contact, bad day, ...): the agent sees why."""


@dataclass(frozen=True)
class Contact:
    name: str
    phone: str
    blocked: bool = False


@dataclass(frozen=True)
class Message:
    phone: str
    text: str


@dataclass(frozen=True)
class Event:
    title: str
    day: str
    time: str = ""


@dataclass(frozen=True)
class Order:
    item: str
    quantity: int


@dataclass
class WorldState:
    """Every record of the world. ``catalog`` is what the shop sells (fixed per world)."""

    contacts: list[Contact] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    orders: list[Order] = field(default_factory=list)
    catalog: tuple[str, ...] = ()

    def copy(self) -> WorldState:
        """An independent copy (the records are immutable, so copying the lists is enough)."""
        return WorldState(
            list(self.contacts), list(self.messages), list(self.events), list(self.orders),
            self.catalog,
        )  # fmt: skip


def plural(item: str) -> str:
    """English plural of a catalog item (the catalog holds regular nouns only)."""
    return item + "s"


class Apps:
    """The APIs of one world; :meth:`load` swaps the state under them (a new episode)."""

    def __init__(self, state: WorldState | None = None) -> None:
        self.state = state if state is not None else WorldState()

    def load(self, state: WorldState) -> None:
        self.state = state

    def _contact(self, name: str) -> Contact:
        wanted = name.strip().casefold()
        for contact in self.state.contacts:
            if contact.name.casefold() == wanted:
                return contact
        raise WorldError(f"no contact named {name!r}")

    def find_contact(self, name: str) -> dict[str, str]:
        """Look up a contact's phone number by name.

        Args:
            name: the contact's name.
        """
        contact = self._contact(name)
        return {"name": contact.name, "phone": contact.phone}

    def send_message(self, phone: str, text: str) -> str:
        """Send a text message to a phone number.

        Args:
            phone: the phone number, e.g. 555-0123.
            text: the message.
        """
        phone = phone.strip()
        if not PHONE_PATTERN.fullmatch(phone):
            raise WorldError(f"{phone!r} is not a phone number (they look like 555-0123)")
        if not text.strip():
            raise WorldError("the message is empty")
        self.state.messages.append(Message(phone, text))
        return "sent"

    def add_event(self, title: str, day: str, time: str = "") -> str:
        """Add an event to the calendar.

        Args:
            title: what the event is.
            day: the day of the week, e.g. Monday.
            time: the start time, e.g. 14:30 (none by default).
        """
        by_name = {d.casefold(): d for d in DAYS}
        if day.strip().casefold() not in by_name:
            raise WorldError(f"{day!r} is not a day of the week")
        if not title.strip():
            raise WorldError("the title is empty")
        time = time.strip()
        if time and not TIME_PATTERN.fullmatch(time):
            raise WorldError(f"{time!r} is not a time (they look like 14:30)")
        if len(time) == 4:
            time = "0" + time  # 9:15 and 09:15 are one time
        self.state.events.append(Event(title, by_name[day.strip().casefold()], time))
        return "added"

    def buy(self, item: str, quantity: int = 1) -> str:
        """Buy an item from the shop.

        Args:
            item: the item's name.
            quantity: how many to buy.
        """
        wanted = item.strip().casefold()
        found = [i for i in self.state.catalog if wanted in (i, plural(i))]
        if not found:
            raise WorldError(f"the shop sells no {item!r}")
        if not 1 <= quantity <= MAX_QUANTITY:
            raise WorldError(f"quantity must be 1 to {MAX_QUANTITY}, got {quantity}")
        self.state.orders.append(Order(found[0], quantity))
        return "bought"

    def block_contact(self, name: str) -> str:
        """Block a contact.

        Args:
            name: the contact's name.
        """
        contact = self._contact(name)
        index = self.state.contacts.index(contact)
        self.state.contacts[index] = replace(contact, blocked=True)
        return "blocked"

    def tools(self) -> list:
        """The APIs as the env's tools, in the order the prompt lists them."""
        return [self.find_contact, self.send_message, self.add_event, self.buy,
                self.block_contact]  # fmt: skip
