"""AppWorld on the real ``appworld`` package, against the offline fixture world.

Needs ``.venv-appworld`` (``make appworld-setup`` / ``entrogym appworld setup``); without it
the AppWorld tests FAIL with that command instead of skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from entrogym.agents.episode import Episode
from entrogym.envs.appworld import metrics, report
from entrogym.envs.appworld.prompt import clip_output, extract_code
from entrogym.envs.appworld.runtime import appworld_python, default_venv

# ----- pure functions (no AppWorld needed) -----------------------------------------------------


def test_tgc_sgc_match_appworld_definition() -> None:
    success = {"a_1": True, "a_2": True, "a_3": True, "b_1": True, "b_2": False, "c_1": False}
    assert metrics.task_goal_completion(success) == pytest.approx(4 / 6)
    assert metrics.scenario_goal_completion(success) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="SCENARIO_N"):
        metrics.scenario_id("bad_task_id")
    with pytest.raises(ValueError):
        metrics.task_goal_completion({})


def _episode(task_id: str, success: bool, **info) -> Episode:
    return Episode(task_id, 0, [], [], [], float(success), info={"success": success, **info})


def test_evaluation_report_metrics_without_appworld(tmp_path: Path) -> None:
    """Two samples per task: TGC/SGC per sample, averaged; AppWorld's own report is skipped
    (one output per task), so nothing needs the AppWorld runtime."""
    tasks = ["a_1", "a_2", "b_1"]
    eps = [
        _episode("a_1", True, num_tests=2),
        _episode("a_1", True, num_tests=2),
        _episode("a_2", True, num_tests=1),
        _episode("a_2", False, num_tests=1),
        _episode("b_1", False),
    ]  # fmt: skip  (b_1's second sample never ran)
    fields = report.evaluation_report(
        tmp_path, {"episodes": eps, "tasks": tasks, "samples": 2, "split": "dev"}, tmp_path
    )
    assert fields["tgc_runs"] == pytest.approx([2 / 3, 1 / 3])
    assert fields["sgc_runs"] == pytest.approx([1 / 2, 0.0])
    assert fields["tgc"] == pytest.approx(0.5) and fields["sgc"] == pytest.approx(0.25)
    assert fields["not_evaluated"] == 1 and "experiment_name" not in fields
    assert fields["appworld_report"] == {"ok": None, "skipped": report.report_skip_reason(2)}
    assert fields["report_lines"][0].startswith("AppWorld report skipped: --samples 2")
    assert "1 of 5 episodes ended on an error" in fields["report_lines"][1]
    assert fields["summary_text"] == "TGC=50.0% SGC=25.0%"
    row = report.task_fields("a_2", eps[2:4])  # the per-task columns of eval.json
    assert row == {"passes": [None, None], "fails": [None, None], "num_tests": [1, 1],
                   "scenario_id": "a"}  # fmt: skip
    one = report.evaluation_report(tmp_path, {"episodes": eps[:1], "tasks": ["a_1"]}, None)
    assert "were not kept" in one["appworld_report"]["skipped"]  # no shared experiment folder
    kwargs = report.evaluation_env_kwargs(1)
    assert kwargs["reward"] == "binary" and kwargs["max_turns"] == 50
    assert kwargs["experiment_name"].startswith("entrogym-eval-")
    assert "experiment_name" not in report.evaluation_env_kwargs(3)


def test_extract_code_and_clip() -> None:
    assert extract_code("no code here") is None
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\nprint(x)\n```") == "x = 1\n\nprint(x)"
    assert extract_code("cut off\n```python\nprint(1)") == "print(1)"
    clipped = clip_output("x" * 10_000, 100)
    assert len(clipped) < 200 and "9900 characters omitted" in clipped


# ----- servers die with their owner (entrogym.localserver.OwnedPopen) -------------------------

# The owner starts the server from a worker thread that then exits, as rollouts do: a
# PR_SET_PDEATHSIG-based guard would kill the server right there.
OWNER_OF_HTTP_SERVER = """
import subprocess, sys, threading, time
from entrogym.localserver import OwnedPopen, free_port
port, box = free_port(), []
cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
start = lambda: box.append(OwnedPopen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
thread = threading.Thread(target=start)
thread.start()
thread.join()
print(box[0].pid, port, flush=True)
time.sleep(600)
"""

OWNER_OF_APPWORLD_ENV = """
import sys, threading, time
from entrogym.envs.appworld.env import AppWorldEnv
env = AppWorldEnv("test_normal", sys.argv[1], experiment_name=sys.argv[2])
thread = threading.Thread(target=lambda: env.reset(options={"task_id": env.task_ids()[0]}))
thread.start()
thread.join()
print(env.server.process.pid, env.server.port, flush=True)
time.sleep(600)
"""


def _live_group_members(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that are not zombies (from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # the process exited while we looked
        if int(pgrp) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def _answers(port: int) -> bool:
    import requests

    try:
        requests.get(f"http://127.0.0.1:{port}/", timeout=1)
    except requests.RequestException:
        return False
    return True


def _assert_server_dies_with_owner(script: str, *args: str, startup_s: float = 120) -> None:
    """Run ``script`` (it prints the server's pid and port), SIGKILL it, and check that the
    server's port stops answering and its process group empties within a few seconds."""
    owner = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True
    )
    pid = port = None
    try:
        line = owner.stdout.readline() if owner.stdout else ""
        assert line, f"the owner exited before starting its server (code {owner.wait()})"
        pid, port = map(int, line.split())
        deadline = time.monotonic() + startup_s
        while not _answers(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)  # the starting thread is long gone; the server must still be there
        assert _answers(port) and pid in _live_group_members(pid)
        owner.kill()  # SIGKILL: the owner runs no cleanup at all
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (_answers(port) or _live_group_members(pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _answers(port), f"server on port {port} outlived its SIGKILLed owner"
        assert _live_group_members(pid) == [], "server processes outlived their owner"
    finally:
        owner.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_local_server_dies_with_its_sigkilled_owner() -> None:
    _assert_server_dies_with_owner(OWNER_OF_HTTP_SERVER, startup_s=30)


def test_stopped_local_server_leaves_no_watchdog_behind() -> None:
    from entrogym.localserver import OwnedPopen, free_port, stop_process_group

    port = free_port()
    cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    proc = OwnedPopen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not _answers(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _answers(port) and len(_live_group_members(proc.pid)) == 2  # server + watchdog
    stop_process_group(proc, term_wait=5)
    deadline = time.monotonic() + 5
    while _live_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.returncode is not None and _live_group_members(proc.pid) == []


# ----- the fixture world and the env -----------------------------------------------------------


@pytest.fixture(scope="session")
def world_root() -> Path:
    try:
        appworld_python()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc} (`make appworld-setup` creates it; AppWorld tests do not skip)")
    from entrogym.envs.appworld.fixture import cached_fixture

    return cached_fixture()  # $ENTROGYM_CACHE or ~/.cache/entrogym, keyed by the builder hash


def _solution(root: Path, task_id: str) -> str:
    code = (root / "data" / "tasks" / task_id / "ground_truth" / "solution.py").read_text()
    code = "\n".join(line for line in code.splitlines() if not line.startswith("# Canary"))
    return f"Here is my code.\n```python\n{code}\nsolution(apis, requester)\n```\n"


@pytest.fixture(scope="module")
def env(world_root: Path):
    from entrogym.envs.appworld.env import AppWorldEnv

    e = AppWorldEnv("train", world_root, exec_timeout_s=3)
    yield e
    e.close()


@pytest.mark.appworld
def test_fixture_world_shape_and_appworld_verify(world_root: Path) -> None:
    data = world_root / "data"
    splits = {s: (data / "datasets" / f"{s}.txt").read_text().split() for s in
              ("train", "dev", "test_normal", "test_challenge")}  # fmt: skip
    all_ids = [t for ids in splits.values() for t in ids]
    assert all(splits.values()) and len(all_ids) >= 12 and len(set(all_ids)) == len(all_ids)
    apps = {
        (data / "tasks" / t / "ground_truth" / "required_apps.json").read_text() for t in all_ids
    }
    assert len(apps) >= 4
    python = appworld_python()
    out = subprocess.run(
        [str(python.parent / "appworld"), "verify", "tasks", "--root", str(world_root)],
        capture_output=True, text=True, timeout=300, cwd=str(world_root),
    )  # fmt: skip
    n = len(splits["train"]) + len(splits["dev"])
    assert f"Passed {n}/{n} tasks." in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.appworld
@pytest.mark.parametrize("mode", ["binary", "fraction"])
def test_reference_solutions_get_full_reward(world_root: Path, mode: str) -> None:
    from entrogym.envs.appworld.env import AppWorldEnv

    env = AppWorldEnv("test_normal", world_root, reward=mode)
    try:
        task_ids = [t for s in env.splits for t in env.task_ids(s)]
        for task_id in task_ids:
            obs, info = env.reset(options={"task_id": task_id})
            assert info["instruction"] in obs and "apis.api_docs.show_app_descriptions()" in obs
            _, reward, terminated, truncated, info = env.step(_solution(world_root, task_id))
            assert terminated and not truncated, (task_id, info)
            assert reward == 1.0 and info["success"], (task_id, info)
            assert info["fails"] == 0 and info["passes"] == info["num_tests"] > 0
            assert info["scenario_id"] == task_id.split("_")[0]
    finally:
        env.close()


@pytest.mark.appworld
def test_partly_wrong_solution_gets_partial_fraction_and_zero_binary(world_root: Path, env) -> None:
    wrong = _solution(world_root, "newnote_1").replace("Squats on Monday", "Run on Friday")
    env.reward_mode = "fraction"
    env.reset(options={"task_id": "newnote_1"})
    _, reward, terminated, _, info = env.step(wrong)
    assert terminated and 0.0 < reward < 1.0 and reward == pytest.approx(2 / 3)
    assert info["reward_parts"]["binary"] == 0.0 and not info["success"]
    env.reward_mode = "binary"
    env.reset(options={"task_id": "newnote_1"})
    _, reward, _, _, info = env.step(wrong)
    assert reward == 0.0 and info["reward_parts"]["fraction"] == pytest.approx(2 / 3)
    env.reward_mode = "fraction"


@pytest.mark.appworld
def test_bad_actions_give_clear_observations_and_server_survives(world_root: Path, env) -> None:
    env.reset(options={"task_id": "notecount_1"})
    obs, reward, term, trunc, info = env.step("I am not sure what to do.")
    assert "No Python code block" in obs and info["turn"] == 1 and not (term or trunc)
    obs, *_ = env.step("```python\ndef broken(:\n```")
    assert "Syntax error" in obs
    obs, *_ = env.step("```python\nwhile True:\n    pass\n```")
    assert "timed out" in obs
    obs, *_ = env.step("```python\nimport os; os.system('touch /tmp/entrogym-pwned')\n```")
    assert "not allowed" in obs and not Path("/tmp/entrogym-pwned").exists()
    obs, *_ = env.step("```python\nprint('x' * 100_000_000)\n```")
    assert "characters omitted" in obs and len(obs) < 20_000
    obs, *_ = env.step("```python\ngarbage = 'y' * (16 * 2**30)\n```")
    assert "MemoryError" in obs
    assert env.server.alive() and env.server.restarts == 0
    _, reward, term, _, info = env.step(_solution(world_root, "notecount_1"))
    assert term and reward == 1.0 and info["turn"] == 7


@pytest.mark.appworld
def test_infinite_loop_does_not_block_other_episodes(world_root: Path, env) -> None:
    from entrogym.envs.appworld.env import AppWorldEnv

    other = AppWorldEnv("dev", world_root)
    try:
        env.reset(options={"task_id": "notecount_2"})
        other.reset(options={"task_id": "donetask_1"})
        result: dict = {}
        loop = threading.Thread(
            target=lambda: result.update(obs=env.step("```python\nwhile True: pass\n```")[0])
        )
        loop.start()
        _, reward, *_ = other.step(_solution(world_root, "donetask_1"))
        loop.join(timeout=60)
        assert reward == 1.0 and "timed out" in result["obs"]
    finally:
        other.close()


@pytest.mark.appworld
def test_server_binds_loopback_only(world_root: Path, env) -> None:
    env.reset(options={"task_id": "notecount_1"})
    port = env.server.port
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:  # 0A = LISTEN
                listening.append(local.split(":")[0])
    assert listening == ["0100007F"], listening  # 127.0.0.1 only, no 0.0.0.0, no IPv6


@pytest.mark.appworld
def test_server_death_fails_the_episode_and_restarts(world_root: Path, env) -> None:
    env.reset(options={"task_id": "newnote_2"})
    os.killpg(env.server.process.pid, signal.SIGKILL)
    env.server.process.wait(timeout=10)
    obs, reward, terminated, _, info = env.step("```python\nprint(1)\n```")
    assert terminated and reward == 0.0 and info["server_failure"] and not info["success"]
    assert "failed" in obs and env.server.alive() and env.server.restarts >= 1
    env.reset(options={"task_id": "newnote_2"})
    _, reward, *_ = env.step(_solution(world_root, "newnote_2"))
    assert reward == 1.0


@pytest.mark.appworld
def test_server_dies_with_its_sigkilled_owner(world_root: Path) -> None:
    experiment = f"entrogym-test-owner-{os.getpid()}"
    try:
        _assert_server_dies_with_owner(OWNER_OF_APPWORLD_ENV, str(world_root), experiment)
    finally:  # the killed owner could not delete its episode's outputs
        shutil.rmtree(world_root / "experiments" / "outputs" / experiment, ignore_errors=True)


@pytest.mark.appworld
def test_turn_limit_evaluates_the_world(world_root: Path) -> None:
    from entrogym.envs.appworld.env import AppWorldEnv

    env = AppWorldEnv("train", world_root, max_turns=2)
    try:
        env.reset(options={"task_id": "notecount_3"})
        env.step("```python\nx = 1\n```")
        _, reward, terminated, truncated, info = env.step("```python\nprint(x)\n```")
        # Doing nothing passes exactly the tests labelled no_op_pass (here: 1 of 2).
        assert truncated and not terminated and reward == pytest.approx(0.5)
        assert info["turn_limit_reached"] and info["passes"] == 1
    finally:
        env.close()


@pytest.mark.appworld
def test_check_env_and_gym_make(world_root: Path) -> None:
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import entrogym  # noqa: F401
    from entrogym.envs import check_text_env

    env = gym.make("entrogym/AppWorld-v0", split="test_normal", appworld_root=str(world_root))
    try:
        assert env.unwrapped.max_turns == 50 and env.unwrapped.reward_mode == "binary"
        check_env(env.unwrapped, skip_render_check=True)
        check_text_env(env, max_tasks=1)  # sampled actions: no code, 50 turns, then evaluation
    finally:
        env.close()


@pytest.mark.appworld
def test_evaluation_report_hook_runs_appworlds_own_report(world_root: Path, tmp_path) -> None:
    """What ``entrogym eval`` does through the env's hooks: rollouts in one kept experiment
    folder, then TGC/SGC and AppWorld's own evaluator's report."""
    import gymnasium as gym

    import entrogym  # noqa: F401

    probe = gym.make("entrogym/AppWorld-v0", split="test_normal", appworld_root=str(world_root))
    kwargs = probe.get_wrapper_attr("evaluation_env_kwargs")(samples=1)
    probe.close()
    env = gym.make(
        "entrogym/AppWorld-v0", split="test_normal", appworld_root=str(world_root), **kwargs
    )
    tasks = env.get_wrapper_attr("task_ids")()[:2]
    episodes = []
    try:
        env.reset(options={"task_id": tasks[0]})
        solved = env.step(_solution(world_root, tasks[0]))[4]  # all tests pass
        env.reset(options={"task_id": tasks[1]})
        _, untouched = env.get_wrapper_attr("end_episode")()  # the world as it started
        for task_id, info in zip(tasks, (solved, untouched), strict=True):
            episodes.append(Episode(task_id, 0, [], [], [], float(info["success"]), info=info))
        fields = env.get_wrapper_attr("evaluation_report")(
            {"episodes": episodes, "tasks": tasks, "samples": 1, "split": "test_normal"},
            tmp_path, report_name="first2",
        )  # fmt: skip
    finally:
        env.close()
        shutil.rmtree(
            world_root / "experiments" / "outputs" / kwargs["experiment_name"], ignore_errors=True
        )
    assert fields["tgc"] == 0.5 and fields["not_evaluated"] == 0
    assert fields["experiment_name"] == kwargs["experiment_name"]
    rep = fields["appworld_report"]
    assert rep["ok"] and rep["tasks"] == 2 and rep["missing_outputs"] == [], rep
    assert rep["aggregate"]["task_goal_completion"] == pytest.approx(50.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "appworld-report.json", "appworld-report.txt"
    ]  # fmt: skip
    assert fields["report_lines"][0].startswith("AppWorld report: TGC=50.0%")
    assert fields["summary_text"] == f"TGC=50.0% SGC={100 * fields['sgc']:.1f}%"
    # the other optional evaluation hooks, through the wrappers
    assert env.get_wrapper_attr("on_turn_budget") == "step"
    solved_row = env.get_wrapper_attr("evaluation_task_fields")(tasks[0], episodes[:1])
    assert solved_row["passes"] == solved_row["num_tests"] and solved_row["fails"] == [0]


@pytest.mark.appworld
def test_bad_input_errors(world_root: Path, tmp_path: Path) -> None:
    from entrogym.envs.appworld.env import AppWorldEnv
    from entrogym.envs.appworld.runtime import AppWorldServer

    with pytest.raises(ValueError, match="unknown split"):
        AppWorldEnv("validation", world_root)
    with pytest.raises(ValueError, match="appworld fixture"):
        AppWorldEnv("train", tmp_path)
    with pytest.raises(FileNotFoundError, match="entrogym appworld setup"):
        AppWorldEnv("train", world_root, venv=tmp_path / "no-venv")
    env = AppWorldEnv("train", world_root)
    try:
        with pytest.raises(ValueError, match="unknown task_id"):
            env.reset(options={"task_id": "nosuch_1"})
        with pytest.raises(ValueError, match="unknown split"):
            env.task_ids("test")
        assert env.task_ids("dev") == ["donetask_1", "donetask_2", "donetask_3"]
    finally:
        env.close()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ValueError, match="already in use"):
            AppWorldServer(world_root, port=busy).start()


def test_missing_venv_message(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="entrogym appworld setup"):
        appworld_python(tmp_path)
    assert default_venv().name == ".venv-appworld"
