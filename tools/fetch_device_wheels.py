"""Download the wheels the GPU machine lacks into device_wheels/ (ignored by git) and check that
they fit, with the working tree, in what one `run` call may carry (64 MiB).

    .venv/bin/python tools/fetch_device_wheels.py                 # everything CARRIED names
    .venv/bin/python tools/fetch_device_wheels.py --no-transformers
    python3 tools/fetch_device_wheels.py --python-version 3.11 --dest .venv-device/wheels  # the CPU mirror

The versions are the pins of requirements.txt and requirements/constrained.txt; the wheels are the
machine's: CPython 3.12, manylinux x86-64, no dependencies. CARRIED is every distribution spade's
GPU path and its GPU tests import that the machine lacks (tools/device_machine.py has its list),
with what those import in turn; the machine's own torch, numpy, packaging, attrs, tokenizers,
huggingface-hub and safetensors serve the rest. What travels is every tracked and
untracked-but-not-ignored file plus the carried folder; the script prints each part and exits 1
when the sum is over the limit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT_MIB = 64.0
CARRIED = (
    "megatron-core",  # the trainer
    # the hf engine's constrained decoding (xgrammar, which imports apache-tvm-ffi and pydantic)
    "xgrammar", "apache-tvm-ffi", "pydantic", "pydantic_core", "annotated-types", "typing-inspection",
    # the GPU serve test validates generated JSON with jsonschema (attrs is on the machine)
    "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
)
PIN_FILES = ("requirements.txt", "requirements/constrained.txt")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")


def pinned(name: str) -> str:
    """``name==version`` as the pin files pin it."""
    for pins in PIN_FILES:
        for line in (REPO / pins).read_text().splitlines():
            line = line.split("#", 1)[0].strip()  # pip allows a comment after a pin
            if line.lower().startswith(name.lower() + "=="):
                return line
    raise SystemExit(f"fetch_device_wheels: {name} is not pinned in {' or '.join(PIN_FILES)}")


def travelling_bytes() -> tuple[int, int]:
    """(bytes, files) of what a `run` call sends besides carried folders: tracked files and
    untracked files git does not ignore."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout.decode().split("\0")
    sizes = [(REPO / name).stat().st_size for name in listing if name and (REPO / name).is_file()]
    return sum(sizes), len(sizes)


def download(spec: str, dest: Path, python_version: str) -> None:
    name = spec.split("==")[0].replace("-", "_").lower()
    for old in dest.glob("*.whl"):  # one version of each: two stop the whole install there
        if old.name.lower().startswith(name + "-") and old.name.split("-")[1] != spec.split("==")[1]:
            old.unlink()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp", "-d", str(dest), "--quiet", spec]
    for platform in PLATFORMS:
        command[-1:-1] = ["--platform", platform]
    subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=REPO / "device_wheels")
    parser.add_argument("--no-transformers", action="store_true", help="leave spade's transformers pin behind "
                        "(the machine's own transformers then serves)")
    parser.add_argument("--python-version", default="3.12", help="the wheels' Python (3.12: the GPU machine's)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    specs = [pinned(name) for name in CARRIED] + ([] if args.no_transformers else [pinned("transformers")])
    wanted = {spec.split("==")[0].replace("-", "_").lower() for spec in specs}
    for stale in args.dest.glob("*.whl"):
        if stale.name.split("-")[0].lower() not in wanted:
            stale.unlink()
    for spec in specs:
        download(spec, args.dest, args.python_version)
    tree, files = travelling_bytes()
    wheels = sorted(args.dest.glob("*.whl"))
    total = tree + sum(w.stat().st_size for w in wheels)
    print(f"{'working tree (' + str(files) + ' files)':<72} {tree / 2**20:8.2f} MiB")
    for wheel in wheels:
        print(f"{wheel.name:<72} {wheel.stat().st_size / 2**20:8.2f} MiB")
    print(f"{'total that travels with carry=[' + repr(args.dest.name) + ']':<72} {total / 2**20:8.2f} MiB "
          f"(limit {args.limit_mib:.0f} MiB)")
    if total > args.limit_mib * 2**20:
        print(f"fetch_device_wheels: {total / 2**20:.1f} MiB is over the {args.limit_mib:.0f} MiB a call may carry; "
              "try --no-transformers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
