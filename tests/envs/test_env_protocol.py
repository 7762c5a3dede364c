"""The real sandbox satisfies the protocols everything above it is written against: the same
methods with the same signatures (async where the protocol is, the protocol's parameters with
their kinds and defaults, anything more optional), and, driven through the protocol alone, the values the environment's code gives."""

import inspect
import textwrap

import pytest

from spade.envs.protocol import EnvInstance, ResetResult, Sandbox, StepResult
from spade.envs.sandbox.client import SandboxedEnv, SandboxService
from spade.envs.sandbox.config import SandboxConfig

COUNTER = textwrap.dedent('''
    class CounterEnv:
        def __init__(self, max_turns=3):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.total = seed or 0
            return f"start at {self.total}", {"seed": seed}
        def step(self, action):
            self.total += len(action)
            return f"total {self.total}", float(self.total), self.total >= 5, False, {"added": len(action)}
''')


def _parameters(function) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("protocol, implementation", [(Sandbox, SandboxService), (EnvInstance, SandboxedEnv)],
                         ids=["Sandbox", "EnvInstance"])
def test_the_implementations_have_the_protocols_signatures(protocol, implementation):
    methods = [name for name, member in vars(protocol).items() if inspect.isfunction(member) and name[0] != "_"]
    assert methods
    for name in methods:
        declared, implemented = getattr(protocol, name), getattr(implementation, name)
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared), name
        declared_parameters, implemented_parameters = _parameters(declared), _parameters(implemented)
        assert [p for p in implemented_parameters if p[0] in {d[0] for d in declared_parameters}] == \
            declared_parameters, name
        extra = [p for p in implemented_parameters if p not in declared_parameters]
        assert all(default is not inspect.Parameter.empty for _, _, default in extra), (name, extra)


def test_the_sandbox_service_and_its_environments_implement_the_protocols():
    service = SandboxService(SandboxConfig())  # not started: only its interface is checked
    assert isinstance(service, Sandbox)
    env = SandboxedEnv(service, generation=0, env_id=1, class_name="GuessEnv", max_turns=5)
    assert isinstance(env, EnvInstance)


def test_an_environment_driven_through_the_protocol_gives_its_codes_values(sandbox):
    async def play(opener: Sandbox) -> tuple:
        env: EnvInstance = await opener.open(COUNTER, max_turns=4)
        try:
            return env.class_name, env.max_turns, await env.reset(seed=2), await env.step("abc")
        finally:
            assert await env.close() is None

    name, max_turns, reset, step = sandbox.run(play(sandbox.service))
    assert (name, max_turns) == ("CounterEnv", 4)
    assert isinstance(reset, ResetResult) and (reset.observation, reset.info) == ("start at 2", {"seed": 2})
    assert isinstance(step, StepResult)
    assert (step.observation, step.reward, step.terminated, step.truncated, step.info) == (
        "total 5", 5.0, True, False, {"added": 3})


def test_an_object_without_step_is_not_an_environment():
    class ResetOnly:
        class_name = "X"
        max_turns = None

        async def reset(self, seed=None):
            return None

        async def close(self):
            return None

    assert not isinstance(ResetOnly(), EnvInstance)
