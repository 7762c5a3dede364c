"""Run by tests/envs/test_verifiers_env.py with .venv-verifiers' python (verifiers is not in .venv).

Plays each scripted reply list through SpadePoolEnv.run with a scripted interaction standing in
for verifiers' agent, and prints one JSON line per episode: the reward, the turns and the actions."""

import asyncio
import json
import sys
from pathlib import Path

import verifiers.v1 as vf  # noqa: F401  (the real package, imported as the adapter does)

from spade.envs.verifiers_env import SpadePoolConfig, SpadePoolEnv, SpadePoolTaskset, TASKSET_ID, load_environment


class Segment:
    def __init__(self, reply):
        self.last_reply, self.terminated = reply or "", reply is None


class Trace:
    def __init__(self):
        self.rewards, self.info = {}, {}

    def record_reward(self, name, value, weight):
        self.rewards[name] = (value, weight)


class Interaction:
    def __init__(self, replies):
        self.replies, self.sent, self.trace = list(replies), [], Trace()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def turn(self, message=None):
        self.sent.append(message)
        return Segment(self.replies.pop(0) if self.replies else None)


class Player:
    def __init__(self, replies):
        self.last = Interaction(replies)

    def interaction(self, task):
        return self.last


class Agents:
    def __init__(self, replies):
        self.player = Player(replies)


async def main(source: str, scripts: list[list[str]]) -> None:
    loaded = load_environment(source, seeds=len(scripts))  # through verifiers' own loader
    print(json.dumps({"loaded": type(loaded).__name__, "tasks": [t.data.name for t in loaded.taskset],
                      "harnesses": sorted(type(h).__name__ for h in loaded._harnesses.values())}))
    taskset = SpadePoolTaskset(SpadePoolConfig(id=TASKSET_ID, source=source, seeds=len(scripts)))
    tasks = list(taskset.load())
    env = object.__new__(SpadePoolEnv)  # run() needs only the sandbox service, not a harness
    await env.start()
    try:
        for task, script in zip(tasks, scripts):
            agents = Agents(script)
            await env.run(task, agents)
            trace = agents.player.last.trace
            print(json.dumps({"name": task.data.name, "prompt": task.data.prompt, "reward": trace.rewards,
                              "info": trace.info, "first_user": agents.player.last.sent[0]}))
    finally:
        await env.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
