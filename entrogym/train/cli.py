"""``entrogym train``: options and YAML configs mapped onto ``TrainConfig`` by jsonargparse."""

from __future__ import annotations

import json
import sys
from dataclasses import fields

from jsonargparse import ActionConfigFile, ArgumentParser

from entrogym.train.config import TrainConfig


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="entrogym train",
        description="RL-train a LoRA policy on a registered text env with a preset algorithm.",
        default_meta=False,
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML file with any of the options"
    )
    parser.add_class_arguments(TrainConfig, nested_key=None, fail_untyped=True)
    return parser


def dashed_to_fields(argv: list[str]) -> list[str]:
    """Accept ``--tasks-per-iter`` for the field ``tasks_per_iter`` (YAML keys stay snake_case),
    and list options as plain words: ``--engine-urls URL1 URL2``."""
    names = {f.name for f in fields(TrainConfig)}
    list_fields = {f.name for f in fields(TrainConfig) if str(f.type).startswith("list")}
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            out.append(token)
            continue
        opt, eq, value = token[2:].partition("=")
        name = opt.replace("-", "_")
        if name not in names:
            out.append(token)
            continue
        if name in list_fields and not eq:
            words = []
            while i < len(argv) and not argv[i].startswith("--"):
                words.append(argv[i])
                i += 1
            # one word may already be a YAML/JSON list ("[a, b]"); several are the list itself
            value = words[0] if len(words) == 1 and words[0].startswith("[") else json.dumps(words)
            eq = "="
        out.append("--" + name + eq + value)
    return out


def parse_config(argv: list[str]) -> TrainConfig:
    parser = build_parser()
    namespace = parser.parse_args(dashed_to_fields(argv))
    values = {f.name: namespace[f.name] for f in fields(TrainConfig)}
    return TrainConfig(**values)


def cli(argv: list[str]) -> int:
    try:
        config = parse_config(argv)
    except ValueError as exc:
        print(f"entrogym train: {exc}", file=sys.stderr)
        return 2
    from entrogym.train.trainer import train  # heavy imports only once the options are valid

    train(config)
    return 0
