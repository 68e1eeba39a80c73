"""``entrogym`` command line: a thin dispatcher.

Each subcommand is a module of :mod:`entrogym.commands`, imported only when used, so
``entrogym theory`` does not pay for importing vLLM. Every subcommand function takes
``argv: list[str]`` and returns an exit code; its options are a dataclass parsed the same way
for every command (:mod:`entrogym.commands.options`; ``--config`` YAML files too).
"""

from __future__ import annotations

import importlib
import sys

# name -> ("module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "bandit": (
        "entrogym.commands.bandit:cli",
        "train a tabular softmax policy on bandits with every preset (`bandit sweep`: grids)",
    ),
    "theory": (
        "entrogym.commands.theory:cli",
        "numerical checks of Thm 1/Cor 1, Thm 2, Thm 3 and the softmax fix",
    ),
    "model": (
        "entrogym.commands.model:cli",
        "prepare built-in models (SmolLM2 from its GGUF, tiny random models)",
    ),
    "appworld": (
        "entrogym.commands.appworld:cli",
        "set up AppWorld, build the offline fixture world",
    ),
    "eval": (
        "entrogym.commands.eval:cli",
        "evaluate an agent on an env split (AppWorld TGC/SGC, AIME pass@k)",
    ),
    "train": ("entrogym.commands.train:cli", "RL-train a LoRA policy on a text env with a preset"),
    "plot": ("entrogym.commands.plot:cli", "draw entropy / accuracy panels from run folders"),
    "compare": (
        "entrogym.commands.compare:cli",
        "runs side by side: accuracy over seeds with 95 % intervals, the paper's claims",
    ),
    "demo": ("entrogym.commands.demo:cli", "the main demo (what `make demo` runs)"),
    "sequential": (
        "entrogym.commands.sequential:cli",
        "train on task A, then on task B: does a held entropy learn B better (`make sequential`)",
    ),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: entrogym COMMAND [options]   (entrogym COMMAND --help for its options)", ""]
    lines += [f"  {name:<{width}}  {helptext}" for name, (_, helptext) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"entrogym: unknown command {name!r}.\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[name][0].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("entrogym"):
            print(
                f"entrogym: command {name!r} is not available in this build ({exc}).",
                file=sys.stderr,
            )
            return 2
        raise
    return int(getattr(module, func_name)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
