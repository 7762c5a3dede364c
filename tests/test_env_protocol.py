"""The real sandbox satisfies the protocols everything above it is written against."""

from spade.envs.protocol import EnvInstance, Sandbox
from spade.envs.sandbox.client import SandboxedEnv, SandboxService
from spade.envs.sandbox.config import SandboxConfig


def test_the_sandbox_service_and_its_environments_implement_the_protocols():
    service = SandboxService(SandboxConfig())  # not started: only its interface is checked
    assert isinstance(service, Sandbox)
    env = SandboxedEnv(service, generation=0, env_id=1, class_name="GuessEnv", max_turns=5)
    assert isinstance(env, EnvInstance)


def test_an_object_without_step_is_not_an_environment():
    class ResetOnly:
        class_name = "X"
        max_turns = None

        async def reset(self, seed=None):
            return None

        async def close(self):
            return None

    assert not isinstance(ResetOnly(), EnvInstance)
