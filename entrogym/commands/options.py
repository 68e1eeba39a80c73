"""The one way every ``entrogym`` command reads its options.

A command's options are a dataclass; :func:`make_parser` turns it into a jsonargparse parser
(with ``--config FILE.yaml``), :func:`parse_options` turns ``argv`` into an instance of it, and
:func:`run_command` reports bad input as one line with exit code 2. Spellings accepted on the
command line, whatever the field is called:

- ``--tasks-per-iter 8`` and ``--tasks_per_iter 8`` (``--help`` shows the dashed spelling);
- a bare boolean flag ``--resume`` as well as ``--resume true`` / ``--resume false``;
- a list as several words ``--engine-urls URL1 URL2`` or as one ``"[URL1, URL2]"``;
- the algorithm as ``--algo repo-d --algo.controller pi --algo.controller.kp 0.3``: these
  options are read by ``entrogym.commands.algo_text`` (one spelling for every command and label)
  and merged over a YAML file's ``algo:`` mapping.
"""

from __future__ import annotations

import json
import re
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, get_loader, set_loader

from entrogym.algos import AlgorithmConfig, algorithm_mapping
from entrogym.algos.finite import check_finite_values
from entrogym.commands.algo_text import (
    algo_args_mapping,
    algo_help,
    algorithm_from_options,
    merge_specs,
    split_algo_args,
)
from entrogym.yaml_limits import check_yaml

BOOL_WORDS = frozenset({"true", "false", "yes", "no", "True", "False", "1", "0"})
_OPTION = re.compile(r"--[A-Za-z0-9_.]+")
_PRINT_CONFIG = re.compile(r"--print[-_]config(=.*)?")
_NONFINITE_WORD = re.compile(
    r'Parser key "([\w.]+)": Expected a <class \'float\'>\. Got value: ([-+]?(?:inf|infinity|nan))$',
    re.IGNORECASE,
)


_JSONARGPARSE_YAML = get_loader("yaml")


def _bounded_yaml(stream: str) -> Any:
    """jsonargparse's YAML loader behind :func:`entrogym.yaml_limits.check_yaml`: every YAML
    a command reads (config files, option values) is bounded before it is built."""
    if isinstance(stream, str):
        check_yaml(stream, "a YAML value")
    return _JSONARGPARSE_YAML(stream)


set_loader("yaml", _bounded_yaml, exceptions=(yaml.YAMLError,))


class CommandParser(ArgumentParser):
    """A jsonargparse parser whose help and usage show options with dashes (``--max-tasks``),
    and whose help ends with every algorithm option when the command takes ``--algo``."""

    takes_algo = False

    def format_help(self) -> str:
        text = _dashed(super().format_help())
        return f"{text}\n{algo_help()}\n" if self.takes_algo else text

    def format_usage(self) -> str:
        return _dashed(super().format_usage())


def _dashed(text: str) -> str:
    return _OPTION.sub(lambda m: "--" + m.group(0)[2:].replace("_", "-"), text)


def make_parser(
    prog: str,
    description: str,
    config_cls: type | None = None,
    skip: Iterable[str] = (),
    positionals: Iterable[str] = (),
    groups: Mapping[str, Iterable[str]] | None = None,
) -> CommandParser:
    """A parser for ``config_cls``'s fields (its docstring's ``Args:`` are the help texts);
    the fields named in ``positionals`` are positional arguments (a list one takes 1 or more).
    ``groups`` (title -> field names) sorts the options into help sections, in that order;
    every option of ``config_cls`` must be in exactly one (ValueError otherwise)."""
    parser = CommandParser(prog=prog, description=description, exit_on_error=False)
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML file with any of the options"
    )
    if config_cls is not None:
        positionals = tuple(positionals)
        _add_positionals(parser, config_cls, positionals)
        typed_algo = {"algo"} if _algo_is_typed(config_cls) else set()
        parser.add_class_arguments(
            config_cls,
            nested_key=None,
            fail_untyped=True,
            skip=set(skip) | set(positionals) | typed_algo or None,
        )
        if typed_algo:  # a YAML file's algo: mapping, kept as data until config_from reads it
            default = next(f for f in fields(config_cls) if f.name == "algo").default_factory()
            parser.add_argument("--algo", type=dict[str, Any] | str, default={"name": default.name})
    for action in parser._actions:
        hint = _typehint(action)
        if hint is not None and _is_list(hint) and action.option_strings:
            # normalise_argv turns several words into the list, so show that spelling
            word = "URL" if "url" in action.dest else action.dest.upper().rstrip("S")
            action.metavar = f"{word} [{word} ...]"
        if action.dest == "algo":
            action.metavar = "PRESET"
            action.help = "the algorithm's preset; its options are listed at the end"
    parser.takes_algo = config_cls is not None and _has_algo(config_cls)
    if groups is not None and config_cls is not None:
        _regroup(parser, config_cls, groups)
    return parser


