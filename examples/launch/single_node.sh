#!/usr/bin/env bash
# spade train on one node with 8 GPUs (torchrun, one process per GPU).
#
#   examples/launch/single_node.sh [CONFIG] [RUN_DIR] [key.sub=value ...]
#
# Variables (defaults in brackets):
#   CONFIG        recipe [examples/recipes/qwen3_4b_games_8gpu.yaml]; also
#                 qwen3_8b_games_8gpu.yaml, qwen3_30b_a3b_games_8gpu.yaml
#   RUN_DIR       run directory, shared by all ranks [runs/<config name>-<date>-<time>]
#   NPROC         processes (GPUs) on this node [8]
#   MASTER_PORT   torchrun's rendezvous port on localhost [29500]
#   HF_DIR        optional: override model.hf_dir (a local HF directory: config.json,
#                 *.safetensors, tokenizer files)
#   CONVERT_TO    optional: ALSO write a Megatron distributed checkpoint of HF_DIR here first
#                 (tools/convert_hf_to_mcore.py). The trainer does NOT need it: `spade train`
#                 loads the HF directory directly and converts in memory on every rank. The
#                 conversion is only for using the Megatron checkpoint elsewhere (e.g.
#                 `spade score`, or a Megatron-LM job); it is layout-independent on load.
#   PYTHON        python with spade installed [python3; .venv/bin/python when present]; torchrun is
#                 its own (python -m torch.distributed.run), never another one on PATH
#
# Resume a stopped run (same layout): torchrun ... -m spade train --resume RUN_DIR
set -euo pipefail

usage() {  # the comment block at the top of this file
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac

cd "$(dirname "$0")/../.."
CONFIG=${1:-${CONFIG:-examples/recipes/qwen3_4b_games_8gpu.yaml}}
[ $# -gt 0 ] && shift
RUN_DIR=${1:-${RUN_DIR:-runs/$(basename "${CONFIG%.yaml}")-$(date +%Y%m%d-%H%M%S)}}
[ $# -gt 0 ] && shift
NPROC=${NPROC:-8}
MASTER_PORT=${MASTER_PORT:-29500}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OVERRIDES=("$@")
if [ -n "${HF_DIR:-}" ]; then
  OVERRIDES+=("model.hf_dir=${HF_DIR}")
fi

if [ ! -f "$CONFIG" ]; then
  echo "no such config: $CONFIG" >&2; usage >&2; exit 2
fi

# The checks of a start (config, model directory and chat template, corpus, pool, sandbox) before any
# GPU is touched; a config that cannot start stops here with its one-line reason (exit 2 or 3).
"$PYTHON" -m spade train --config "$CONFIG" --check "${OVERRIDES[@]}" >/dev/null

if [ -n "${CONVERT_TO:-}" ]; then
  : "${HF_DIR:?CONVERT_TO needs HF_DIR (the HF directory to convert)}"
  # any tp/ep works (the result loads at any layout); the flags only split the work over ranks
  "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" tools/convert_hf_to_mcore.py \
    --hf-dir "$HF_DIR" --out "$CONVERT_TO" --tp "${CONVERT_TP:-1}" --ep "${CONVERT_EP:-1}" --dtype bfloat16
fi

export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}

echo "spade: $NPROC ranks, config $CONFIG, run dir $RUN_DIR" >&2
exec "$PYTHON" -m torch.distributed.run --nnodes 1 --nproc_per_node "$NPROC" \
  --rdzv_backend c10d --rdzv_endpoint "localhost:${MASTER_PORT}" \
  -m spade train --config "$CONFIG" --run-dir "$RUN_DIR" "${OVERRIDES[@]}"
