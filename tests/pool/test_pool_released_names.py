"""``selfplay.pool.released_loader_names``: pool games load with the standard-library names the
released loader binds in every game (spade-rl/spade, spare/core/envs/synthetic_game_env.py,
``_inject_common_stdlib``), bound by the sandboxed child itself; off, a game must import what it uses."""

from __future__ import annotations

import random

import pytest

from conftest import make_harness
from spade.envs.protocol import EnvFault, ErrorKind, Stage
from spade.envs.sandbox.runtime import loader_names
from spade.envs.sandbox.runtime.limits import DEFAULT_ALLOWED_IMPORTS
from spade.selfplay.sources.fixed_pool import FixedPool, ReleasedLoaderSandbox
from spade.selfplay.sources.pool_settings import PoolSettings
from spade.selfplay.settings import SelfPlaySettings

# A made-up pool game that uses deque, math.sqrt and random.Random without importing them.
UNIMPORTED = '''
class RootGuessEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns
        self.seen = deque(maxlen=2)

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(1, 9)
        self.seen.clear()
        return f"root={math.sqrt(self.target * self.target)}: say the number", {}

    def step(self, action):
        self.seen.append(action)
        won = action == "\\\\boxed{%d}" % self.target
        return f"seen={list(self.seen)}", 1.0 if won else 0.0, won, False, {}
'''

# The released table's names, as its source lists them (the test's own reference copy).
RELEASED_NAMES = {
    "itertools", "math", "random", "re", "json", "collections", "functools", "string", "copy", "heapq",
    "operator", "statistics", "np", "numpy", "deque", "defaultdict", "Counter", "OrderedDict", "namedtuple",
    "combinations", "permutations", "product", "chain", "accumulate", "reduce", "lru_cache", "deepcopy",
    "heappush", "heappop", "Tuple", "Dict", "List", "Optional", "Union", "Any", "Set", "FrozenSet", "Callable",
    "Iterable", "Sequence", "Mapping",
}


def make_pool(tmp_path, source: str, *, switch: bool, sandbox) -> FixedPool:
    directory = tmp_path / "pool"
    directory.mkdir()
    (directory / "game_000001.py").write_text(source)
    settings = SelfPlaySettings(envs_per_set=1, k=1, env_source="fixed_pool", fixed_env_dir=str(directory),
                                max_turns=3, pool=PoolSettings(released_loader_names=switch))
    return FixedPool(settings, sandbox=sandbox, run_dir=tmp_path / "run", seed=0)


def test_a_game_without_imports_is_admitted_and_played_with_the_switch_on(sandbox, tmp_path):
    source = make_pool(tmp_path, UNIMPORTED, switch=True, sandbox=sandbox.service)
    result = sandbox.run(source.next_set(0), timeout=120)
    assert not result.rejections and [e.env_id for e in result.envs] == ["fixed-game_000001"]
    player_sandbox = source.play_sandbox()  # what the orchestrator hands the plays
    assert isinstance(player_sandbox, ReleasedLoaderSandbox)
    env = sandbox.run(player_sandbox.open(result.envs[0].source, max_turns=3))
    try:
        target = random.Random(5).randint(1, 9)
        first = sandbox.run(env.reset(seed=5))
        assert first.observation == f"root={float(target)}: say the number"
        assert sandbox.run(env.step("a")).as_tuple() == ("seen=['a']", 0.0, False, False, {})
        answer = "\\boxed{%d}" % target
        won = sandbox.run(env.step(answer))
        assert won.as_tuple() == (f"seen=['a', {answer!r}]", 1.0, True, False, {})
    finally:
        sandbox.run(env.close())


def test_the_same_game_is_rejected_at_load_with_the_switch_off(sandbox, tmp_path):
    source = make_pool(tmp_path, UNIMPORTED, switch=False, sandbox=sandbox.service)
    result = sandbox.run(source.next_set(0), timeout=120)
    assert not result.envs
    (rejection,) = result.rejections
    assert (rejection.kind, rejection.stage) == (ErrorKind.INIT_ERROR, Stage.LOAD)
    assert "NameError" in rejection.message and "deque" in rejection.message
    assert source.play_sandbox() is None  # plays use the run's sandbox, as designed environments do


@pytest.mark.parametrize("body, kind", [
    ("os.getcwd()", ErrorKind.INIT_ERROR),          # not in the released table: never bound
    ("sys.modules", ErrorKind.INIT_ERROR),          # importable, but not in the table
    ("np.zeros(2)", ErrorKind.INIT_ERROR),          # in the table, not importable in the sandbox
    ("import os", ErrorKind.IMPORT_BLOCKED),        # the import gate is unchanged
    ("__import__('subprocess')", ErrorKind.IMPORT_BLOCKED),
])
def test_the_switch_gives_no_module_off_its_list(sandbox, body, kind):
    with pytest.raises(EnvFault) as fault:
        sandbox.run(sandbox.service.open(f"{body}\n" + UNIMPORTED, released_loader_names=True))
    assert (fault.value.error.kind, fault.value.error.stage) == (kind, Stage.LOAD)
    if kind is ErrorKind.INIT_ERROR:
        assert "NameError" in fault.value.error.message
    env = sandbox.run(sandbox.service.open(UNIMPORTED, released_loader_names=True))  # still serves
    sandbox.run(env.close())


def test_a_request_cannot_name_modules(sandbox):
    service = sandbox.service
    for forged in (["os"], "os", {"os": "os"}, 1):
        with pytest.raises(EnvFault) as fault:
            sandbox.run(service._request("open", generation=service.generation, source=UNIMPORTED,
                                         max_turns=None, released_loader_names=forged))
        assert fault.value.error.kind is ErrorKind.PROTOCOL_ERROR


def test_only_modules_on_the_sandboxs_allow_list_are_bound():
    harness = make_harness(allowed_imports=tuple(m for m in DEFAULT_ALLOWED_IMPORTS if m != "statistics"))
    try:
        uses_statistics = "MEAN = statistics.mean([1, 2])\n" + UNIMPORTED
        with pytest.raises(EnvFault) as fault:
            harness.run(harness.service.open(uses_statistics, released_loader_names=True))
        assert "NameError" in fault.value.error.message and "statistics" in fault.value.error.message
        env = harness.run(harness.service.open(UNIMPORTED, released_loader_names=True))
        harness.run(env.close())
    finally:
        harness.close()


def test_the_table_is_the_released_loaders_less_numpy():
    assert {name for name, _, _ in loader_names.RELEASED_LOADER_NAMES} == RELEASED_NAMES
    offered = {name for name, _, _ in loader_names.offered(DEFAULT_ALLOWED_IMPORTS)}
    assert offered == RELEASED_NAMES - {"np", "numpy"}
    namespace = {"math": "the game's own"}
    bound = loader_names.bind(namespace, ("math", "collections"))
    assert namespace["math"] == "the game's own" and "math" not in bound  # kept, as the released loader keeps it
    import collections

    assert namespace["deque"] is collections.deque and set(bound) == {
        "collections", "deque", "defaultdict", "Counter", "OrderedDict", "namedtuple"}


def test_the_switch_must_be_a_boolean():
    from spade.config import ConfigError

    with pytest.raises(ConfigError, match="selfplay.pool.released_loader_names"):
        PoolSettings(released_loader_names="yes")