def _regroup(parser: ArgumentParser, config_cls: type, groups: Mapping[str, Iterable[str]]) -> None:
    """Move the options of ``config_cls`` out of the one section argparse gives a class into
    one section per entry of ``groups``; the class's description stays above the first."""
    names = {f.name for f in fields(config_cls)}
    wanted = {title: tuple(dests) for title, dests in groups.items()}
    listed = [d for dests in wanted.values() for d in dests]
    unknown = sorted(set(listed) - names)
    missing = sorted(names - set(listed))
    twice = sorted({d for d in listed if listed.count(d) > 1})
    if unknown or missing or twice:
        raise ValueError(f"option groups of {config_cls.__name__}: unknown {unknown}, "
                         f"in no group {missing}, in two groups {twice}")  # fmt: skip
    by_dest = {a.dest: a for a in parser._actions if a.dest in names}
    for group in [
        g for g in parser._action_groups if any(a.dest in names for a in g._group_actions)
    ]:
        group._group_actions[:] = [a for a in group._group_actions if a.dest not in names]
        if not group._group_actions:
            parser._action_groups.remove(group)
    for title, dests in wanted.items():
        section = parser.add_argument_group(title)
        section._group_actions.extend(by_dest[d] for d in dests if d in by_dest)


def _has_algo(config_cls: type) -> bool:
    return any(f.name == "algo" for f in fields(config_cls))


def _algo_is_typed(config_cls: type) -> bool:
    """The options' ``algo`` is a whole algorithm (``TrainConfig``), not options applied to
    several (the bandit lab's)."""
    return _has_algo(config_cls) and typing.get_type_hints(config_cls)["algo"] is AlgorithmConfig


def _add_positionals(parser: ArgumentParser, config_cls: type, names: tuple[str, ...]) -> None:
    import docstring_parser

    hints = typing.get_type_hints(config_cls)
    docs = {p.arg_name: p.description for p in docstring_parser.parse(config_cls.__doc__).params}
    for name in names:
        hint = hints[name]
        if typing.get_origin(hint) is list:
            parser.add_argument(name, type=typing.get_args(hint)[0], nargs="+", help=docs.get(name))
        else:
            parser.add_argument(name, type=hint, help=docs.get(name))


def _typehint(action: Any) -> Any:
    return getattr(action, "_typehint", None)


def _is_list(hint: Any) -> bool:
    if typing.get_origin(hint) is list:
        return True
    return any(typing.get_origin(a) is list for a in typing.get_args(hint))


def _walk(parser: ArgumentParser) -> Iterable[Any]:
    for action in parser._actions:
        yield action
        for sub in (getattr(action, "choices", None) or {}).values():
            if isinstance(sub, ArgumentParser):
                yield from _walk(sub)


def option_kinds(parser: ArgumentParser) -> tuple[set[str], set[str], set[str]]:
    """(every ``--option`` name, the boolean ones, the list-valued ones) of ``parser``."""
    names, bools, lists = set(), set(), set()
    for action in _walk(parser):
        for opt in action.option_strings:
            if not opt.startswith("--"):
                continue
            names.add(opt)
            hint = _typehint(action)
            if hint is bool or type(action).__name__ == "ActionYesNo":
                bools.add(opt)
            elif hint is not None and _is_list(hint):
                lists.add(opt)
    return names, bools, lists


def normalise_argv(parser: ArgumentParser, argv: list[str]) -> list[str]:
    """Rewrite ``argv`` into the spellings jsonargparse takes (see the module docstring)."""
    names, bools, lists = option_kinds(parser)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--") or token == "--":
            out.append(token)
            continue
        opt, eq, value = token.partition("=")
        underscored = "--" + opt[2:].replace("-", "_")
        opt = underscored if underscored in names else opt
        if opt in bools and not eq:
            if i < len(argv) and argv[i] in BOOL_WORDS:
                value, i = argv[i], i + 1
            else:
                value = "true"  # a bare flag
            eq = "="
        elif opt in lists and not eq:
            words = []
            while i < len(argv) and not argv[i].startswith("--"):
                words.append(argv[i])
                i += 1
            # one word may already be a YAML/JSON list ("[a, b]"); several are the list itself
            value = words[0] if len(words) == 1 and words[0].startswith("[") else json.dumps(words)
            eq = "="
        out.append(opt + eq + value)
    return out


