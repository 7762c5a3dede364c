# spade on GPUs: Megatron-core training + the sandbox service, one image for every node.
#
# Base image: NVIDIA's NGC PyTorch container, pinned by tag. It carries a CUDA build of torch
# together with the libraries Megatron-core wants on GPUs and that are slow or fragile to build
# ourselves: Transformer Engine, apex, flash-attn, cuDNN and NCCL. 26.01 ships PyTorch 2.10.0
# on CUDA 13.1.1 (Ubuntu 24.04, Python 3.12). Megatron-core releases are validated on the NGC
# PyTorch container of the month before them, and 26.01 is the container of the megatron-core
# 0.16 line, so it is the one we pin for megatron-core==0.16.1.
# Not the SGLang image (lmsysorg/sglang:<version>-cu12x/-cu130): it has SGLang and its own torch
# but neither Transformer Engine nor apex. SGLang itself is installed on top of this image once
# the sglang engine lands (issue 5); it pins its own torch, so that step must keep the image's
# torch (check SGLang's torch pin against the base before bumping either).
#
# Build:   docker build -t spade:dev .
# Run:     examples/launch/docker_run.sh (the flags the bubblewrap sandbox needs are explained there
#          and in docs/scale_out.md)
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:26.01-py3
FROM ${BASE_IMAGE}

# bubblewrap runs the generated environments (spade's sandbox refuses to start without it).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

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
