#!/usr/bin/env bash
# Pretraining (or fine-tuning) over several GPU hosts without a scheduler: run this once on every host.
#
# Usage (host 0 is the coordinator; its port must be free and reachable from every host):
#   COORDINATOR=host0:12355 NUM_HOSTS=2 HOST_ID=0 experiments/launch/multi_gpu_host.sh --workdir=/shared/run
#   COORDINATOR=host0:12355 NUM_HOSTS=2 HOST_ID=1 experiments/launch/multi_gpu_host.sh --workdir=/shared/run
# Any further arguments go to the entry point unchanged (--config=..., --config.batch_size=...).
# ENTRY picks it: experiments/pretrain.py (default), or e.g. ENTRY=experiments/finetune.py.
#
# By default one process per host drives all of its GPUs. PER_GPU=1 starts one process per local GPU
# instead, each pinned to its GPU with --local_device_ids (also works on one host: NUM_HOSTS=1).
# Every host needs the same code and corpus paths, and the workdir on a filesystem all hosts share:
# all processes write each checkpoint together.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NUM_HOSTS="${NUM_HOSTS:-1}"
HOST_ID="${HOST_ID:-0}"
COORDINATOR="${COORDINATOR:-localhost:12355}"  # only right for NUM_HOSTS=1
ENTRY="${ENTRY:-experiments/pretrain.py}"

if [[ "${PER_GPU:-0}" != 1 ]]; then
  exec python3 "$REPO/$ENTRY" --coordinator_address="$COORDINATOR" \
      --num_processes="$NUM_HOSTS" --process_id="$HOST_ID" "$@"
fi

GPUS="$(nvidia-smi --list-gpus | wc -l)"
pids=()
for ((gpu = 0; gpu < GPUS; gpu++)); do
  python3 "$REPO/$ENTRY" --coordinator_address="$COORDINATOR" \
      --num_processes=$((NUM_HOSTS * GPUS)) --process_id=$((HOST_ID * GPUS + gpu)) \
      --local_device_ids="$gpu" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=$?
done
exit "$status"
