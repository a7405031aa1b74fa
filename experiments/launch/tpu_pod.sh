#!/usr/bin/env bash
# Pretraining (or fine-tuning) on a Cloud TPU pod slice (several TPU VM hosts): the same command on every worker.
#
# Usage (this repository checked out at ~/$REMOTE_REPO, default ~/bert_jax, on every worker):
#   TPU_NAME=my-v4-32 ZONE=us-central2-b experiments/launch/tpu_pod.sh --workdir=/mnt/shared/bert_base \
#       --config=experiments/configs/pretrain.py:base
# Arguments go to the entry point unchanged (ENTRY, default experiments/pretrain.py). --distributed=on
# lets jax.distributed find the coordinator, the process count and each worker's id from the TPU
# metadata: no addresses needed.
# The workdir must be shared by all workers (NFS, a gcsfuse mount): they write each checkpoint together.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME to the name of the TPU VM}" "${ZONE:?set ZONE to its zone}"
REMOTE_REPO="${REMOTE_REPO:-bert_jax}"  # relative to the remote home directory
ENTRY="${ENTRY:-experiments/pretrain.py}"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all \
    --command="cd $REMOTE_REPO && python3 $ENTRY --distributed=on $(printf '%q ' "$@")"
