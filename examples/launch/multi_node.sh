#!/usr/bin/env bash
# spade train across several nodes: run this same script on EVERY node, each with its NODE_RANK.
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 examples/launch/multi_node.sh [CONFIG] RUN_DIR [key.sub=value ...]
#
# Variables (defaults in brackets):
#   NNODES        number of nodes [required]
#   NODE_RANK     this node's index, 0..NNODES-1; node 0 holds global rank 0 [required]
#   MASTER_ADDR   address of node 0, reachable from every node [required]
#   MASTER_PORT   rendezvous port on node 0 (c10d store) [29500]
#   NPROC         GPUs per node [8]
#   RDZV_ID       rendezvous id, the same on every node of one job [spade-<config name>]
#   CONFIG        recipe [examples/recipes/qwen3_30b_a3b_games_multinode.yaml]
#   RUN_DIR       run directory [required]: every rank reads and rank 0 writes it, so it must
#                 be the same path on a filesystem shared by all nodes (NFS, Lustre, ...)
#   PYTHON        python with spade installed [python3; .venv/bin/python when present]; torchrun is
#                 its own (python -m torch.distributed.run), never another one on PATH
#   NCCL_SOCKET_IFNAME / NCCL_IB_HCA / GLOO_SOCKET_IFNAME
#                 network interface / InfiniBand adapters for NCCL and gloo; set them when the
#                 nodes have several interfaces (e.g. NCCL_SOCKET_IFNAME=eth0) [unset: NCCL picks]
#
# Roles: global rank 0 runs the sandbox service (started before the model loads) and the self-play
# orchestrator; local rank 0 of every node launches that node's SGLang servers (engine.kind:
# sglang, ports engine.sglang.port and up, reachable from node 0: the multinode recipes bind
# 0.0.0.0); every rank trains its Megatron shard and feeds the server worker on its GPU with the
# new weights. The model directory (model.hf_dir) and the corpus must exist at the same path on
# every node. SGLang runs from spade's own Python environment (one torch and one NCCL for trainer
# and servers; spade checks it at start-up: python -m spade.rollout.sglang.runtime_versions).
set -euo pipefail

usage() {  # the comment block at the top of this file
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac

cd "$(dirname "$0")/../.."
missing=()
for var in NNODES NODE_RANK MASTER_ADDR; do
  [ -n "${!var:-}" ] || missing+=("$var")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "set ${missing[*]} (see below)" >&2; usage >&2; exit 2
fi
CONFIG=${1:-${CONFIG:-examples/recipes/qwen3_30b_a3b_games_multinode.yaml}}
[ $# -gt 0 ] && shift
RUN_DIR=${1:-${RUN_DIR:-}}
[ $# -gt 0 ] && shift
if [ -z "$RUN_DIR" ]; then
  echo "give RUN_DIR (a path on a filesystem shared by all nodes)" >&2; usage >&2; exit 2
fi
MASTER_PORT=${MASTER_PORT:-29500}
NPROC=${NPROC:-8}
RDZV_ID=${RDZV_ID:-spade-$(basename "${CONFIG%.yaml}")}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

if [ ! -f "$CONFIG" ]; then
  echo "no such config: $CONFIG" >&2; usage >&2; exit 2
fi
# the checks of a start before any GPU is touched (one-line reason and exit 2 or 3 if it cannot start)
"$PYTHON" -m spade train --config "$CONFIG" --check "$@" >/dev/null

# NCCL hints: log warnings, fail fast on a hung collective. On InfiniBand clusters also set
# NCCL_IB_HCA (e.g. mlx5) and keep NCCL_IB_DISABLE unset; on plain Ethernet set NCCL_SOCKET_IFNAME.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
if [ -n "${NCCL_SOCKET_IFNAME:-}" ] && [ -z "${GLOO_SOCKET_IFNAME:-}" ]; then
  export GLOO_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME
fi

echo "spade: node $NODE_RANK of $NNODES, $NPROC ranks here, rendezvous $MASTER_ADDR:$MASTER_PORT ($RDZV_ID)" >&2
exec "$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC" \
  --rdzv_id "$RDZV_ID" --rdzv_backend c10d --rdzv_endpoint "${MASTER_ADDR}:${MASTER_PORT}" \
  -m spade train --config "$CONFIG" --run-dir "$RUN_DIR" "$@"
