"""``sandbox.offer_numpy`` (issue 39): the released loader's games could use numpy, pre-bound as
``np``/``numpy`` or imported. With the switch on, such a game loads, resets and steps in the real
sandbox with deterministic results; off (the default), it is rejected at load, as before.

numpy's import must not widen what hostile code can do beyond reading numpy's own files: the
numpy-specific attacks below, and a subset of test_sandbox_hostile.py run again on a sandbox with
the switch on (its tests are imported here, and this module's ``sandbox`` fixture is that sandbox).
"""

from __future__ import annotations

import errno
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import SandboxHarness, make_harness
from spade.config import ConfigError
from spade.envs.protocol import EnvFault, ErrorKind, Stage
from spade.envs.sandbox.config import SandboxConfig
from spade.envs.sandbox.launcher import SITE_INSIDE, numpy_folders, plan_launch
from spade.envs.sandbox.runtime.loader_names import offered
from test_sandbox_hostile import (  # noqa: F401  (tests and fixtures run again with numpy offered)
    READ_PROBE, REPO, WRITE_PROBE, assert_healthy, env_source, expect_fault, host_leftovers, run_ok, secret_files,
    test_huge_and_growing_allocations, test_process_creation_and_sockets, test_reading_secrets_finds_nothing,
    test_segfault_via_ctypes, test_signals_to_others, test_socket_in_module_body,
    test_tampering_with_visible_host_files_fails, test_writes_to_the_filesystem_fail, victim_file)

K = ErrorKind

# Uses np without importing it, as a released game may (the released loader binds np); a matrix
# product in reset runs through OpenBLAS, which must use one thread (clone is fatal in a child).
PREBOUND = '''
class DiagonalEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = np.random.default_rng(seed)
        self.grid = rng.integers(0, 10, size=(4, 4))
        m = rng.random((256, 256))
        self.norm = round(float(np.trace(m @ m.T)), 6)
        return f"Grid:\\n{self.grid}\\nName the sum of the diagonal.", {"norm": self.norm}

    def step(self, action):
        answer = int(np.trace(self.grid))
        right = str(answer) in action
        return ("right" if right else "wrong"), float(right), True, False, {"answer": answer}
'''
IMPORTED = "import numpy as np\n" + PREBOUND
SEED = 5


def expected_game(seed: int) -> tuple[str, dict, int]:
    """What the game must show, computed here with the trainer's own numpy."""
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 10, size=(4, 4))
    m = rng.random((256, 256))
    return (f"Grid:\n{grid}\nName the sum of the diagonal.", {"norm": round(float(np.trace(m @ m.T)), 6)},
            int(np.trace(grid)))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxHarness]:
    """The sandbox with numpy offered (this module's tests, and the hostile tests imported above)."""
    harness = make_harness(offer_numpy=True)
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def plain() -> Iterator[SandboxHarness]:
    """The default sandbox: numpy not offered."""
    harness = make_harness()
    yield harness
    harness.close()


def play(harness: SandboxHarness, source: str, names: bool, action: str):
    env = harness.run(harness.service.open(source, released_loader_names=names))
    try:
        first = harness.run(env.reset(seed=SEED))
        again = harness.run(env.reset(seed=SEED))
        result = harness.run(env.step(action))
    finally:
        harness.run(env.close())
    assert (again.observation, again.info) == (first.observation, first.info)
    return first, result


@pytest.mark.parametrize("source,names", [(PREBOUND, True), (IMPORTED, False), (IMPORTED, True)],
                         ids=["np_prebound", "import_numpy", "import_numpy_with_names"])
def test_numpy_game_plays_with_the_switch_on(sandbox, source, names):
    observation, info, answer = expected_game(SEED)
    for _ in range(2):  # two fresh environments: the same results
        first, result = play(sandbox, source, names, f"\\boxed{{{answer}}}")
        assert (first.observation, first.info) == (observation, info)
        assert result.as_tuple() == ("right", 1.0, True, False, {"answer": answer})
    _, wrong = play(sandbox, source, names, "\\boxed{-1}")
    assert wrong.as_tuple() == ("wrong", 0.0, True, False, {"answer": answer})


