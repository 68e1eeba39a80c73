"""``entrogym model prepare NAME [--cache-dir DIR] [--force]`` and ``entrogym model list``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from entrogym.commands.options import (
    CommandParser,
    config_from,
    make_parser,
    parse_namespace,
    run_command,
)

PROG = "entrogym model"


@dataclass
class PrepareOptions:
    """Build a built-in model's Hugging Face folder; print its path.

    Args:
        name: built-in model name (``entrogym model list``).
        cache_dir: cache folder (default $ENTROGYM_CACHE, else ~/.cache/entrogym).
        force: rebuild even if cached.
    """

    name: str = ""
    cache_dir: str | None = None
    force: bool = False


def build_parser() -> Any:
    from entrogym.models import BUILTIN_MODELS

    parser = CommandParser(prog=PROG, description="Prepare built-in models.", exit_on_error=False)
    sub = parser.add_subcommands(dest="command")
    prepare = make_parser(
        f"{PROG} prepare",
        PrepareOptions.__doc__.split("\n")[0],
        PrepareOptions,
        positionals=("name",),
    )
    prepare.description += f" Built-ins: {', '.join(BUILTIN_MODELS)}."
    sub.add_subcommand("prepare", prepare)
    sub.add_subcommand("list", make_parser(f"{PROG} list", "List the built-in models."))
    return parser


def cli(argv: list[str]) -> int:
    def body() -> int:
        from entrogym.models import BUILTIN_MODELS, prepare_model

        args = parse_namespace(build_parser(), argv)
        if args.command == "list":
            for model in BUILTIN_MODELS.values():
                print(f"{model.name:<24} {model.description}")
            return 0
        opts = config_from(args.prepare, PrepareOptions)
        try:
            print(prepare_model(opts.name, opts.cache_dir, force=opts.force))
        except RuntimeError as exc:  # a failed build: one line, like bad input
            raise ValueError(str(exc)) from exc
        return 0

    return run_command(PROG, body)
