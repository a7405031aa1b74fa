#!/bin/bash
# The checks one short GPU session runs (figures: docs/results.md, "On one GPU"), from the repository root:
#   OUT=/tmp/gpu_checks experiments/launch/gpu_checks.sh
# In order of importance, each under its own time limit, a log per check in $OUT and its tail printed:
# the gpu-marked tests; forward + backward of one global and one local layer (cuDNN, then XLA/einsum) at 512 to
# 8,192 tokens; the pretraining train step of BERT-base (seq 128) and BERT-large (seq 512) in bfloat16; and the
# `recipe` run end to end in bfloat16 (three phases, the local layers on cuDNN from the extension on).
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
check() {  # NAME SECONDS COMMAND...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s"
  tail -n "${TAIL:-24}" "$OUT/$name.log"
}
nvidia-smi -L
python3 -c 'import jax, flax, optax; print("python", __import__("sys").version.split()[0], "jax", jax.__version__,
"flax", flax.__version__, "optax", optax.__version__, jax.devices())'
check gpu_tests 150 env JAX_PLATFORMS=cuda python3 -m pytest -m gpu -q tests/model
for impl in cudnn xla; do
  check "attention_layers_$impl" 120 python3 experiments/benchmark.py --attention_layers --preset=base \
    --dtype=bfloat16 --seq_len=512,1024,2048,4096,8192 --batch_size=4 --attention_impl="${impl/cudnn/}"
done
# One shape each: a train step compiles in about 35 s on an H200 (BERT-base, 2026-11-27).
TAIL=8 check train_step_base 100 python3 experiments/benchmark.py --preset=base --dtype=bfloat16 \
  --batch_size=256 --seq_len=128 --attention_dropout=0 --steps=5
TAIL=8 check train_step_large 120 python3 experiments/benchmark.py --preset=large --dtype=bfloat16 \
  --batch_size=32 --seq_len=512 --attention_dropout=0 --steps=5
rm -rf /tmp/recipe_gpu
check recipe 240 python3 experiments/pretrain.py --workdir=/tmp/recipe_gpu \
  --config=experiments/configs/pretrain.py:recipe --config.model.dtype=bfloat16 --config.model.attention_dropout=0
