"""Importing a module the user names (``module:Name`` for an env or an algorithm part).

Whatever goes wrong while the user's module is imported (it is missing, one of its own imports
is, its code raises, or it calls ``sys.exit``) becomes one ValueError line naming the module and
what happened, so a command can report it and exit 2 before any model loads. A ``sys.exit``
there would otherwise end the whole command quietly, with its code (often 0).
"""

from __future__ import annotations

import importlib
import traceback
import types
from pathlib import Path


def import_plugin(module: str, what: str) -> types.ModuleType:
    """Import ``module`` for ``what`` (how the user named it, e.g. ``lever 'mod:MyLever'``).

    A ValueError (one line, starting with ``what``) for any failure; Ctrl-C still interrupts.
    """
    try:
        return importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and missing != module and not module.startswith(f"{missing}."):
            raise ValueError(
                f"{what}: module {module!r} imports {missing!r}, which is not installed"
            ) from None
        raise ValueError(
            f"{what}: cannot import module {module!r} ({_one_line(exc)}); make it importable "
            "(e.g. PYTHONPATH)"
        ) from None
    except SystemExit as exc:
        raise ValueError(
            f"{what}: module {module!r} called sys.exit({exc.code!r}) while being imported"
        ) from None
    except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything
        raise ValueError(
            f"{what}: importing module {module!r} raised {describe_exception(exc)}"
        ) from None


def describe_exception(exc: BaseException) -> str:
    """``Type: message (file.py, line N)`` on one line: what the user's code raised, and where."""
    return f"{type(exc).__name__}: {_one_line(exc)}{_where(exc)}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


def _where(exc: BaseException) -> str:
    """`` (file.py, line N)``: where in the user's code ``exc`` was raised (a SyntaxError's
    message says so itself)."""
    if isinstance(exc, SyntaxError):
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" ({Path(last.filename).name}, line {last.lineno})"