def config_from(namespace: Any, config_cls: type, algo_tokens: list[str] = ()) -> Any:
    """An instance of the dataclass ``config_cls`` from a parsed namespace; ``algo_tokens``
    (``--algo...`` options) are merged over the namespace's ``algo`` (from a YAML file). A
    whole algorithm (``AlgorithmConfig``) is read here, over its field's default preset."""
    values = namespace.as_dict() if hasattr(namespace, "as_dict") else dict(namespace)
    if _algo_is_typed(config_cls):
        values["algo"] = algorithm_from_options(values["algo"], algo_tokens)
    elif algo_tokens:
        values["algo"] = merge_specs(values.get("algo"), algo_args_mapping(list(algo_tokens)))
    given = {f.name: values[f.name] for f in fields(config_cls) if f.name in values}
    check_finite_values(given, config_cls)  # every float option (entrogym.algos.finite)
    return config_cls(**given)


def _check_config_files(argv: list[str]) -> None:
    """Every ``--config FILE`` is bounded YAML (:func:`check_yaml`), checked here so that a
    refused file is named."""
    for i, token in enumerate(argv):
        path = None
        if token == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif token.startswith("--config="):
            path = token.partition("=")[2]
        if path is None or not Path(path).is_file():
            continue
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--config {path}: cannot read it ({exc})") from exc
        check_yaml(text, f"--config {path}")


def parse_namespace(parser: ArgumentParser, argv: list[str]) -> Any:
    """Parse ``argv`` (normalised); a parse error is a ValueError with jsonargparse's message."""
    _check_config_files(argv)
    try:
        return parser.parse_args(normalise_argv(parser, argv))
    except Exception as exc:  # jsonargparse raises ArgumentError / TypeError subclasses
        if isinstance(exc, KeyboardInterrupt):
            raise
        text = " ".join(_dashed(str(exc)).split())
        word = _NONFINITE_WORD.search(text)  # YAML reads "inf" as text: say what is wrong
        if word:
            text = f"{word[1]} must be a finite number, got {word[2]}"
        raise ValueError(text) from exc


def parse_options(parser: ArgumentParser, argv: list[str], config_cls: type) -> Any:
    """``config_cls`` from ``argv``: bad options or values raise ValueError."""
    if not is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    algo_tokens: list[str] = []
    if _has_algo(config_cls):  # --algo... options have their own reader (algo_text)
        algo_tokens, argv = split_algo_args(argv)
    try:
        if algo_tokens and any(_PRINT_CONFIG.fullmatch(token) for token in argv):
            argv = _with_merged_algo(parser, argv, config_cls, algo_tokens)
        return config_from(parse_namespace(parser, argv), config_cls, algo_tokens)
    except TypeError as exc:  # a dataclass refusing a value
        raise ValueError(str(exc)) from exc


def _with_merged_algo(
    parser: ArgumentParser, argv: list[str], config_cls: type, algo_tokens: list[str]
) -> list[str]:
    """``argv`` with the algorithm that the ``--algo...`` options and the config file give
    together as one ``--algo MAPPING``, so that jsonargparse's ``--print-config`` (which
    prints and exits while it parses) shows the algorithm the command would run, not the
    file's: those options are read apart from jsonargparse (``algo_text``)."""
    without = [token for token in argv if not _PRINT_CONFIG.fullmatch(token)]
    merged = config_from(parse_namespace(parser, without), config_cls, algo_tokens).algo
    if isinstance(merged, AlgorithmConfig):
        merged = algorithm_mapping(merged)
    return [*argv, "--algo", json.dumps(merged)]


def run_command(prog: str, body: Callable[[], int], interrupted: str | None = None) -> int:
    """Run a command's body: a ValueError (bad input) is one line on stderr and exit code 2;
    Ctrl-C prints ``interrupted`` (what to do next) and exits 130, without a traceback."""
    try:
        return int(body() or 0)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: {interrupted or 'interrupted'}", file=sys.stderr)
        return 130
