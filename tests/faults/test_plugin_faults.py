"""A part of the user's own (``module:Name``: an env, a lever, a controller, any algorithm part)
that raises on import, calls ``sys.exit`` on import, is missing, lacks the name or is of the
wrong base type fails loudly: one line naming the module and what went wrong, exit code 2,
before any model loads or any run folder is written. So do a ReasoningGym weight that is not a
finite positive number and a controller knob out of range (the message names that knob only)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]

# the user's modules, written into tmp_path (on PYTHONPATH)
MODULES = {
    "exit_mod": "import sys\nsys.exit(0)\n",
    "exit_three_mod": "raise SystemExit(3)\n",
    "raise_mod": "\n\nraise RuntimeError('boom at import')\n",
    "dep_mod": "import entrogym_no_such_dependency  # noqa: F401\n",
    "wrong_mod": """
        import gymnasium as gym


        class MyLever:  # a lever must subclass entrogym.algos.Lever
            pass


        class MyController:
            pass


        def my_loss(*args, **kwargs):  # not registered with register_loss
            return 0.0


        class Boom(gym.Env):
            def __init__(self):
                raise RuntimeError("cannot build")


        class Quits(gym.Env):
            def __init__(self):
                raise SystemExit(0)


        gym.register(id="wrong/Boom-v0", entry_point=Boom)
        gym.register(id="wrong/Quits-v0", entry_point=Quits)
    """,
}

CASES = [
    (
        'lever: "exit_mod:MyLever"',
        "lever 'exit_mod:MyLever': module 'exit_mod' called sys.exit(0) while being imported",
    ),
    (
        'lever: "exit_three_mod:MyLever"',
        "lever 'exit_three_mod:MyLever': module 'exit_three_mod' called sys.exit(3) while being "
        "imported",
    ),
    (
        'lever: "raise_mod:MyLever"',
        "lever 'raise_mod:MyLever': importing module 'raise_mod' raised RuntimeError: boom at "
        "import (raise_mod.py, line 3)",
    ),
    (
        'controller: "raise_mod:MyController"',
        "controller 'raise_mod:MyController': importing module 'raise_mod' raised RuntimeError: "
        "boom at import (raise_mod.py, line 3)",
    ),
    (
        'loss: "exit_mod:my_loss"',
        "loss 'exit_mod:my_loss': module 'exit_mod' called sys.exit(0) while being imported",
    ),
    (
        'lever: "dep_mod:MyLever"',
        "lever 'dep_mod:MyLever': module 'dep_mod' imports 'entrogym_no_such_dependency', "
        "which is not installed",
    ),
    (
        'lever: "wrong_mod:Nope"',
        "lever 'wrong_mod:Nope': module 'wrong_mod' has no 'Nope' and registers no lever "
        "of that name",
    ),
    (
        'lever: "wrong_mod:MyLever"',
        "lever 'wrong_mod:MyLever': wrong_mod.MyLever is of the wrong type: a lever must "
        "subclass entrogym.algos.Lever",
    ),
    (
        'controller: "wrong_mod:MyController"',
        "controller 'wrong_mod:MyController': wrong_mod.MyController is of the wrong type: a "
        "controller must subclass entrogym.algos.Controller",
    ),
    (
        'loss: "wrong_mod:my_loss"',
        "loss 'wrong_mod:my_loss': wrong_mod.my_loss is not registered as a loss; decorate it "
        "with @entrogym.algos.register_loss('my_loss')",
    ),
    (
        "controller: {name: pi, kp: -1}",
        "algo.controller.kp must be >= 0, got -1",
    ),
]


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, source in MODULES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


def _run(command: str, argv: list[str], plugins: Path) -> subprocess.CompletedProcess[str]:
    """``entrogym COMMAND argv`` as a user types it, with the plug-ins on PYTHONPATH; the
    process fails if a model library was imported (that is, a model began to load)."""
    code = (
        f"import sys; from entrogym.commands.{command} import cli; rc = cli({argv!r}); "
        "heavy = {'transformers', 'peft', 'vllm'} & set(sys.modules); "
        "assert not heavy, f'{heavy} imported'; sys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": str(plugins)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=REPO,
        env=env,
    )  # fmt: skip


@pytest.mark.parametrize(("algo", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_algorithm_part_is_one_line_before_anything_loads(
    algo: str, message: str, plugins: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    proc = _run("train", [*TINY, "--out", str(out), "--algo", f"{{name: repo-r, {algo}}}"], plugins)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"entrogym train: error: {message}\n"
    assert not out.exists()


ENV_CASES = [
    (
        "exit_mod:Plug-v0",
        "env 'exit_mod:Plug-v0': module 'exit_mod' called sys.exit(0) while being imported",
    ),
    (
        "raise_mod:Plug-v0",
        "env 'raise_mod:Plug-v0': importing module 'raise_mod' raised RuntimeError: boom at "
        "import (raise_mod.py, line 3)",
    ),
    (
        "wrong_mod:wrong/Boom-v0",
        "env 'wrong_mod:wrong/Boom-v0': making the env raised RuntimeError: cannot build "
        "(wrong_mod.py, line 19)",
    ),
    (
        "wrong_mod:wrong/Quits-v0",
        "env 'wrong_mod:wrong/Quits-v0': making the env raised SystemExit: 0 (wrong_mod.py, "
        "line 24)",
    ),
]


@pytest.mark.parametrize(("env", "message"), ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_an_env_module_that_fails_on_import_or_build_is_one_line_for_train(
    env: str, message: str, plugins: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    proc = _run("train", [*TINY, "--out", str(out), "--env", env], plugins)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"entrogym train: error: {message}\n"
    assert not out.exists()


def test_an_env_module_that_exits_on_import_is_one_line_for_eval(
    plugins: Path, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    proc = _run("eval", [*TINY, "--env", "exit_mod:Plug-v0", "--out", str(out)], plugins)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "module 'exit_mod' called sys.exit(0) while being imported" in proc.stderr
    assert not out.exists()


def test_an_env_module_that_exits_on_import_is_one_line_for_sequential(
    plugins: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sequential"
    argv = ["--model", "tiny-random-llama", "--out", str(out), "--task-a", "exit_mod:Plug-v0"]
    proc = _run("sequential", argv, plugins)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "entrogym sequential: error: task_a 'exit_mod:Plug-v0': module 'exit_mod' called "
        "sys.exit(0) while being imported\n"
    )
    assert not out.exists()


@pytest.mark.parametrize("weight", [".inf", "-.inf", ".nan", "-1", "0"])
def test_a_reasoning_gym_weight_that_is_not_finite_and_positive_is_refused_at_parse_time(
    weight: str, plugins: Path, tmp_path: Path
) -> None:
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "run"
    kwargs = f"{{datasets: {{leg_counting: {weight}, gcd: 1}}, size: 16, test_size: 4}}"
    argv = [*TINY, "--out", str(out), "--env", "entrogym/ReasoningGym-v0", "--env-kwargs", kwargs]
    proc = _run("train", argv, plugins)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "dataset 'leg_counting': weight must be a finite number > 0, got " in proc.stderr
    assert not out.exists()


def test_ctrl_c_while_a_plugin_imports_still_interrupts(plugins: Path) -> None:
    from entrogym.algos.plugins import import_plugin

    (plugins / "interrupt_mod.py").write_text("raise KeyboardInterrupt\n")
    sys.path.insert(0, str(plugins))
    try:
        with pytest.raises(KeyboardInterrupt):
            import_plugin("interrupt_mod", "lever 'interrupt_mod:X'")
    finally:
        sys.path.remove(str(plugins))