def test_switch_off_rejects_numpy_games_at_load(plain):
    with pytest.raises(EnvFault) as imported:
        plain.run(plain.service.open(IMPORTED))
    assert (imported.value.error.kind, imported.value.error.stage) == (K.IMPORT_BLOCKED, Stage.LOAD)
    assert "import of 'numpy' is not allowed" in imported.value.error.message
    assert "sandbox.offer_numpy" in imported.value.error.message
    # the names switch binds np only where numpy is offered: the game fails where it first uses np
    env = plain.run(plain.service.open(PREBOUND, released_loader_names=True))
    with pytest.raises(EnvFault) as prebound:
        plain.run(env.reset(seed=SEED))
    assert (prebound.value.error.kind, prebound.value.error.stage) == (K.RESET_ERROR, Stage.RESET)
    assert "NameError: name 'np' is not defined" in prebound.value.error.message


def test_numpy_is_bound_and_allowed_only_with_the_switch():
    on, off = SandboxConfig(offer_numpy=True), SandboxConfig()
    assert "numpy" in on.imports_offered and "numpy" not in off.imports_offered
    assert on.imports_offered[:-1] == off.imports_offered == off.allowed_imports
    assert {"np", "numpy"} <= {name for name, _, _ in offered(on.imports_offered)}
    assert not {"np", "numpy"} & {name for name, _, _ in offered(off.imports_offered)}


def test_config_key_is_validated():
    assert SandboxConfig().offer_numpy is False
    assert SandboxConfig.from_mapping({"offer_numpy": True}).offer_numpy is True
    with pytest.raises(ConfigError, match=r"sandbox\.offer_numpy: expected true or false"):
        SandboxConfig.from_mapping({"offer_numpy": "yes"})
    with pytest.raises(ConfigError, match=r"sandbox\.offer_numpy: must be true or false, got 1"):
        SandboxConfig(offer_numpy=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"sandbox\.memory_limit_mb: must be at least 256 with sandbox\.offer_numpy"):
        SandboxConfig.from_mapping({"offer_numpy": True, "memory_limit_mb": 128})


# -- what numpy's own routes reach --------------------------------------------------------------

NUMPY_PROBE = WRITE_PROBE + READ_PROBE + '''
import numpy as np

def np_writes(target):
    return {
        "np.save": attempt(lambda: np.save(target, np.arange(3))),
        "memmap": attempt(lambda: np.memmap(target, dtype="uint8", mode="w+", shape=(16,))),
        "savetxt": attempt(lambda: np.savetxt(target, np.arange(3))),
    }

def np_read(path):
    try:
        return "READ:" + "\\n".join(np.loadtxt(path, dtype=str, delimiter="\\x00", comments=None, ndmin=1))
    except OSError as exc:
        return f"{type(exc).__name__}:{exc.errno}"
    except Exception as exc:  # opened, then failed to parse: still a read
        return f"READ-FAILED-PARSE:{type(exc).__name__}"
'''
WRITE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT}


def test_numpy_cannot_write_files(sandbox):
    """np.save, savetxt and memmap fail in /tmp, the repository, numpy's own mount and
    numpy's folder on the host; nothing appears on the host."""
    package = Path(numpy_folders()[0])
    name = f"spade-numpy-{os.getpid()}"
    targets = {f"/tmp/{name}": Path("/tmp") / name, str(REPO / name): REPO / name,
               f"{SITE_INSIDE}/numpy/{name}": package / name, str(package / name): package / name}
    code = f"return json.dumps({{t: np_writes(t) for t in {list(targets)!r}}}), 0.0, False, False, {{}}"
    try:
        _, result = run_ok(sandbox, env_source(module=NUMPY_PROBE, step=code))
        for target, outcomes in json.loads(result.observation).items():
            for how, (error, number) in outcomes.items():
                assert error != "succeeded" and number in WRITE_ERRNOS, (target, how, error, number)
        for host in targets.values():
            assert not host_leftovers(host) and not host.with_suffix(".npy").exists()
    finally:
        for host in targets.values():
            for path in (*host_leftovers(host), host.with_suffix(".npy")):
                path.unlink(missing_ok=True)


