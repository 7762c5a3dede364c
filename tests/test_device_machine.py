"""tools/device_machine.py: how carried wheels join the GPU machine's Python, and the audit that
keeps the CPU mirror of that machine (``make device-mirror``) to the packages it has.

The wheels here are real wheel files (built in the test: a dist-info with METADATA, WHEEL and
RECORD), installed by real pip into folders and imported by a fresh interpreter, as on the GPU
machine.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import device_machine  # noqa: E402  (tools/ is not a package)


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel ``dist-version-py3-none-any.whl`` holding ``files`` (path -> source)."""
    info = f"{dist}-{version}.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    contents[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = "\n".join(record) + "\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in contents.items():
            archive.writestr(name, text)
    return path


def test_import_names_come_from_the_wheels_record(tmp_path):
    wheel = make_wheel(tmp_path, "fancy_dist", "1.0", {
        "fancy/__init__.py": "", "fancy/sub/x.py": "", "solo.py": "", "fancy_dist.libs/libz.so": "",
        "fancy_dist-1.0.data/scripts/tool": ""})
    assert device_machine.Wheel.of(wheel).import_names() == ["fancy", "solo"]


def test_carried_wheels_import_by_their_module_names_and_with_each_other(tmp_path):
    """A distribution whose import name differs from its name is kept; one that needs another
    carried wheel is kept; one that does not import is left out, and so is one that needs it."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "core_dist", "1.0", {"corelib/__init__.py": "VALUE = 41\n"})
    make_wheel(wheels, "needs_core", "2.0", {"needs_core.py": "import corelib\nVALUE = corelib.VALUE + 1\n"})
    make_wheel(wheels, "broken", "0.1", {"broken/__init__.py": "raise ImportError('needs a newer host')\n"})
    make_wheel(wheels, "on_broken", "0.2", {"on_broken/__init__.py": "import broken\n"})
    result = device_machine.install_wheels(wheels, tmp_path / "site", sys.executable)

    assert sorted(Path(p).name for p in result.paths) == ["core_dist", "needs_core"]
    assert set(result.left_out) == {"broken", "on_broken"}
    assert "needs a newer host" in result.left_out["broken"]
    assert "core_dist==1.0(carried)" in result.notes and "broken==0.1(does-not-import:using-none)" in result.notes
    probe = subprocess.run([sys.executable, "-c", "import needs_core; print(needs_core.VALUE)"], capture_output=True,
                           text=True, env={"PYTHONPATH": ":".join(result.paths)})
    assert probe.stdout.strip() == "42", probe.stderr


def test_a_wheel_of_a_version_already_installed_is_left_alone(tmp_path):
    import importlib.metadata as metadata

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    have = metadata.version("pytest")
    make_wheel(wheels, "pytest", have, {"pytest_shadow.py": ""})
    result = device_machine.install_wheels(wheels, tmp_path / "site", sys.executable)
    assert result.notes == [f"pytest=={have}(installed already)"] and result.paths == []
    assert not (tmp_path / "site" / "pytest").exists()


def test_the_shell_lines_set_the_path_and_the_notes(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "core_dist", "1.0", {"corelib/__init__.py": ""})
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "device_machine.py"), "install", "--wheels", str(wheels),
                          "--site", str(tmp_path / "site")], capture_output=True, text=True, check=True).stdout
    shown = subprocess.run(["bash", "-c", out + 'echo "$DEVICE_WHEEL_PATHS|$DEVICE_CHECK_WHEELS"'], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert shown == f"{tmp_path / 'site' / 'core_dist'}|core_dist==1.0(carried)"


def test_the_audit_names_what_the_machine_lacks():
    assert device_machine.not_on_machine(["torch", "PyYAML", "jsonschema", "pip", "typing_extensions", "xgrammar"]) \
        == ["jsonschema", "xgrammar"]


def test_the_mirror_requirements_are_packages_the_machine_has():
    names = [line.split("==")[0] for line in (ROOT / "requirements" / "device_machine.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert len(names) > 20 and device_machine.not_on_machine(names) == []
    pins = dict(line.split("==") for line in (ROOT / "requirements" / "device_machine.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    # the versions the machine's pip list gives (../shared/notes/device.md)
    assert (pins["transformers"], pins["tokenizers"], pins["huggingface_hub"], pins["safetensors"]) == \
        ("5.17.0", "0.23.2", "1.33.0", "0.8.0")


def test_the_mirror_holds_nothing_the_machine_lacks():
    assert (ROOT / ".venv-device" / ".installed").exists(), "run `make device-mirror`"
    assert device_machine.audit(str(ROOT / ".venv-device" / "bin" / "python")) == []
