#!/usr/bin/env bash
# Every GPU check of spade in one run, for a lent GPU machine: the GPU-marked tests (TE spec,
# bf16, packed sequences, the engine on CUDA) and the training-step MFU of a Qwen3-4B-shaped
# model with random weights. Prints its figures; exits non-zero if a test fails.
#   bash tools/gpu_check.sh            (after `make setup`, or with the packages installed)
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
status=0
"$PY" -m pytest -q -m gpu tests/ -p no:cacheprovider || status=$?
"$PY" tools/gpu_mfu.py "$@" || status=$?
exit $status
