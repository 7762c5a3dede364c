#!/usr/bin/env bash
# Every GPU check of spade in one run on a lent GPU machine, inside the Docker image (one Python
# environment: trainer and SGLang on one torch and one NCCL). Made to finish on one H200 in under
# 8 minutes: a time budget (GPU_CHECK_BUDGET_S, default 450 s) bounds the whole run, every stage
# runs under the time left, and a stage that no longer fits is reported as not run. Stages run
# cheapest first and each prints its result and its seconds as soon as it ends, so a run cut short
# still leaves every figure measured so far. Exit status 1 if any stage failed or did not run.
#
#   versions      spade.rollout.sglang.runtime_versions: torch / CUDA / NCCL of the trainer and of the
#                 interpreter that runs SGLang (must be one), sglang's version
#   libraries     the GPU, Transformer Engine and apex extensions load, flash-attn present or not;
#                 the versions of the pairing (torch, TE, apex, megatron-core, transformers,
#                 tokenizers) next to the transformers/tokenizers pins the CPU tests run
#   ipc           CUDA-IPC hand-over of a weight bucket to another process (tests/test_gpu_sglang.py)
#   training      GPU tests of the Megatron path: TE spec, bf16, packed sequences, training-memory
#                 offload (tests/test_gpu.py, tests/test_gpu_offload.py)
#   routing-replay  R3 routing replay on CUDA, local and TE specs: Megatron's routers take the experts
#                 transformers' routers chose, the log-prob mismatch drops (tests/test_gpu_routing_replay.py)
#   mfu           training-step MFU of a Qwen3-4B-shaped model with random weights (target >= 40%)
#   sglang        a real SGLang server: teacher-forced log-probs against transformers, colocated
#                 weight update, memory release, seeded sampling, a server killed mid-rollout and
#                 restarted with the current weights; TP=2 and the NCCL-broadcast weight sync
#                 (a disaggregated server) when 2 GPUs are visible
#   spade-train   `spade train` two steps with a colocated SGLang server on one GPU
#   with MODEL_DIR naming an HF model (these need more than the default budget: raise
#   GPU_CHECK_BUDGET_S): `spade engine check`, rollout tokens/s through spade's client against a
#   bare client and SGLang's bench_serving, weight-sync seconds by bucket size.
#
#   bash tools/gpu_check.sh
#   MODEL_DIR=/models/Qwen3-4B-Instruct-2507 GPU_CHECK_BUDGET_S=1500 bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
BUDGET_S=${GPU_CHECK_BUDGET_S:-450}
MIN_STAGE_S=20  # a stage is not started with less time than this left
START=$SECONDS
status=0
SUMMARY=()
PYTEST=("$PY" -m pytest -v -s -p no:cacheprovider -m gpu)

# stage NAME CAP_SECONDS COMMAND...: run COMMAND for at most CAP_SECONDS (less if the budget
# has less left), then print its verdict and seconds.
stage() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  if ((left < MIN_STAGE_S)); then
    echo "== $name: NOT RUN (${left}s of the ${BUDGET_S}s budget left)"
    SUMMARY+=("$(printf '%-12s %-26s %5s' "$name" "not run (out of time)" "-")")
    status=1
    return
  fi
  ((cap > left)) && cap=$left
  echo "== $name: starting (at most ${cap}s; $((SECONDS - START))s into the run)"
  local t0=$SECONDS rc=0
  timeout --kill-after=15 "$cap" "$@" || rc=$?
  local took=$((SECONDS - t0)) verdict
  if ((rc == 0)); then verdict=PASS
  elif ((rc == 124 || rc == 137)); then verdict="TIMEOUT at ${cap}s"
  else verdict="FAIL (exit $rc)"; fi
  ((rc == 0)) || status=1
  echo "== $name: $verdict in ${took}s"
  SUMMARY+=("$(printf '%-12s %-26s %4ds' "$name" "$verdict" "$took")")
}

stage versions 120 "$PY" -m spade.rollout.sglang.runtime_versions
stage libraries 120 "$PY" - <<'PYEOF'
import importlib.util
from importlib.metadata import PackageNotFoundError, version

import torch


def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


print("pairing:", ", ".join(f"{name} {installed(name)}" for name in (
    "torch", "transformer_engine", "apex", "megatron-core", "transformers", "tokenizers", "sglang")))
pins = dict(line.split("#", 1)[0].strip().partition("==")[::2] for line in open("requirements.txt") if "==" in line)
for name in ("transformers", "tokenizers"):
    if installed(name) != pins.get(name):
        print(f"{name}: the CPU tests run {pins.get(name)}, this environment has {installed(name)}")
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else None,
      "count", torch.cuda.device_count())
assert torch.cuda.is_available(), "no CUDA device"
import transformer_engine
import transformer_engine.pytorch  # noqa: F401  (loads the compiled extension)
print("transformer_engine", transformer_engine.__version__)
import amp_C  # noqa: F401  (apex's CUDA extensions)
import fused_layer_norm_cuda  # noqa: F401
print("apex extensions load")
spec = importlib.util.find_spec("flash_attn")
print("flash_attn:", "present (" + str(spec.submodule_search_locations) + ")" if spec else "absent",
      "(TE uses cuDNN fused attention without FA2)")
PYEOF
stage ipc 90 "${PYTEST[@]}" tests/test_gpu_sglang.py -k cuda_ipc
stage training 150 "${PYTEST[@]}" tests/test_gpu.py tests/test_gpu_offload.py
stage routing-replay 120 "${PYTEST[@]}" tests/test_gpu_routing_replay.py
stage mfu 150 "$PY" tools/gpu_mfu.py "$@"
stage sglang 240 "${PYTEST[@]}" tests/test_gpu_sglang.py -k "real_sglang"
stage spade-train 240 "${PYTEST[@]}" tests/test_gpu_sglang.py -k "spade_train"
if [ -n "${MODEL_DIR:-}" ]; then
  stage engine-check 400 "$PY" -m spade engine check --model-path "$MODEL_DIR"
  stage throughput 600 "$PY" benchmarks/rollout_throughput.py --model-path "$MODEL_DIR" --concurrency 64 \
      --num-prompts 256 --input-len 1024 --output-len 1024 --sglang-bench
  stage weight-sync 400 "$PY" benchmarks/weight_sync.py --model-path "$MODEL_DIR" --device cuda \
      --bucket-mb 128,512,1024
fi

echo "== summary ($((SECONDS - START))s of a ${BUDGET_S}s budget)"
printf '%s\n' "${SUMMARY[@]}"
exit $status
