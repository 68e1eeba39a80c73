"""Registries of an algorithm's parts, each part with its own typed params dataclass.

An algorithm is composed of small parts chosen by name (``entrogym.algos.parts``): an
advantage estimator, a policy loss, a token mask, an entropy lever and a controller. Each kind
of part has one :class:`Registry`. A registered part declares ``Params``, a frozen dataclass of
its knobs with their defaults; :meth:`Registry.params` builds and checks one from a mapping of
typed values. A part that lives outside entrogym is named ``module:name``: the module is
imported first (so its ``@register`` lines run), as Gymnasium does for env ids.

Nothing here reads text: command-line strings are converted to typed values by the options
layer (``entrogym.commands.algo_text``), which asks a part's ``Params`` for the field types.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Generic, Literal, TypeVar, get_args, get_origin

from entrogym.algos.finite import check_finite_values
from entrogym.algos.plugins import import_plugin

T = TypeVar("T")
# coerce(knob, value, type hint) -> value: how a caller that holds text (a command line) turns
# it into the knob's type before the check; algos itself passes values through unchanged.
Coerce = Callable[[str, Any, Any], Any]


@dataclass(frozen=True)
class NoParams:
    """The params of a part that has no knobs."""


@dataclass(frozen=True)
class Part:
    """One chosen part: its registered ``name`` and an instance of its ``Params``."""

    name: str
    params: Any = dataclasses.field(default_factory=NoParams)

    def knobs(self) -> dict[str, Any]:
        """The params as a plain mapping (field name -> value)."""
        return {f.name: getattr(self.params, f.name) for f in fields(self.params)}


class Registry(Generic[T]):
    """Parts of one kind (``"lever"``, ``"controller"``, ...) registered by name."""

    def __init__(self, kind: str, base: type | None = None) -> None:
        self.kind = kind
        self.base = base  # parts that are classes must subclass it
        self._parts: dict[str, T] = {}

    def register(self, name: str, params: type | None = None) -> Callable[[T], T]:
        """Decorator: make ``part`` (a class or a function) available as ``name``.

        Its knobs are ``params`` or, for a class, its ``Params`` attribute (default: none).
        Registering the same definition again (a re-imported module) is a no-op; another part
        under a taken name is refused.
        """

        def add(part: T) -> T:
            spec = params or getattr(part, "Params", NoParams)
            if not (isinstance(spec, type) and is_dataclass(spec)):
                raise ValueError(f"{self.kind} {name!r}: Params must be a dataclass, got {spec!r}")
            if self.base is not None and not (
                isinstance(part, type) and issubclass(part, self.base)
            ):
                raise ValueError(
                    f"register_{self.kind}({name!r}) takes a subclass of {self.base.__name__}"
                )
            known = self._parts.get(name)
            if known is not None and known is not part and _origin(known) != _origin(part):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({_origin(known)[1]}); "
                    "pick another name"
                )
            part.name = name  # type: ignore[attr-defined]
            part.Params = spec  # type: ignore[attr-defined]
            self._parts[name] = part
            return part

        return add

    def get(self, name: str) -> T:
        """The part called ``name``; ``module:name`` imports ``module`` first. A ValueError lists
        the registered names."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: expected a name, got {name!r}; {self._known()}")
        if name in self._parts:
            return self._parts[name]
        module, sep, attr = name.partition(":")
        if not sep:
            raise ValueError(f"unknown {self.kind} {name!r}; {self._known()}")
        imported = import_plugin(module, f"{self.kind} {name!r}")
        if attr in self._parts:  # the module registered it under its own name
            self._parts[name] = self._parts[attr]
            return self._parts[name]
        found = getattr(imported, attr, None)
        if found is None:
            raise ValueError(
                f"{self.kind} {name!r}: module {module!r} has no {attr!r} and registers no "
                f"{self.kind} of that name"
            )
        if self.base is None:
            raise ValueError(
                f"{self.kind} {name!r}: {module}.{attr} is not registered as a {self.kind}; "
                f"decorate it with @entrogym.algos.register_{self.kind}({attr!r})"
            )
        if not (isinstance(found, type) and issubclass(found, self.base)):
            raise ValueError(
                f"{self.kind} {name!r}: {module}.{attr} is of the wrong type: a {self.kind} "
                f"must subclass entrogym.algos.{self.base.__name__}"
            )
        return self.register(name)(found)  # an unregistered class, named by the user

    def params_class(self, name: str) -> type:
        return self.get(name).Params  # type: ignore[attr-defined]

    def params(
        self, name: str, values: Mapping[str, Any] | None = None, coerce: Coerce | None = None
    ) -> Any:
        """``Params`` of part ``name`` from typed ``values`` (others keep their defaults).

        An unknown knob or a value of the wrong type is a ValueError naming the part's knobs.
        """
        cls = self.params_class(name)
        values = dict(values or {})
        known = [f.name for f in fields(cls)]
        unknown = [k for k in values if k not in known]
        if unknown:
            having = [n for n in self.names() if unknown[0] in _field_names(self.params_class(n))]
            where = f"; {self.kind}s that have it: {', '.join(having)}" if having else ""
            raise ValueError(
                f"algo.{self.kind}.{unknown[0]} is not a knob of {self.kind} {name!r}; its "
                f"knobs: {', '.join(known) or 'none'}{where}"
            )
        hints = typing.get_type_hints(cls)
        for key, value in values.items():
            knob = f"algo.{self.kind}.{key}"
            if coerce is not None:
                values[key] = value = coerce(knob, value, hints[key])
            check_type(knob, value, hints[key])
        check_finite_values(values, cls, f"algo.{self.kind}.")
        return cls(**values)

    def part(
        self, name: str, values: Mapping[str, Any] | None = None, coerce: Coerce | None = None
    ) -> Part:
        """A checked :class:`Part` (its name as given, its params)."""
        self.get(name)
        return Part(name, self.params(name, values, coerce))

    def names(self) -> list[str]:
        """The registered names (aliases made by ``module:name`` look-ups left out)."""
        return [n for n, p in self._parts.items() if getattr(p, "name", n) == n]

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def _known(self) -> str:
        return (
            f"registered {self.kind}s: {', '.join(self.names())} (a part of yours: module:name, "
            f"registered with entrogym.algos.register_{self.kind})"
        )


def _field_names(params: type) -> list[str]:
    return [f.name for f in fields(params)]


def _origin(part: Any) -> tuple[str, str]:
    return getattr(part, "__module__", ""), getattr(part, "__qualname__", repr(part))


def check_type(name: str, value: Any, hint: Any) -> None:
    """``value`` must be of type ``hint`` (int, float, str, bool, Literal, Optional of those);
    an int is a valid float, a bool is not a number. ValueError names the knob."""
    if _matches(value, hint):
        return
    raise ValueError(f"{name}: expected {type_name(hint)}, got {value!r}")


def _matches(value: Any, hint: Any) -> bool:
    origin = get_origin(hint)
    if origin is Literal:
        return value in get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this check does not know: the part's own checks decide


def type_name(hint: Any) -> str:
    """A short human name of a type hint: ``float``, ``float or None``, ``one of raw, exact``."""
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in get_args(hint))
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))
