#!/usr/bin/env bash
# The GPU check on the lent GPU machine as it is (its own python3 and torch, no network, no
# Docker; ../shared/notes/device.md): installs the wheels carried in device_wheels/
# (tools/fetch_device_wheels.py downloads them here) into a folder under /tmp, puts them on
# PYTHONPATH, then runs tools/device_check.py with the arguments given (see its docstring).
# A carried wheel whose version is already installed is left alone; one that does not import
# after installing (transformers' import-time version checks) is left out, and the check runs on
# the machine's own copy; the env stage reports what was carried and used.
#
#   bash tools/device_check.sh                         # on the GPU machine, one `run` call
#   PYTHON=.venv/bin/python bash tools/device_check.sh --device cpu    # here, tiny shapes
#   ONLY=ipc,offload BUDGET_S=200 bash tools/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif command -v python3 >/dev/null; then PY=python3
else PY=python; fi
WHEELS=${DEVICE_WHEELS:-device_wheels}
SITE=${DEVICE_SITE:-/tmp/spade-device-site}
paths=""
notes=""
for whl in "$WHEELS"/*.whl; do
  [ -e "$whl" ] || break
  base=$(basename "$whl")
  dist=${base%%-*}
  version=$(echo "$base" | cut -d- -f2)
  case "$dist" in
    megatron_core) module=megatron.core ;;
    *) module=$dist ;;
  esac
  have=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$dist" 2>/dev/null)
  if [ "$have" = "$version" ]; then
    notes="$notes $dist==$version(installed already)"
    continue
  fi
  target="$SITE/$dist"
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$whl"; then
    echo "device_check.sh: could not install $base: left out" >&2
    notes="$notes $dist==$version(install-failed)"
    continue
  fi
  if PYTHONPATH="$target:$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import $module" >/dev/null 2>"$SITE/$dist.err"; then
    paths="$paths$target:"
    notes="$notes $dist==$version(carried)"
  else
    echo "device_check.sh: $base installed but does not import ($(tail -1 "$SITE/$dist.err")): left out" >&2
    notes="$notes $dist==$version(does-not-import:using-${have:-none})"
  fi
done
export DEVICE_CHECK_WHEELS="${notes# }"
export PYTHONPATH="$paths$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "device_check.sh: python $PY; wheels:${notes:- none}"
exec "$PY" tools/device_check.py "$@"
