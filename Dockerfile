# spade on GPUs: Megatron-core training + the sandbox service, one image for every node.
#
# Base image: NVIDIA's NGC PyTorch container, pinned by tag. It carries a CUDA build of torch
# together with the libraries Megatron-core wants on GPUs and that are slow or fragile to build
# ourselves: Transformer Engine, apex, flash-attn, cuDNN and NCCL. 26.01 ships PyTorch 2.10.0
# on CUDA 13.1.1 (Ubuntu 24.04, Python 3.12). Megatron-core releases are validated on the NGC
# PyTorch container of the month before them, and 26.01 is the container of the megatron-core
# 0.16 line, so it is the one we pin for megatron-core==0.16.1.
# Not the SGLang image (lmsysorg/sglang:<version>-cu12x/-cu130): it has SGLang and its own torch
# but neither Transformer Engine nor apex. SGLang (the rollout servers, separate processes) is
# installed below into a virtual environment of its own, /opt/sglang, because it pins another
# torch than the one the training stack here is built against.
#
# Build:   docker build -t spade:dev .
# Run:     examples/launch/docker_run.sh (the flags the bubblewrap sandbox needs are explained there
#          and in docs/scale_out.md)
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:26.01-py3
FROM ${BASE_IMAGE}

# bubblewrap runs the generated environments (spade's sandbox refuses to start without it);
# python3-venv for the SGLang environment below.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap python3-venv \
    && rm -rf /var/lib/apt/lists/*

# SGLang rollout servers, in their own virtual environment. sglang==0.5.23 pins torch==2.14.1
# (the PyPI build for CUDA 13.0, with its own CUDA libraries and nvidia-nccl-cu13 2.30.7), while
# Transformer Engine, apex and flash-attn in this image are built against the image's torch 2.10;
# one environment cannot hold both. The servers are separate processes, so they get their own
# interpreter: /opt/sglang (no system site-packages, so the image's torch is invisible to it). The
# plain `sglang` requirement is the server: 0.5.23 has no `srt` extra any more (its extras are
# optional add-ons: diffusion, ray, tracing, ...). spade's sglang_protocol.py was checked against
# exactly this release; bump the two together. PIP_CONSTRAINT is emptied: the image's constraints
# pin its own torch.
#
# /opt/sglang/bin/sglang-python runs that interpreter with the base image's Python package
# directories (its torch/lib among them) taken out of LD_LIBRARY_PATH and without PYTHONPATH, so
# the environment's torch loads its own libraries and not the image's. SPADE_SGLANG_PYTHON (set
# below) names it, and spade's launcher runs `$SPADE_SGLANG_PYTHON -m sglang.launch_server` for
# every colocated server (engine.sglang.server_command, when set, still replaces the whole
# `python -m sglang.launch_server` prefix).
#
# Two torches, one CUDA-IPC hand-over. Colocated servers receive the weights as CUDA-IPC handles
# pickled by the trainer's torch (2.10) and rebuilt by the server's (2.14.1) through
# torch.multiprocessing.reductions.rebuild_cuda_tensor and its 15-value argument tuple (tensor
# class, size, stride, offset, storage class, dtype, device, IPC handle, storage size and offset in
# bytes, requires_grad, ref-counter handle and offset, event handle, event-sync flag). That layout
# is identical in torch 2.13 and 2.14.1 (2.10 was not inspected), SGLang 0.5.23's restricted
# unpickler allows that function, and it accepts the device as an index or a GPU UUID. The GPU
# check has to prove it end to end in this image: a CUDA tensor serialized by the image's python
# (spade.rollout.weight_transport.serialize_named_tensors) is loaded by a server started with
# /opt/sglang/bin/sglang-python via /update_weights_from_tensor (between /begin_weight_update and
# /end_weight_update) and read back with /get_weights_by_name. The broadcast path (disaggregated
# servers) is a second cross-version seam: the trainer's NCCL (this image's) and the server's
# (2.30.7) join one communicator, which NCCL does not promise to support across versions; it needs
# its own GPU check, or both sides loading one libnccl.
ARG SGLANG_VERSION=0.5.23
RUN python -m venv /opt/sglang \
    && PIP_CONSTRAINT= /opt/sglang/bin/python -m pip install --no-cache-dir "sglang==${SGLANG_VERSION}" \
    && printf '%s\n' \
        '#!/bin/sh' \
        '# /opt/sglang/bin/python without the base image Python packages on the search paths.' \
        'set -f' \
        'keep=' \
        'IFS=:' \
        'for dir in ${LD_LIBRARY_PATH-}; do' \
        '  case "$dir" in ""|*/dist-packages/*|*/site-packages/*) ;; *) keep="${keep:+$keep:}$dir" ;; esac' \
        'done' \
        'unset IFS' \
        'if [ -n "$keep" ]; then export LD_LIBRARY_PATH="$keep"; else unset LD_LIBRARY_PATH; fi' \
        'unset PYTHONPATH' \
        'exec /opt/sglang/bin/python "$@"' \
        > /opt/sglang/bin/sglang-python \
    && chmod -R a+rX /opt/sglang && chmod a+rx /opt/sglang/bin/sglang-python \
    && /opt/sglang/bin/sglang-python -c "import torch, sglang; print('sglang', sglang.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda); assert sglang.__version__ == '${SGLANG_VERSION}'"
ENV SPADE_SGLANG_PYTHON=/opt/sglang/bin/sglang-python

WORKDIR /workspace/spade

# Python dependencies. requirements.txt pins torch==2.13.0 for the CPU development environment
# (`make setup`); here the image's CUDA torch is used instead and must stay: it is the torch that
# Transformer Engine, apex and flash-attn were compiled against, and it must be one that
# megatron-core 0.16.1 supports (torch >= 2.6; 26.01 has 2.10). So torch is filtered out of the
# pins, and megatron-core is installed explicitly at the version requirements.txt pins.
# --no-deps: requirements.txt lists every transitive dependency itself, so nothing else gets
# resolved (and nothing can pull a different torch). PIP_CONSTRAINT is emptied for these
# installs only: the NGC image constrains its own package versions via /etc/pip/constraint.txt,
# and spade's pins (transformers, numpy, ...) differ from some of them.
COPY requirements.txt ./
RUN grep -vE '^(torch|megatron-core)==' requirements.txt > /tmp/requirements.gpu.txt \
    && PIP_CONSTRAINT= pip install --no-cache-dir --no-deps megatron-core==0.16.1 \
    && PIP_CONSTRAINT= pip install --no-cache-dir --no-deps -r /tmp/requirements.gpu.txt \
    && python -c "import torch, megatron.core; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'megatron-core', megatron.core.__version__)"

# The project itself, editable so that examples/ and tools/ resolve next to the package
# (config paths are resolved relative to the working directory, then to this checkout).
COPY . .
RUN PIP_CONSTRAINT= pip install --no-cache-dir --no-deps -e . \
    && chmod -R a+rX /workspace/spade \
    && spade --help >/dev/null

# Non-root-safe defaults: nothing below needs root at run time. Run with
# `--user "$(id -u):$(id -g)"` so files in mounted run directories belong to you; caches go to
# a writable place for any uid, and no byte code is written into the read-only checkout.
# USER: getpass.getuser() (torch's compile caches) needs it when the uid has no passwd entry.
ENV PYTHONDONTWRITEBYTECODE=1 \
    USER=spade \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp/spade-home \
    HF_HOME=/tmp/spade-home/hf \
    TRITON_CACHE_DIR=/tmp/spade-home/triton

# The image's entrypoint (NGC's banner and driver checks) is kept; the default command is a shell.
CMD ["bash"]
