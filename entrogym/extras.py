"""Optional integrations (install extras): each one is named in one line when it is missing.

``pip install -e ".[reasoning-gym]"`` and the other extras below add a package that only one
part of entrogym needs; ``make setup`` installs them all. Code that needs one calls
:func:`require` first, so a missing package is a :class:`MissingExtra` (a ``ValueError``: the
commands print it as one line and exit 2) naming the extra, never an ``ImportError`` deep in a
traceback.
"""

from __future__ import annotations

import importlib.util

# extra name -> (import name, what it adds)
EXTRAS: dict[str, tuple[str, str]] = {
    "reasoning-gym": ("reasoning_gym", "the entrogym/ReasoningGym-v0 env"),
    "textarena": ("textarena", "the entrogym/TextArena-v0 env"),
    "wandb": ("wandb", "--report-to wandb"),
    "trackio": ("trackio", "--report-to trackio"),
    "mlflow": ("mlflow", "--report-to mlflow"),
}


class MissingExtra(ValueError):
    """A feature's optional package is not installed."""


def has_extra(extra: str) -> bool:
    """Whether the package of ``extra`` can be imported."""
    return importlib.util.find_spec(EXTRAS[extra][0]) is not None


def require(extra: str) -> None:
    """:class:`MissingExtra` naming ``extra`` and how to install it, unless it is installed."""
    module, what = EXTRAS[extra]
    if not has_extra(extra):
        raise MissingExtra(
            f"{what} needs the {extra!r} extra (Python package {module!r}), which is not "
            f'installed; install it with: pip install -e ".[{extra}]" (make setup installs '
            "every extra)"
        )
