#!/usr/bin/env bash
# Every GPU check of spade in one run, for a lent GPU machine. Prints its figures; exits non-zero
# if a test fails.
#   1. the GPU-marked tests: TE spec, bf16, packed sequences, the HF engine on CUDA, training-memory
#      offload (memory really freed and restored), the CUDA-IPC hand-over of weight buckets between
#      processes, and, when SGLang is installed (here or at $SPADE_SGLANG_PYTHON), a real SGLang
#      server: generation parity with transformers, a colocated weight update, memory release;
#   2. the training-step MFU of a Qwen3-4B-shaped model with random weights (target >= 40%);
#   3. when SGLang is installed and MODEL_DIR names an HF model: `spade engine check` on it, rollout
#      tokens/s through spade's client against a bare client (and SGLang's bench_serving), and
#      weight-sync seconds.
#   bash tools/gpu_check.sh            (after `make setup`, or with the packages installed)
#   MODEL_DIR=/models/Qwen3-4B-Instruct-2507 bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
try:
    import transformer_engine
    print("transformer_engine", transformer_engine.__version__)
except Exception as exc:
    print("transformer_engine unavailable:", exc)
PYEOF
SGLANG_PY=${SPADE_SGLANG_PYTHON:-$PY}
if "$SGLANG_PY" -c "import sglang; print('sglang', sglang.__version__)"; then HAVE_SGLANG=1; else
  echo "sglang unavailable: the real-server checks skip"; HAVE_SGLANG=0; fi
status=0
"$PY" -m pytest -q -s -m gpu tests/ -p no:cacheprovider || status=$?
"$PY" tools/gpu_mfu.py "$@" || status=$?
if [ "$HAVE_SGLANG" = 1 ] && [ -n "${MODEL_DIR:-}" ]; then
  SERVER=("--server-command" "$SGLANG_PY -m sglang.launch_server")
  "$PY" -m spade engine check --model-path "$MODEL_DIR" "${SERVER[@]}" || status=$?
  "$PY" benchmarks/rollout_throughput.py --model-path "$MODEL_DIR" "${SERVER[@]}" --concurrency 64 \
      --num-prompts 256 --input-len 1024 --output-len 1024 --sglang-bench || status=$?
  "$PY" benchmarks/weight_sync.py --model-path "$MODEL_DIR" --device cuda "${SERVER[@]}" \
      --bucket-mb 128,512,1024 || status=$?
fi
exit $status
