"""``entrogym appworld setup | fixture | serve``: set up AppWorld, build the offline fixture world,
serve AppWorld's environment."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrogym.commands.options import (
    CommandParser,
    config_from,
    make_parser,
    parse_namespace,
    run_command,
)

PROG = "entrogym appworld"
APPWORLD_VERSION = "0.1.3.post1"


@dataclass
class SetupOptions:
    """Create .venv-appworld with appworld and unpack its apps.

    Args:
        venv: virtualenv path (default .venv-appworld).
        python: Python that makes the virtualenv (AppWorld needs 3.11).
        download: also download AppWorld's data into --root (needs internet).
        root: AppWorld root (data/ in it).
    """

    venv: str | None = None
    python: str = "python3.11"
    download: bool = False
    root: str | None = None


@dataclass
class FixtureOptions:
    """Build the offline fixture world into DIR.

    Args:
        dir: folder to build the fixture world in.
        venv: AppWorld virtualenv (default .venv-appworld).
    """

    dir: str = ""
    venv: str | None = None


@dataclass
class ServeOptions:
    """Serve AppWorld's environment on 127.0.0.1 until Ctrl-C.

    Args:
        root: AppWorld root (data/ in it).
        port: port (default: a free one).
        venv: AppWorld virtualenv (default .venv-appworld).
        memory_limit_mb: memory limit of the server process.
    """

    root: str | None = None
    port: int | None = None
    venv: str | None = None
    memory_limit_mb: int = 4096


SUBCOMMANDS = {"setup": SetupOptions, "fixture": FixtureOptions, "serve": ServeOptions}


def build_parser() -> Any:
    parser = CommandParser(prog=PROG, description="Set up and serve AppWorld.", exit_on_error=False)
    sub = parser.add_subcommands(dest="command")
    for name, options in SUBCOMMANDS.items():
        positionals = ("dir",) if name == "fixture" else ()
        doc = (options.__doc__ or "").split("\n")[0]
        sub.add_subcommand(
            name, make_parser(f"{PROG} {name}", doc, options, positionals=positionals)
        )
    return parser


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def setup(opts: SetupOptions) -> int:
    from entrogym.envs.appworld.runtime import check_root, default_venv

    if opts.download and opts.root is None:
        raise ValueError("--download needs --root DIR (where data/ goes)")
    path = Path(opts.venv) if opts.venv else default_venv()
    if not (path / "bin" / "python").exists():
        _run([opts.python, "-m", "venv", str(path)])
    py = str(path / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", f"appworld=={APPWORLD_VERSION}"])
    _run([str(path / "bin" / "appworld"), "install"])  # unpacks the apps' code; offline
    if opts.download:
        _run([str(path / "bin" / "appworld"), "download", "data", "--root", opts.root])
    if opts.root is not None:
        check_root(opts.root)
        print(f"AppWorld data ok at {opts.root}")
    print(f"AppWorld virtualenv ready: {path}")
    return 0


def fixture(opts: FixtureOptions) -> int:
    from entrogym.envs.appworld.fixture import build_fixture
    from entrogym.envs.appworld.runtime import appworld_python

    appworld_python(opts.venv)
    print(json.dumps(build_fixture(opts.dir, opts.venv)))
    return 0


def serve(opts: ServeOptions) -> int:
    from entrogym.envs.appworld.runtime import AppWorldServer

    server = AppWorldServer(
        opts.root, venv=opts.venv, port=opts.port, memory_limit_mb=opts.memory_limit_mb
    )
    server.start()
    print(f"AppWorld environment server on {server.url} (root {server.root}); Ctrl-C stops it.")
    try:
        while server.alive():
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def cli(argv: list[str]) -> int:
    def body() -> int:
        args = parse_namespace(build_parser(), argv)
        name = args.command
        opts = config_from(args[name], SUBCOMMANDS[name])
        try:
            return {"setup": setup, "fixture": fixture, "serve": serve}[name](opts)
        except FileNotFoundError as exc:  # no AppWorld virtualenv / root: say what to run
            raise ValueError(str(exc)) from exc

    return run_command(PROG, body)