def test_numpy_reads_only_its_own_files(sandbox):
    """numpy's files are readable; the rest of the site-packages, the repository and /etc are not."""
    package = Path(numpy_folders()[0])
    site = package.parent
    others = sorted(p for p in site.glob("*/__init__.py") if p.parent.name != "numpy")[:2]
    assert others, "test setup: another package beside numpy"
    outside = [str(REPO / "README.md"), "/etc/shadow", f"{SITE_INSIDE}/{others[0].parent.name}/__init__.py",
               *map(str, others), *map(str, site.glob("numpy-*.dist-info/METADATA"))]
    own = f"{SITE_INSIDE}/numpy/__init__.py"
    code = f"return json.dumps({{p: np_read(p) for p in {[own, *outside]!r}}}), 0.0, False, False, {{}}"
    _, result = run_ok(sandbox, env_source(module=NUMPY_PROBE, step=code))
    found = json.loads(result.observation)
    assert found[own].startswith("READ:") and "numpy" in found[own]
    for path in outside:
        assert not found[path].startswith("READ:"), f"{path} was readable inside the sandbox"


NUMPY_VIOLATIONS = {
    "socket_through_ctypeslib": "lib = np.ctypeslib.load_library('libc.so.6', '/lib/x86_64-linux-gnu')\n"
                                "lib.socket(2, 1, 0)",
    "fork_through_ctypeslib": "lib = np.ctypeslib.load_library('libc.so.6', '/lib/x86_64-linux-gnu')\nlib.fork()",
}


@pytest.mark.parametrize("name", NUMPY_VIOLATIONS)
def test_numpy_routes_to_system_calls_are_violations(sandbox, name):
    if not Path("/lib/x86_64-linux-gnu/libc.so.6").exists():
        pytest.skip("no x86_64 glibc at /lib/x86_64-linux-gnu")
    code = "import numpy as np\n" + NUMPY_VIOLATIONS[name]
    expect_fault(sandbox, env_source(step=code), K.SANDBOX_VIOLATION, Stage.STEP)


@pytest.mark.parametrize("code", ["x = np.ones((20000, 20000))", "x = np.zeros(10**10, dtype=np.int8)\nx[:] = 1",
                                  "xs = []\nwhile True:\n    xs.append(np.ones(10**6))"])
def test_numpy_allocations_hit_the_memory_limit(sandbox, code):
    expect_fault(sandbox, env_source(step="import numpy as np\n" + textwrap.dedent(code)), K.MEMORY_LIMIT, Stage.STEP)


def test_sandbox_starts_healthy_with_numpy(sandbox):
    assert_healthy(sandbox)
    assert sandbox.config.offer_numpy



def test_launch_mounts_only_numpy_read_only():
    """Off: the launch is as before (no site folder). On: numpy and numpy.libs, read-only, readable."""
    off, on = plan_launch(SandboxConfig(), 3), plan_launch(SandboxConfig(offer_numpy=True), 3)
    assert off.numpy_site is None and not any(SITE_INSIDE in arg for arg in off.argv)
    assert on.numpy_site == SITE_INSIDE and on.readable_paths == (*off.readable_paths, SITE_INSIDE)
    expected = [["--ro-bind", folder, f"{SITE_INSIDE}/{Path(folder).name}"] for folder in numpy_folders()]
    python = off.argv.index("-I") - 1  # the mounts come last, before the zygote's command line
    assert on.argv == [*off.argv[:python], *(arg for mount in expected for arg in mount), *off.argv[python:]]
