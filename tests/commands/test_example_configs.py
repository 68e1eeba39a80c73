"""Every YAML in examples/configs parses through the real ``entrogym train`` parser.

No model is loaded and nothing trains: the checks are that each file becomes a valid
``TrainConfig``, names registered envs and an existing preset whose overrides apply, and that
the paper-scale files carry the paper's values (appendix "Training", Sec. 6 "Experiments").
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import entrogym  # noqa: F401  (registers the built-in env ids)
from entrogym.algos.presets import ALGORITHMS
from entrogym.commands.train import parse_config
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.train.config import TrainConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
PAPER_ENVS = ("aime", "appworld")
# AppWorld splits exist only once its data is installed, so they are checked by name.
APPWORLD_SPLITS = ("train", "dev", "test_normal", "test_challenge")


def load(path: Path, *extra: str) -> TrainConfig:
    return parse_config(["--config", str(path), *extra])


def _algo_in(path: Path) -> dict:
    """The ``algo:`` mapping ``path`` holds (a preset's name is its mapping), or the one of the
    file it includes."""
    data = yaml.safe_load(path.read_text())
    if "algo" not in data:
        return _algo_in(path.parent / data["config"])
    return {"name": data["algo"]} if isinstance(data["algo"], str) else data["algo"]


def entry_class(env_id: str) -> type:
    entry = gym.spec(env_id).entry_point
    if not isinstance(entry, str):
        return entry
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def is_appworld(env_id: str) -> bool:
    return entry_class(env_id).__name__ == "AppWorldEnv"


def check_split(env_id: str, env_kwargs: dict, split: str | None) -> None:
    """The split exists and has tasks (AppWorld: the split name is one it knows)."""
    if is_appworld(env_id):
        assert split in APPWORLD_SPLITS, f"{env_id}: unknown split {split!r}"
        return
    env = make_text_env(env_id, **env_kwargs)
    try:
        assert task_ids_of(env, split), f"{env_id} has no tasks in split {split!r}"
    finally:
        env.close()


def test_the_folder_holds_every_paper_setting() -> None:
    names = {p.name for p in CONFIGS}
    expected = {f"{env}-{algo}.yaml" for env in PAPER_ENVS for algo in ALGORITHMS}
    assert expected <= names, f"missing: {sorted(expected - names)}"
    assert {"aime.yaml", "appworld.yaml", "cpu-arithmetic-repo-r.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses_into_a_valid_run(path: Path) -> None:
    assert path.read_text().startswith("#"), f"{path.name}: start with a comment on sources"
    cfg = load(path)
    assert isinstance(cfg, TrainConfig)

    # The env id is registered and the env kwargs are ones its constructor takes.
    assert cfg.env in gym.registry, f"{path.name}: env {cfg.env!r} is not registered"
    inspect.signature(entry_class(cfg.env)).bind_partial(**cfg.env_kwargs)
    check_split(cfg.env, cfg.env_kwargs, cfg.split)
    if cfg.eval_env is not None:
        assert cfg.eval_env in gym.registry, f"{path.name}: eval env {cfg.eval_env!r}"
        check_split(cfg.eval_env, {}, cfg.eval_split)

    # The preset exists and its options apply (an unknown one raises ValueError).
    given = _algo_in(path)
    assert cfg.algo.name == given["name"]
    for setting in ("epochs", "minibatch_size"):
        if setting in given:
            assert getattr(cfg.algo, setting) == given[setting]

    assert cfg.max_response_tokens <= cfg.max_context_tokens
    assert cfg.out != TrainConfig().out, f"{path.name}: give the run its own out folder"


@pytest.mark.parametrize("env", PAPER_ENVS)
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_paper_scale_configs_carry_the_paper_values(env: str, algo: str) -> None:
    cfg = load(CONFIG_DIR / f"{env}-{algo}.yaml")
    assert cfg.algo.name == algo
    assert cfg.out == f"runs/{env}-{algo}"
    # Appendix "Training".
    assert cfg.samples == 6
    assert cfg.lr == 5e-5
    assert cfg.weight_decay == 0.01
    assert cfg.max_grad_norm == 0.1
    assert (cfg.lora_rank, cfg.lora_alpha) == (16, 32)
    assert (cfg.early_stop_min_per_task, cfg.early_stop_fraction) == (4, 0.9)
    # Sec. 6 models; appendix "Float16 Training" for the reported runs.
    assert cfg.model == "Qwen/Qwen3-8B"
    assert cfg.dtype == "fp16"
    # Sec. 6 "Algorithms": RLOO takes all experience in one minibatch; the others 256 / 128.
    minibatch = cfg.algo.minibatch_size
    if algo == "rloo":
        assert minibatch is None
    else:
        assert minibatch == (256 if env == "aime" else 128)
    if env == "aime":
        assert cfg.env == "entrogym/AIMETrain-v0"
        assert cfg.eval_env == "entrogym/AIME-v0"
        assert cfg.max_response_tokens == cfg.max_context_tokens == 4096
    else:
        assert cfg.env == "entrogym/AppWorld-v0"
        assert cfg.split == "train"
        assert cfg.env_kwargs["max_turns"] == 30
        assert cfg.env_kwargs["reward"] == "fraction"
        assert cfg.max_context_tokens == 32768
        assert (cfg.eval_env, cfg.eval_split) == ("entrogym/AppWorld-v0", "dev")


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("cpu-*.yaml")), ids=lambda p: p.name)
def test_cpu_configs_are_cpu_sized(path: Path) -> None:
    cfg = load(path)
    assert cfg.model == "smollm2-135m-instruct"
    assert cfg.engine in ("vllm", "hf")
    assert cfg.dtype == "fp32"
    assert cfg.tasks_per_iter * cfg.samples <= 48
    assert cfg.max_context_tokens <= 8192  # SmolLM2's position embeddings


def test_included_file_resolves_relative_to_the_including_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `config: aime.yaml` must not depend on the working folder
    cfg = load(CONFIG_DIR / "aime-gspo.yaml")
    assert (cfg.algo.name, cfg.max_response_tokens) == ("gspo", 4096)


def test_later_sources_override_earlier_ones() -> None:
    """What README.md in examples/configs documents: files and options apply left to right,
    and an algorithm option set earlier stays set when a later source changes another."""
    cfg = load(CONFIG_DIR / "appworld.yaml", "--config", str(CONFIG_DIR / "aime-dapo.yaml"))
    assert (cfg.env, cfg.algo.name) == ("entrogym/AIMETrain-v0", "dapo")
    cfg = load(CONFIG_DIR / "aime.yaml", "--algo", "rloo")
    assert (cfg.algo.name, cfg.algo.minibatch_size) == ("rloo", 256)
    cfg = load(CONFIG_DIR / "aime-grpo.yaml", "--seed", "3", "--out", "runs/x")
    assert (cfg.seed, cfg.out, cfg.algo.minibatch_size) == (3, "runs/x", 256)
    cfg = load(CONFIG_DIR / "aime-grpo.yaml", "--algo.epochs", "3")
    assert (cfg.algo.epochs, cfg.algo.minibatch_size) == (3, 256)
    cfg = load(CONFIG_DIR / "aime-repo-d.yaml", "--algo.controller", "pi")
    assert (cfg.algo.controller.name, cfg.algo.minibatch_size) == ("pi", 256)


def test_engine_urls_take_a_list() -> None:
    urls = "[http://10.0.0.2:8000, http://10.0.0.2:8001]"
    cfg = load(
        CONFIG_DIR / "appworld-repo-r.yaml", "--engine", "vllm-server", "--engine-urls", urls
    )
    assert cfg.engine_urls == ["http://10.0.0.2:8000", "http://10.0.0.2:8001"]


def test_readme_lists_every_config() -> None:
    readme = (CONFIG_DIR / "README.md").read_text()
    missing = [p.name for p in CONFIGS if f"`{p.name}`" not in readme]
    assert not missing, f"examples/configs/README.md does not list {missing}"


def test_the_quickstart_trains_at_the_demos_settings(tmp_path: Path) -> None:
    """The README's quickstart is the demo's REPO-R run: the same task, sampler, batch and
    learning rate, so the demo's measured times and rewards are the quickstart's."""
    from entrogym.commands.demo_runs import parse_run
    from entrogym.experiments.config import DEFAULT_LR, demo_config

    quick = load(CONFIG_DIR / "quickstart.yaml")
    demo = demo_config(parse_run("repo-r").algo, tmp_path, quick.iterations, DEFAULT_LR, 40)
    same = ("env", "env_kwargs", "model", "engine", "engine_dtype", "dtype", "tasks_per_iter",
            "samples", "early_stop_min_per_task", "early_stop_fraction", "lr", "micro_batch_size",
            "max_response_tokens", "max_context_tokens", "on_turn_budget", "system_prompt",
            "eval_env", "eval_env_kwargs", "eval_split", "eval_every", "eval_tasks")  # fmt: skip
    assert {k: getattr(quick, k) for k in same} == {k: getattr(demo, k) for k in same}
    assert quick.algo == demo.algo
