"""Every command in the README runs as written: each ``bash`` block's command is parsed by the
real parser of its command (options, values, env ids, config files, preset knobs), the
quickstart's own env is imported and checked, and every make target, script and extra exists.
Nothing is trained: the commands' runs are tested where each feature is."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def commands() -> list[str]:
    """The README's shell commands, continuation lines joined, comments dropped."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(shlex.join(words))
    return out


@pytest.fixture(scope="module")
def quickstart_env(tmp_path_factory) -> Path:
    """The quickstart's ``my_envs.py``, written as the README shows it."""
    (code,) = [b for b in blocks("python") if "class Echo" in b]
    folder = tmp_path_factory.mktemp("quickstart")
    (folder / "my_envs.py").write_text(code)
    return folder


def test_the_readme_has_the_quickstarts_commands() -> None:
    found = commands()
    assert any(
        c.startswith("entrogym train --config examples/configs/quickstart.yaml") for c in found
    )
    assert any(c.startswith("entrogym eval ") for c in found)
    assert any(c.startswith("pip install -e") for c in found)
    assert len(found) >= 15


def test_the_quickstarts_own_env_passes_the_env_check(quickstart_env: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(quickstart_env))
    from entrogym.envs import check_text_env, make_text_env

    env = make_text_env("my_envs:my/Echo-v0")
    check_text_env(env, max_tasks=3)
    check_text_env(env, split="test", max_tasks=1)
    env.reset(options={"task_id": "train-river"})
    assert env.step("river")[1] == 1.0


def _entrogym(words: list[str]) -> None:
    """Parse an ``entrogym ...`` command with that command's real parser and options class."""
    from entrogym.commands.options import parse_namespace, parse_options
    from entrogym.commands.preflight import check_env_id

    name, argv = words[0], words[1:]
    if name == "bandit" and argv[:1] == ["sweep"]:
        from entrogym.commands.bandit_sweep import parse_sweep_args

        parse_sweep_args(argv[1:])
        return
    if name == "train":
        from entrogym.commands.train import build_parser
        from entrogym.train.config import TrainConfig

        cfg = parse_options(build_parser(), argv, TrainConfig)
        for env in (cfg.env, cfg.eval_env):
            if env:
                check_env_id(env)
        return
    if name == "eval":
        from entrogym.commands.eval import EvalConfig, build_parser

        check_env_id(parse_options(build_parser(), argv, EvalConfig).env)
        return
    import importlib

    module = importlib.import_module(f"entrogym.commands.{name}")
    parse_namespace(module.build_parser(), argv)


@pytest.mark.parametrize("command", commands())
def test_each_readme_command_parses(command: str, quickstart_env: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # paths such as examples/configs/... are relative to the checkout
    monkeypatch.syspath_prepend(str(quickstart_env))  # PYTHONPATH=. in the quickstart
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before the command
        name, _, value = words.pop(0).partition("=")
        if name == "PYTHONPATH":
            monkeypatch.syspath_prepend(str(ROOT / value))
    tool, args = words[0], words[1:]
    if tool == "entrogym":
        _entrogym(args)
    elif tool == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert args[0] in targets, command
    elif tool == "pip":
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        known = set(extras["optional-dependencies"])
        (wanted,) = re.findall(r"\.\[([\w,-]+)\]", command)
        assert set(wanted.split(",")) <= known, command
    elif tool == "python":
        script = ROOT / args[0]
        assert script.is_file(), command
        text = script.read_text()
        for option in (a for a in args[1:] if a.startswith("--")):
            assert option.split("=")[0] in text, f"{command}: {option} is not an option of {script}"
    else:
        pytest.fail(f"README command with an unknown tool: {command}")
