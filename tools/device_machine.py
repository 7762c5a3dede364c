"""What the lent GPU machine has, and how carried wheels join it (stdlib only: it runs with the
machine's own python3 before anything else is installed).

* ``MACHINE_PACKAGES``: the distributions its image holds (the device tool's package list, read on
  2026-11-17). ``python tools/device_machine.py audit`` refuses a venv that holds anything else,
  which keeps the CPU stand-in (``make device-mirror``) honest.
* ``install_wheels``: what ``tools/device_check.sh`` does with ``device_wheels/*.whl``. A wheel
  whose version the machine already has is left alone; every other one goes into a folder of its
  own; then all of them are imported together (each by the top-level names its RECORD lists, not
  by its distribution name: ``megatron_core`` is ``megatron``, ``pydantic_core`` needs nothing
  else but ``pydantic`` needs it). A wheel that does not import is left out and the rest tried
  again without it, since a wheel may need another carried one. The result names the folders for
  ``PYTHONPATH`` and one note a wheel.

    python tools/device_machine.py install --wheels device_wheels --site /tmp/site   # shell lines
    python tools/device_machine.py audit                                             # this venv
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata as metadata
import io
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

MACHINE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx
optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())
# what a venv made by `python -m venv` holds besides what one installs
VENV_OWN = frozenset({"pip", "setuptools", "wheel"})


def normalized(name: str) -> str:
    """A distribution name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def not_on_machine(installed: list[str]) -> list[str]:
    """The distributions of ``installed`` that the GPU machine does not have."""
    return sorted({normalized(n) for n in installed} - MACHINE_PACKAGES - VENV_OWN)


@dataclass(frozen=True)
class Wheel:
    path: Path
    dist: str  # as in the file name: underscores for dashes
    version: str

    @classmethod
    def of(cls, path: Path) -> "Wheel":
        dist, version = path.name.split("-")[:2]
        return cls(path, dist, version)

    def import_names(self) -> list[str]:
        """The top-level modules and packages the wheel installs, from its RECORD."""
        with zipfile.ZipFile(self.path) as archive:
            record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
            rows = csv.reader(io.StringIO(archive.read(record).decode()))
            names: set[str] = set()
            for row in rows:
                first, _, rest = row[0].partition("/")
                if rest:  # a folder: a package unless it is metadata, data or bundled libraries
                    if not first.endswith((".dist-info", ".data", ".libs")) and first != "__pycache__" \
                            and first.isidentifier():
                        names.add(first)
                elif first.endswith(".py") or re.search(r"\.(cpython|abi3)[^/]*\.so$", first):
                    module = first.split(".")[0]
                    if module.isidentifier():
                        names.add(module)
        return sorted(names)


@dataclass
class Installed:
    """What ``install_wheels`` did: folders to put on ``PYTHONPATH`` and a note per wheel."""

    paths: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)  # dist -> why

    def shell(self) -> str:
        return (f"DEVICE_WHEEL_PATHS={shlex.quote(':'.join(self.paths))}\n"
                f"DEVICE_CHECK_WHEELS={shlex.quote(' '.join(self.notes))}\n")


def installed_version(python: str, dist: str) -> Optional[str]:
    probe = subprocess.run([python, "-c", "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))", dist],
                           capture_output=True, text=True, env=_without_pythonpath())
    return probe.stdout.strip() if probe.returncode == 0 else None


def _without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


_IMPORT_ALL = """
import importlib, json, sys, traceback
failed = {}
for dist, modules in json.loads(sys.argv[1]).items():
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException as exc:
            failed[dist] = f"import {module}: {type(exc).__name__}: {exc}".splitlines()[0][:300]
            break
print(json.dumps(failed))
"""


def import_failures(python: str, modules: dict[str, list[str]], paths: list[str], extra_path: str) -> dict[str, str]:
    """Import every wheel's modules in one fresh interpreter with ``paths`` first on its path:
    ``{dist: why}`` for each wheel that failed."""
    env = dict(os.environ, PYTHONPATH=":".join([*paths, extra_path] if extra_path else paths))
    probe = subprocess.run([python, "-c", _IMPORT_ALL, json.dumps(modules)], capture_output=True, text=True, env=env,
                           timeout=600)
    if probe.returncode != 0:
        return {dist: f"the import check itself failed: {probe.stderr.strip()[-300:]}" for dist in modules}
    return json.loads(probe.stdout.strip().splitlines()[-1])


def install_wheels(wheels_dir: Path, site: Path, python: str, extra_path: str = "") -> Installed:
    """Install each carried wheel under ``site`` and keep those that import (see the module
    docstring). ``extra_path`` (the checkout) is on the path of the import check."""
    result = Installed()
    wheels = [Wheel.of(p) for p in sorted(wheels_dir.glob("*.whl"))] if wheels_dir.is_dir() else []
    carried: dict[str, Wheel] = {}
    for wheel in wheels:
        have = installed_version(python, wheel.dist)
        if have == wheel.version:
            result.notes.append(f"{wheel.dist}=={wheel.version}(installed already)")
            continue
        target = site / wheel.dist
        install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                  "--no-cache-dir", "--upgrade", "--target", str(target), str(wheel.path)],
                                 capture_output=True, text=True, env=_without_pythonpath())
        if install.returncode != 0:
            why = (install.stderr.strip() or install.stdout.strip()).splitlines()[-1:] or ["pip failed"]
            result.left_out[wheel.dist] = f"install failed: {why[0][:300]}"
            result.notes.append(f"{wheel.dist}=={wheel.version}(install-failed)")
            continue
        carried[wheel.dist] = wheel
    while carried:
        paths = [str(site / dist) for dist in carried]
        failed = import_failures(python, {d: w.import_names() for d, w in carried.items()}, paths, extra_path)
        if not failed:
            break
        for dist, why in failed.items():
            wheel = carried.pop(dist)
            result.left_out[dist] = why
            have = installed_version(python, dist)
            result.notes.append(f"{dist}=={wheel.version}(does-not-import:using-{have or 'none'})")
    for dist, wheel in carried.items():
        result.paths.append(str(site / dist))
        result.notes.append(f"{dist}=={wheel.version}(carried)")
    return result


def audit(python: str) -> list[str]:
    listing = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                             check=True, env=_without_pythonpath()).stdout
    return not_on_machine([entry["name"] for entry in json.loads(listing)])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="install carried wheels; print shell assignments")
    install.add_argument("--wheels", type=Path, required=True)
    install.add_argument("--site", type=Path, required=True)
    install.add_argument("--extra-path", default="", help="also on the import check's path (the checkout)")
    check = sub.add_parser("audit", help="exit 1 if this Python's environment holds what the machine lacks")
    check.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    if args.command == "install":
        result = install_wheels(args.wheels, args.site, sys.executable, args.extra_path)
        for dist, why in result.left_out.items():
            print(f"device_check.sh: {dist} left out: {why}", file=sys.stderr)
        sys.stdout.write(result.shell())
        return 0
    extra = audit(args.python)
    if extra:
        print("device_machine: this environment holds what the GPU machine does not have: " + ", ".join(extra),
              file=sys.stderr)
        return 1
    print("device_machine: every installed distribution is one the GPU machine has")
    return 0


if __name__ == "__main__":
    sys.exit(main())
