#!/usr/bin/env bash
# Build the spade image and run training in it, on one node or on several.
#
#   examples/launch/docker_run.sh build                       # docker build -t $IMAGE .
#   examples/launch/docker_run.sh shell                       # interactive shell, GPUs attached
#   examples/launch/docker_run.sh single [CONFIG] [RUN_DIR] [key=value ...]   # 8 GPUs, this node
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 \
#     examples/launch/docker_run.sh multi [CONFIG] RUN_DIR [key=value ...]    # on EVERY node
#
# Variables (defaults in brackets):
#   IMAGE         image tag [spade:dev]
#   MODELS_DIR    host directory with the HF model directories, mounted at /workspace/spade/models
#                 so the recipes' model.hf_dir (models/...) resolve [./models]
#   RUNS_DIR      host directory for run directories, mounted at /workspace/spade/runs [./runs];
#                 for several nodes it must be a filesystem shared by all of them, at the same path
#   RUN_AS_ROOT   1: run as root inside the container [0: as your uid:gid, so run files are yours]
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, NPROC, NCCL_*: passed to multi_node.sh
#
# Flags, and why (see docs/scale_out.md):
#   --gpus all                          every GPU of the node
#   --ipc=host                          CUDA IPC and NCCL shared-memory transport between ranks
#                                       (the host's /dev/shm; without --ipc=host give a large
#                                       --shm-size instead, e.g. 64g: Docker's default is 64m)
#   --ulimit memlock=-1                 pinned memory for NCCL / InfiniBand
#   --network host                      torchrun rendezvous and NCCL between nodes (also harmless on
#                                       one node); InfiniBand also wants --device /dev/infiniband
#   The bubblewrap sandbox creates an unprivileged user namespace with its own pid, mount and
#   network namespaces and mounts a fresh /proc and tmpfs inside it. Docker's defaults block that
#   in three places, each lifted by one --security-opt (no --privileged, no --cap-add SYS_ADMIN):
#     seccomp=unconfined       the default seccomp profile refuses unshare/clone with namespace
#                              flags (and mount) to processes without CAP_SYS_ADMIN; a custom
#                              profile that allows unshare, clone/clone3 with CLONE_NEW*, mount,
#                              umount2 and pivot_root does as well
#     apparmor=unconfined      docker-default AppArmor denies mount (AppArmor hosts only)
#     systempaths=unconfined   Docker masks /proc paths; the kernel then refuses a new /proc
#                              mount in a user namespace ("mount too revealing"), which bwrap's
#                              --proc needs (podman: --security-opt unmask=ALL)
#   Host side: user namespaces enabled (user.max_user_namespaces > 0); on Ubuntu 23.10+ also
#   kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile allowing userns for
#   bwrap. spade's sandbox self-test names the missing layer if any of this is off.
set -euo pipefail

usage() {  # the comment block at the top of this file
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

cd "$(dirname "$0")/../.."
IMAGE=${IMAGE:-spade:dev}
MODELS_DIR=${MODELS_DIR:-$PWD/models}
RUNS_DIR=${RUNS_DIR:-$PWD/runs}
RUN_AS_ROOT=${RUN_AS_ROOT:-0}

run_flags() {
  local flags=(
    --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864
    --network host
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined
    --security-opt systempaths=unconfined
    -v "$MODELS_DIR:/workspace/spade/models:ro" -v "$RUNS_DIR:/workspace/spade/runs"
  )
  if [ "$RUN_AS_ROOT" != 1 ]; then
    flags+=(--user "$(id -u):$(id -g)")
  fi
  if [ -e /dev/infiniband ]; then
    flags+=(--device /dev/infiniband)
  fi
  local var
  for var in NNODES NODE_RANK MASTER_ADDR MASTER_PORT NPROC RDZV_ID NCCL_DEBUG NCCL_SOCKET_IFNAME \
             NCCL_IB_HCA GLOO_SOCKET_IFNAME SPADE_SANDBOX_ISOLATION; do
    if [ -n "${!var:-}" ]; then
      flags+=(-e "$var=${!var}")
    fi
  done
  printf '%s\n' "${flags[@]}"
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  build)
    exec docker build -t "$IMAGE" "$@" .
    ;;
  shell)
    mkdir -p "$RUNS_DIR"
    mapfile -t flags < <(run_flags)
    exec docker run -it "${flags[@]}" "$IMAGE" bash
    ;;
  single)
    mkdir -p "$RUNS_DIR"
    mapfile -t flags < <(run_flags)
    # run directories given as runs/NAME land in $RUNS_DIR on the host
    exec docker run "${flags[@]}" "$IMAGE" examples/launch/single_node.sh "$@"
    ;;
  multi)
    for var in NNODES NODE_RANK MASTER_ADDR; do
      [ -n "${!var:-}" ] || { echo "set $var (see below)" >&2; usage >&2; exit 2; }
    done
    mkdir -p "$RUNS_DIR"
    mapfile -t flags < <(run_flags)
    exec docker run "${flags[@]}" "$IMAGE" examples/launch/multi_node.sh "$@"
    ;;
  -h|--help|help)
    usage
    ;;
  *)
    usage >&2
    exit 2
    ;;
esac
