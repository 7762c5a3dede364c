# syntax=docker/dockerfile:1.7
# spade on GPUs: Megatron-core training, SGLang rollout servers and the sandbox service in ONE
# Python environment, for every node.
#
# Why one environment. The colocated weight sync hands CUDA-IPC handles pickled by the trainer's
# torch to the server's torch, and the disaggregated one joins the trainer's rank 0 and the server
# workers in one NCCL communicator; NCCL refuses peers of another version ("Mismatched NCCL version
# detected"). So trainer and servers must load the same torch and the same libnccl. The image
# therefore starts from SGLang's own release image, whose torch is the one sglang pins, and builds
# the training stack against that torch (the way the Megatron+SGLang RL frameworks build theirs).
# spade checks the match at start-up: `python -m spade.rollout.sglang.runtime_versions`.
#
# Versions (change them together; the build stops if the base is not what is expected):
#   base        lmsysorg/sglang:v0.5.23-cu130: sglang 0.5.23 (the release rollout/sglang/protocol.py and
#               sglang_argv were checked against), which pins torch==2.14.1; the cu130 image is the
#               CUDA 13.0 build of that torch (its NCCL is the nvidia-nccl-cu13 wheel torch depends
#               on). Ubuntu 24.04, Python 3.12, CUDA 13.0 toolkit with cuDNN (nvcc, for the builds
#               below). Pin it by digest too when you mirror it (FROM ...@sha256:...).
#   megatron-core 0.16.1           spade's training backend (requirements.txt pins the same).
#   Transformer Engine 2.11.0      megatron-core 0.16.1 declares transformer-engine >= 2.9, < 2.12;
#                                  2.11.0 is the newest of that range. Built from source (tag v2.11,
#                                  commit below) against this torch and this CUDA toolkit: the
#                                  prebuilt CUDA 13 wheels are linked against a newer cuBLAS than a
#                                  13.0 toolkit has.
#   apex (commit 6424da3b, 2026-07-08)  no releases exist; megatron-core 0.16.1 uses its FusedAdam,
#                                  fused layer norm and multi_tensor_apply when TE lacks one; needs
#                                  torch >= 2.6. C++ and CUDA extensions built against this torch.
#   flash-attn (FA2): NOT installed. sglang 0.5.23 requires flash-attn-4, which ships the
#                                  `flash_attn.cute` package; the flash-attn 2.8.x wheel ships an
#                                  older `flash_attn/cute` of its own and would overwrite SGLang's
#                                  kernels in place. Transformer Engine runs attention with cuDNN's
#                                  fused kernels without it, and spade does not import flash_attn.
#                                  (TE 2.11 would also accept no FA2 newer than 2.8.3.)
#   build tools for the two source builds: cmake 3.31.6, pybind11 3.0.1 (ninja: the image's).
#   TE runtime extras: onnx 1.23.2, onnxscript 0.7.2.
# Every package the base image already has keeps the base's version: /etc/spade/constraints.txt
# (the base's `pip list`, plus torch) is in PIP_CONSTRAINT for every install below and at run
# time, so no later `pip install` can bring in a second torch or NCCL. Where spade's
# requirements.txt pins another version of a package the base has (transformers, tokenizers, ...),
# the base's wins and the build log lists each case; the rest of requirements.txt is installed at
# its pins. The full result is written to /etc/spade/image-freeze.txt.
#
# CUDA architectures: 9.0 (H100/H200) by default; add more for other GPUs, e.g.
#   docker build --build-arg TORCH_CUDA_ARCH_LIST="9.0;10.0" --build-arg NVTE_CUDA_ARCHS="90;100" .
#
# Stages: `base` is the checked SGLang image with the constraints and the build tools; `te` and
# `apex` each build one wheel on it (BuildKit builds the two side by side); the last stage installs
# both wheels and spade. The least tested pairing is TE 2.11 against torch 2.14.1 (TE's release is
# older than that torch), so TE is the first stage after the base and can be built alone:
#   docker build --target te -t spade:te .   (base + TE only: a TE/torch break fails here, before
#                                             apex, megatron-core or spade are touched)
# Build:   docker build -t spade:dev .      (about an hour: TE and apex compile; MAX_JOBS bounds it)
# Run:     examples/launch/docker_run.sh (the flags the bubblewrap sandbox needs are explained there
#          and in docs/scale_out.md)
ARG BASE_IMAGE=lmsysorg/sglang:v0.5.23-cu130
ARG SGLANG_VERSION=0.5.23
ARG TORCH_VERSION=2.14.1
ARG CUDA_MAJOR_MINOR=13.0
ARG MEGATRON_CORE_VERSION=0.16.1
ARG TE_VERSION=2.11.0
ARG TE_COMMIT=c188b533cc3721ca9c6bbfd26148f5cf60108c25
ARG APEX_COMMIT=6424da3b4faa6c8f062da4a48c424fff3f02d42d
ARG TORCH_CUDA_ARCH_LIST=9.0
ARG NVTE_CUDA_ARCHS=90
ARG MAX_JOBS=16

