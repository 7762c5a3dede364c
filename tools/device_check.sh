#!/usr/bin/env bash
# The GPU check on the lent GPU machine as it is (its own python3 and torch, no network, no
# Docker; ../shared/notes/device.md): installs the wheels carried in device_wheels/
# (tools/fetch_device_wheels.py downloads them here) into a folder under /tmp, puts them on
# PYTHONPATH, then runs tools/device_check.py with the arguments given (see its docstring).
# A carried wheel whose version is already installed is left alone; one that does not import
# with the others (transformers' import-time version checks, a dependency not carried) is left
# out, and the check runs on the machine's own copy, if any; the env stage reports what was
# carried and used. With OUT set, the whole output (tracebacks included) is also written to
# $OUT/device_check.log beside $OUT/device_check.jsonl.
#
#   bash tools/device_check.sh                         # on the GPU machine, one `run` call
#   PYTHON=.venv/bin/python bash tools/device_check.sh --device cpu    # here, tiny shapes
#   ONLY=ipc,offload BUDGET_S=200 bash tools/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

check() {
  if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
  elif command -v python3 >/dev/null; then PY=python3
  else PY=python; fi
  WHEELS=${DEVICE_WHEELS:-device_wheels}
  SITE=${DEVICE_SITE:-/tmp/spade-device-site}
  # sets DEVICE_WHEEL_PATHS and DEVICE_CHECK_WHEELS (tools/device_machine.py says how it decides)
  assignments=$("$PY" tools/device_machine.py install --wheels "$WHEELS" --site "$SITE" --extra-path "$PWD") || {
    echo "device_check.sh: installing the carried wheels failed" >&2; exit 1; }
  eval "$assignments"
  export DEVICE_CHECK_WHEELS
  export PYTHONPATH="${DEVICE_WHEEL_PATHS:+$DEVICE_WHEEL_PATHS:}$PWD${PYTHONPATH:+:$PYTHONPATH}"
  echo "device_check.sh: python $PY; wheels: ${DEVICE_CHECK_WHEELS:-none}"
  "$PY" tools/device_check.py "$@"
}

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  check "$@" 2>&1 | tee "$OUT/device_check.log"
  exit "${PIPESTATUS[0]}"
fi
check "$@"
