"""lm-eval's Minerva math utilities (``lm_eval.tasks.minerva_math.utils``), loaded once.

Both the grader (:mod:`entrogym.envs.grading`, in-process normalisation) and its worker
processes (:mod:`entrogym.envs.grader_pool`, the sympy stage) use this module; it imports
neither, so the two stay free of an import cycle.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from importlib import import_module
from pathlib import Path
from types import ModuleType

__all__ = ["minerva"]

_lock = threading.Lock()
_module: ModuleType | None = None


def minerva() -> ModuleType:
    """``lm_eval.tasks.minerva_math.utils``, loaded once per process.

    Importing it by name runs ``lm_eval.tasks/__init__`` (the task manager, ``datasets``,
    ``pandas``): 2 s and 200 MB per grading process. The module itself needs only sympy,
    antlr and math-verify, so it is loaded from its file unless already imported.
    """
    global _module
    with _lock:
        if _module is None:
            _module = _load()
        return _module


def _load() -> ModuleType:
    name = "lm_eval.tasks.minerva_math.utils"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("lm_eval")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "tasks/minerva_math/utils.py"
        if path.is_file():
            file_spec = importlib.util.spec_from_file_location("_entrogym_minerva_utils", path)
            assert file_spec is not None and file_spec.loader is not None
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            return module
    return import_module(name)


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time would stay held forever in the child.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