FROM ${BASE_IMAGE} AS base
ARG SGLANG_VERSION
ARG TORCH_VERSION
ARG CUDA_MAJOR_MINOR

# System Python of the SGLang image: pip installs go there (no virtual environment on purpose).
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# The base must be what the pins above assume; then freeze it as the constraints of every install.
RUN python3 - <<EOF
import sys, torch, sglang
print("base: python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "sglang", sglang.__version__)
assert sglang.__version__ == "${SGLANG_VERSION}", sglang.__version__
assert torch.__version__.split("+")[0] == "${TORCH_VERSION}", torch.__version__
assert torch.version.cuda == "${CUDA_MAJOR_MINOR}", torch.version.cuda
EOF
RUN mkdir -p /etc/spade \
    && python3 -m pip list --format=freeze > /etc/spade/constraints.txt \
    && grep -qiE '^torch==' /etc/spade/constraints.txt \
    && nvcc --version | tail -2
ENV PIP_CONSTRAINT=/etc/spade/constraints.txt

# bubblewrap runs the generated environments (spade's sandbox refuses to start without it); git
# for the source builds.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap git \
    && rm -rf /var/lib/apt/lists/*

# `spade-pip-missing FILE`: the requirement lines (NAME==VERSION) of FILE whose package the image
# does not have yet; for each one it has, one line on stderr naming both versions.
RUN cat > /usr/local/bin/spade-pip-missing <<'EOF' && chmod a+rx /usr/local/bin/spade-pip-missing
#!/usr/bin/env python3
import sys
from importlib import metadata

for line in open(sys.argv[1]):
    requirement = line.split("#", 1)[0].strip()
    if not requirement:
        continue
    name, _, wanted = requirement.partition("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        print(requirement)
        continue
    note = "same" if have == wanted else f"spade pins {wanted}, the image's {have} is kept"
    print(f"{name}: already in the image ({note})", file=sys.stderr)
EOF

# Build tools for the source builds (only those the base lacks) and TE's runtime extras.
RUN printf '%s\n' cmake==3.31.6 pybind11==3.0.1 ninja==1.13.0 onnx==1.23.2 onnxscript==0.7.2 > /tmp/tools.txt \
    && spade-pip-missing /tmp/tools.txt > /tmp/tools.missing \
    && if [ -s /tmp/tools.missing ]; then python3 -m pip install -r /tmp/tools.missing; fi

# Transformer Engine (PyTorch part only) from source, against the image's torch and CUDA, as a
# wheel in /wheels; installed in this stage too, to check its version and its torch extension.
FROM base AS te
ARG TE_VERSION
ARG TE_COMMIT
ARG NVTE_CUDA_ARCHS
ARG MAX_JOBS
RUN NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS="${NVTE_CUDA_ARCHS}" MAX_JOBS="${MAX_JOBS}" \
    python3 -m pip wheel -v --no-deps --no-build-isolation --wheel-dir /wheels \
        "transformer_engine @ git+https://github.com/NVIDIA/TransformerEngine.git@${TE_COMMIT}" \
    && python3 -m pip install --no-deps /wheels/transformer_engine-*.whl
RUN python3 - <<EOF
import glob, site
from importlib.metadata import version
te = version("transformer_engine")
print("transformer_engine", te)
assert te.split("+")[0] == "${TE_VERSION}", te
built = [path for root in site.getsitepackages() for path in glob.glob(root + "/transformer_engine_torch*.so")]
assert built, "no transformer_engine_torch*.so: TE's torch extension was not built"
print("TE torch extension:", built[0])
EOF

# apex: C++ and CUDA extensions (what megatron-core's fallbacks import), against the same torch,
# as a wheel in /wheels.
FROM base AS apex
ARG APEX_COMMIT
ARG TORCH_CUDA_ARCH_LIST
ARG MAX_JOBS
RUN APEX_CPP_EXT=1 APEX_CUDA_EXT=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" MAX_JOBS="${MAX_JOBS}" \
    NVCC_APPEND_FLAGS="--threads 4" \
    python3 -m pip wheel -v --no-deps --no-build-isolation --wheel-dir /wheels \
        "apex @ git+https://github.com/NVIDIA/apex.git@${APEX_COMMIT}"

FROM base AS image
ARG TORCH_VERSION
ARG MEGATRON_CORE_VERSION
ARG TE_VERSION

# The two wheels built above (TE's Python dependencies come from the index, under the constraints).
RUN --mount=type=bind,from=te,source=/wheels,target=/tmp/te-wheels \
    --mount=type=bind,from=apex,source=/wheels,target=/tmp/apex-wheels \
    python3 -m pip install /tmp/te-wheels/transformer_engine-*.whl /tmp/apex-wheels/apex-*.whl \
    && python3 -c "from importlib.metadata import version as v; te = v('transformer_engine'); print('transformer_engine', te, 'apex', v('apex')); assert te.split('+')[0] == '${TE_VERSION}', te"

# megatron-core without dependencies: it needs torch, numpy and packaging, all in the image.
RUN python3 -m pip install --no-deps "megatron-core==${MEGATRON_CORE_VERSION}"

WORKDIR /workspace/spade

# spade's pinned dependencies (tests included: tools/gpu_check.sh runs pytest), those the image
# lacks, without their dependencies (requirements.txt lists every transitive one itself).
COPY requirements.txt ./
RUN grep -vE '^(torch|megatron-core)==' requirements.txt > /tmp/requirements.spade.txt \
    && spade-pip-missing /tmp/requirements.spade.txt > /tmp/requirements.missing \
    && if [ -s /tmp/requirements.missing ]; then python3 -m pip install --no-deps -r /tmp/requirements.missing; fi

# The project itself, editable so that examples/ and tools/ resolve next to the package
# (config paths are resolved relative to the working directory, then to this checkout).
COPY . .
RUN python3 -m pip install --no-deps -e . \
    && chmod -R a+rX /workspace/spade \
    && spade --help >/dev/null \
    && python3 -m pip list --format=freeze > /etc/spade/image-freeze.txt \
    && python3 - <<EOF
from importlib.metadata import version
import megatron.core, torch
print("image: torch", torch.__version__, "cuda", torch.version.cuda, "megatron-core", megatron.core.__version__,
      "transformer_engine", version("transformer_engine"), "apex", version("apex"), "sglang", version("sglang"))
assert megatron.core.__version__ == "${MEGATRON_CORE_VERSION}"
assert torch.__version__.split("+")[0] == "${TORCH_VERSION}", "a second torch replaced the image's"
EOF

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

CMD ["bash"]
