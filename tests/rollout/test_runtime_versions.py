"""spade.rollout.sglang.runtime_versions: the start-up check that trainer and SGLang share one torch and NCCL.

The comparison rule on made-up version records (matching, torch / NCCL / CUDA differing, an
unreadable side, sglang missing), then the real subprocess probe against this interpreter. The
CPU venv has no sglang, which must come back as a clear finding, not a crash; the GPU image has
one, which must be read. Each real-interpreter test asserts what is really installed here, and
the other case runs too with a stand-in ``sglang`` package put on the probe's PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace
from importlib import metadata

import pytest
import torch

from spade.rollout.sglang.runtime_versions import (
    RuntimeVersionMismatch,
    RuntimeVersions,
    check_sglang_runtime,
    compare_versions,
    current_versions,
    main,
    probe_interpreter,
)

pytestmark = pytest.mark.timeout(300)

FAKE_VERSION = "0.5.23+stand-in"


def installed_sglang() -> str | None:
    """The sglang this venv really has (its metadata), None without one."""
    if importlib.util.find_spec("sglang") is None:
        return None
    return metadata.version("sglang")


@pytest.fixture(scope="module")
def fake_sglang(tmp_path_factory) -> dict[str, str]:
    """An environment whose PYTHONPATH holds an importable ``sglang`` with its metadata: the probe
    of this interpreter then sees sglang present, as in the GPU image."""
    root = tmp_path_factory.mktemp("fake-sglang")
    (root / "sglang").mkdir()
    (root / "sglang" / "__init__.py").write_text(f"__version__ = {FAKE_VERSION!r}\n")
    info = root / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {FAKE_VERSION}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}

TRAINER = RuntimeVersions(python="/usr/bin/python3", python_version="3.12.3", torch="2.14.1+cu130", cuda="13.0",
                          nccl="2.30.7", sglang="0.5.23")
SAME_IMAGE = replace(TRAINER)  # the image: one interpreter on both sides


def test_one_environment_passes_and_reports_both_sides():
    check = compare_versions(TRAINER, SAME_IMAGE)
    assert check.ok and check.mismatches == ()
    report = check.report()
    assert report.count("torch 2.14.1+cu130") == 2 and report.count("NCCL 2.30.7") == 2
    assert "sglang 0.5.23" in report


def test_a_second_torch_is_named_with_both_sides():
    sglang_env = replace(TRAINER, python="/opt/sglang/bin/python", torch="2.10.0a0+nv26.01", nccl="2.27.7")
    check = compare_versions(TRAINER, sglang_env)
    assert not check.ok
    [torch_line] = [m for m in check.mismatches if m.startswith("torch:")]
    assert "2.14.1+cu130" in torch_line and "2.10.0a0+nv26.01" in torch_line
    assert "/usr/bin/python3" in torch_line and "/opt/sglang/bin/python" in torch_line
    [nccl_line] = [m for m in check.mismatches if m.startswith("nccl:")]
    assert "2.30.7" in nccl_line and "2.27.7" in nccl_line
    message = str(RuntimeVersionMismatch(check))
    assert "2.14.1+cu130" in message and "2.10.0a0+nv26.01" in message and "one NCCL" in message


def test_same_torch_string_with_another_nccl_is_refused():
    check = compare_versions(TRAINER, replace(TRAINER, nccl="2.32.3"))
    assert [m.split(":")[0] for m in check.mismatches] == ["nccl"]


def test_cuda_build_and_cpu_build_differ():
    check = compare_versions(TRAINER, replace(TRAINER, torch="2.14.1+cpu", cuda=None, nccl=None))
    assert {m.split(":")[0] for m in check.mismatches} == {"torch", "cuda", "nccl"}


def test_a_cuda_torch_without_an_nccl_version_is_not_taken_as_matching():
    no_nccl = replace(TRAINER, nccl=None, nccl_error="AttributeError: no _nccl_version")
    check = compare_versions(no_nccl, no_nccl)
    assert len(check.mismatches) == 2 and all("reports no NCCL version" in m for m in check.mismatches)


def test_an_unreadable_side_fails_the_check():
    broken = RuntimeVersions(python="/opt/none/python", error="no such interpreter")
    check = compare_versions(TRAINER, broken)
    assert check.mismatches == ("SGLang side unreadable: no such interpreter",)
    assert "/opt/none/python: no such interpreter" in check.report()


def test_missing_sglang_fails_only_when_required():
    without = replace(TRAINER, sglang=None, sglang_error="ModuleNotFoundError: No module named 'sglang'")
    required = compare_versions(TRAINER, without)
    assert required.mismatches and required.mismatches[0].startswith("sglang: not importable")
    assert "Install sglang" in str(RuntimeVersionMismatch(required))
    assert "one NCCL version" not in str(RuntimeVersionMismatch(required))  # torch/NCCL are not the problem
    assert compare_versions(TRAINER, without, require_sglang=False).ok


# ------------------------------------------------------------------------------- real interpreters


def test_probe_of_this_venv_reports_its_torch_and_its_sglang():
    seen = probe_interpreter(sys.executable)
    assert seen.usable, seen.error
    assert seen.python == sys.executable and seen.torch == torch.__version__ and seen.cuda == torch.version.cuda
    if torch.version.cuda is None:
        assert seen.nccl is None  # a CPU torch has no NCCL
    here = current_versions()
    assert (here.torch, here.cuda, here.nccl) == (seen.torch, seen.cuda, seen.nccl)
    real = installed_sglang()
    if real is None:  # the CPU venv
        assert seen.sglang is None and "No module named 'sglang'" in seen.sglang_error
        assert here.sglang is None and here.sglang_error == "not installed"  # read from metadata, not imported
        assert "sglang unavailable" in seen.describe()
    else:  # the GPU image
        assert seen.sglang == here.sglang == real and seen.sglang_error is None
        assert "sglang unavailable" not in seen.describe()


def test_probe_sees_an_sglang_on_the_path(fake_sglang):
    """The present case wherever this runs: the probe imports the stand-in and reports its version."""
    seen = probe_interpreter(sys.executable, env=fake_sglang)
    assert seen.usable, seen.error
    assert seen.sglang == FAKE_VERSION and seen.sglang_error is None and seen.torch == torch.__version__
    assert "sglang unavailable" not in seen.describe()


def test_probe_of_an_interpreter_whose_torch_fails_to_import(tmp_path):
    (tmp_path / "torch.py").write_text("raise ImportError('libtorch_cuda.so: cannot open shared object file')\n")
    seen = probe_interpreter(sys.executable, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert not seen.usable and "torch cannot be imported" in seen.error and "libtorch_cuda.so" in seen.error
    assert "SGLang side unreadable" in compare_versions(current_versions(), seen).mismatches[0]


def test_probe_of_a_missing_or_crashing_interpreter(tmp_path):
    assert probe_interpreter(str(tmp_path / "no-python")).error == "no such interpreter"
    crashing = tmp_path / "python"
    crashing.write_text("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    crashing.chmod(0o755)
    seen = probe_interpreter(str(crashing))
    assert seen.error.startswith("the version probe exited with status 1") and "init_fs_encoding" in seen.error


def test_startup_check_against_this_venv(capsys):
    lines: list[str] = []
    check = check_sglang_runtime(sys.executable, require_sglang=False, emit=lines.append)
    assert check.ok and len(lines) == 1 and lines[0].count(f"torch {torch.__version__}") == 2
    assert main(["--python", sys.executable, "--allow-missing-sglang", "--json"]) == 0
    if installed_sglang() is None:  # the CPU venv: required, the missing sglang fails the check
        with pytest.raises(RuntimeVersionMismatch) as caught:
            check_sglang_runtime(sys.executable)
        assert "sglang: not importable" in str(caught.value) and torch.__version__ in str(caught.value)
        assert main(["--python", sys.executable]) == 1
        out = capsys.readouterr().out
        assert "runtime check failed" in out and "run one torch and one NCCL" in out and '"mismatches": []' in out
    else:  # the GPU image: one interpreter, one torch, sglang importable
        assert check_sglang_runtime(sys.executable, emit=None).ok
        assert main(["--python", sys.executable]) == 0


def test_startup_check_passes_where_sglang_is_importable(fake_sglang):
    """Required and present (the stand-in on the probe's path): the same interpreter passes."""
    lines: list[str] = []
    check = check_sglang_runtime(sys.executable, env=fake_sglang, emit=lines.append)
    assert check.ok and check.sglang.sglang == FAKE_VERSION and len(lines) == 1 and FAKE_VERSION in lines[0]
