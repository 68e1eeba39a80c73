#!/usr/bin/env bash
# The CUDA checks (`make test-gpu`'s tests and the iteration bench against TRL) on a GPU machine
# that has PyTorch but no package index and no copy of the GGUF (docs/performance.md, "GPU tests").
#
#   benchmarks/gpu_offline.sh pins               # the wheels' name==version, one per line
#   benchmarks/gpu_offline.sh bundle [DIR]       # here, after `make setup`: wheels, tokenizer, model shape
#   benchmarks/gpu_offline.sh check [DIR] [OUT]  # there, from the repository root, DIR copied along
#
# DIR defaults to .gpu-bundle (git ignores it), OUT to gpu-results. `check` reads REPS (default 3)
# and DTYPES (default "fp32 bf16"), writes env.txt, test-gpu.log and one iteration-DTYPE.json and
# reps-DTYPE.txt per dtype into OUT, and exits 1 if a test or a bench run failed. The bench's
# model is random weights (seed 0) in SmolLM2-135M-Instruct's shape: every completion runs to the
# token budget, so the work does not depend on the weights, and the 100 MB GGUF need not travel.
set -euo pipefail
cmd=${1:-}
dir=${2:-.gpu-bundle}

# What a PyTorch GPU image usually lacks, at the versions this checkout's `.venv` holds (TRL at
# `make bench`'s pin), so the GPU runs the code CI tests. PYVER is the GPU machine's Python (these
# wheels are pure Python, tagged for it).
PYVER=${PYVER:-3.12}
NAMES=(
  transformers peft datasets dill multiprocess gymnasium Farama-Notifications cut-cross-entropy
  gguf jsonargparse docstring_parser typeshed_client math-verify latex2sympy2_extended
  antlr4-python3-runtime
)

pins() {
  .venv/bin/python -c 'import importlib.metadata as m, sys
print("\n".join(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' "${NAMES[@]}"
  grep -o '"trl==[0-9.]*"' Makefile | tr -d '"'
}

bundle() {
  local reqs
  reqs=$(pins)  # an assignment, so that set -e stops here if a package is missing
  mkdir -p "$dir/whl" "$dir/shape"
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$dir/whl" $reqs
  # The tokenizer the tiny test models are built around, and the default model's config and
  # tokenizer without its weights.
  .venv/bin/python - "$dir" <<'EOF'
import shutil, sys
from pathlib import Path
from entrogym.models import default_cache_dir, resolve_model, smollm2_tokenizer
out = Path(sys.argv[1])
smollm2_tokenizer(None)
shutil.copytree(default_cache_dir() / "tokenizers", out / "tokenizers", dirs_exist_ok=True)
model = Path(resolve_model("smollm2-135m-instruct"))
for f in model.iterdir():
    if f.suffix != ".safetensors" and f.name != "entrogym-model.json":
        shutil.copy(f, out / "shape" / f.name)
EOF
  du -sh "$dir"
}

check() {
  local out=${3:-gpu-results} site=/tmp/entrogym-gpu-site cache=/tmp/entrogym-gpu-cache
  mkdir -p "$out" "$cache"
  export PYTHONUNBUFFERED=1 ENTROGYM_CACHE=$cache
  [ -f "$site/.done" ] || { python3 -m pip install -q --no-index --no-deps --no-compile \
    --target "$site" "$dir"/whl/*.whl && touch "$site/.done"; }
  export PYTHONPATH=$site:$PWD
  cp -r "$dir/tokenizers" "$cache/"
  # iteration.py runs TRL with .venv-bench's python: where there is none, this machine's, with
  # the wheels (an existing .venv-bench is left as it is).
  if [ ! -e .venv-bench/bin/python ]; then
    mkdir -p .venv-bench/bin
    printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv-bench/bin/python
    chmod +x .venv-bench/bin/python
  fi
  local shape=/tmp/entrogym-gpu-shape
  [ -f "$shape/model.safetensors" ] || python3 - "$dir/shape" "$shape" <<'EOF'
import shutil, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)
torch.manual_seed(0)
config = AutoConfig.from_pretrained(sys.argv[2])
AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(sys.argv[2])
EOF
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    python3 -c "import torch, transformers, peft, trl; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__)"
    git log -1 --format=%h 2>/dev/null || true
  } 2>&1 | tee "$out/env.txt"
  # `make test-gpu`'s tests, without its setup step (no package index here).
  local status=0
  python3 -m pytest -q -ra -m gpu -p no:cacheprovider tests/gpu tests/train/test_logprobs.py \
    2>&1 | tee "$out/test-gpu.log" || status=1
  for dtype in ${DTYPES:-fp32 bf16}; do
    python3 benchmarks/iteration.py --model "$shape" --device cuda --vs-trl --no-roofline-rows \
      --iterations 3 --reps "${REPS:-3}" --dtype "$dtype" --timeout 150 \
      >"$out/iteration-$dtype.json" 2> >(tee "$out/reps-$dtype.txt" >&2) || status=1
  done
  return $status
}

case $cmd in
  pins) pins ;;
  bundle) bundle ;;
  check) check "$@" ;;
  *) echo "usage: $0 pins | bundle [DIR] | check [DIR] [OUT]" >&2; exit 2 ;;
esac
