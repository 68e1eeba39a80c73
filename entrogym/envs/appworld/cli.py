"""``entrogym appworld setup | fixture | serve``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from jsonargparse import ArgumentParser

from entrogym.envs.appworld.runtime import AppWorldServer, appworld_python, check_root, default_venv

APPWORLD_VERSION = "0.1.3.post1"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="entrogym appworld", description="Set up and serve AppWorld.")
    parser.add_argument("--config", action="config")
    sub = parser.add_subcommands(dest="command")
    setup = ArgumentParser(description="Create .venv-appworld with appworld and unpack its apps.")
    setup.add_argument("--venv", type=str | None, default=None, help="virtualenv path")
    setup.add_argument("--python", type=str, default="python3.11")
    setup.add_argument("--download", type=bool, default=False, help="also download the data")
    setup.add_argument("--root", type=str | None, default=None, help="AppWorld root (data/ in it)")
    fixture = ArgumentParser(description="Build the offline fixture world into DIR.")
    fixture.add_argument("dir", type=str)
    fixture.add_argument("--venv", type=str | None, default=None)
    serve = ArgumentParser(description="Serve AppWorld's environment on 127.0.0.1 until Ctrl-C.")
    serve.add_argument("--root", type=str, help="AppWorld root")
    serve.add_argument("--port", type=int | None, default=None)
    serve.add_argument("--venv", type=str | None, default=None)
    serve.add_argument("--memory_limit_mb", type=int, default=4096)
    sub.add_subcommand("setup", setup)
    sub.add_subcommand("fixture", fixture)
    sub.add_subcommand("serve", serve)
    return parser


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def setup(venv: str | None, python: str, download: bool, root: str | None) -> int:
    path = Path(venv) if venv else default_venv()
    if not (path / "bin" / "python").exists():
        _run([python, "-m", "venv", str(path)])
    py = str(path / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", f"appworld=={APPWORLD_VERSION}"])
    _run([str(path / "bin" / "appworld"), "install"])  # unpacks the apps' code; offline
    if download:
        if root is None:
            raise ValueError("--download needs --root DIR (where data/ goes)")
        _run([str(path / "bin" / "appworld"), "download", "data", "--root", root])
    if root is not None:
        check_root(root)
        print(f"AppWorld data ok at {root}")
    print(f"AppWorld virtualenv ready: {path}")
    return 0


def cli(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    cmd = args.command
    opts = args[cmd]
    if cmd == "setup":
        return setup(opts.venv, opts.python, opts.download, opts.root)
    if cmd == "fixture":
        from entrogym.envs.appworld.fixture import build_fixture

        appworld_python(opts.venv)
        print(json.dumps(build_fixture(opts.dir, opts.venv)))
        return 0
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


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
