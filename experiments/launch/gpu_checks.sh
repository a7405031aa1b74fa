#!/bin/bash
# The one script to run on a GPU machine (≤ 9 minutes; figures: docs/results.md, "On one GPU"), from the repo root:
#   OUT=/tmp/gpu_checks experiments/launch/gpu_checks.sh
# Each check under its own time limit, a log per check in $OUT, its tail printed; the main figures first:
#   ladder     the speed levers one at a time on the BERT-base train step (256 x 128, bfloat16), each kept when
#              faster, then a profile of the best step (tools/levers.py) -> $OUT/gpu_table.md, .csv, profile.md
#   gpu_tests  the gpu-marked tests: fused attention against XLA, the randomised mask fuzz test
#   targets    BERT-large and BERT-base at 512, ModernBERT-base at 1,024 and 8,192 with the ladder's switches
# Without a GPU (no nvidia-smi) it is a dry run of the same table on tiny shapes (--levers_smoke) on the CPU.
# Python packages the device image lacks travel as wheels in .whl/ (git-ignored; docs/scaling.md says how).
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/bert_jax_site \
    .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/bert_jax_site
fi
# A second run of the script (same machine) reuses compiled steps, and every compile reuses XLA's GEMM autotuning.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/bert_jax_compilation_cache}
check() {  # NAME SECONDS COMMAND...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s"
  tail -n "${TAIL:-24}" "$OUT/$name.log"
}
SMOKE=()
if command -v nvidia-smi > /dev/null; then
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  echo "no nvidia-smi: a CPU dry run on tiny shapes"
  SMOKE=(--levers_smoke)
fi
python3 -c 'import sys, jax, jaxlib, flax, optax; print("python", sys.version.split()[0], "jax", jax.__version__,
"jaxlib", jaxlib.__version__, "flax", flax.__version__, "optax", optax.__version__, jax.devices())'
TAIL=40 check ladder "${LADDER_S:-270}" python3 experiments/benchmark.py --levers=ladder --out="$OUT" --steps=5 \
  "${SMOKE[@]}"
if [ ${#SMOKE[@]} = 0 ]; then
  check gpu_tests "${TESTS_S:-110}" env JAX_PLATFORMS=cuda python3 -m pytest -m gpu -q tests/model
fi
TAIL=12 check targets "${TARGETS_S:-150}" python3 experiments/benchmark.py --levers=targets --out="$OUT" --steps=5 \
  "${SMOKE[@]}"
cat "$OUT/gpu_table.md"
