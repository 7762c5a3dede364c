"""One rlve-gym worker process: RLVE's generators, parameter controllers and verifiers, out of the
trainer's process.

rlve-gym reseeds the global ``random``, ``numpy`` and ``torch`` generators on every problem it
generates, so none of it may run in the trainer. The parent (:mod:`.workers`) starts this module
with ``python -m spade.envs.rlve.worker`` and talks to it in JSON lines: one request per line on
stdin, one answer per line on the original stdout (everything rlve-gym prints goes to stderr).

Requests (``op``):

* ``list``: the identifiers of every environment the package has.
* ``sample``: draw one problem of ``environment`` as RLVE's data source does: walk a fresh
  parameter controller from difficulty 0 up to ``max_difficulty`` (``update()`` once per level),
  keep the parameter lists of the last ``window`` levels, choose a level, then one of its
  parameters (both with ``random.Random(choice_seed)``), and generate with ``problem_seed``.
* ``open``: generate (or find in the cache) the problem ``(environment, seed, parameter)``.
* ``verify``: score ``output`` with the problem's own verifier (a fresh environment object given
  the generated configuration, as RLVE's reward function does).

The worker exits when stdin closes, and is killed with its parent (``PR_SET_PDEATHSIG``). A
generation that ran past its timeout leaves a thread running inside rlve-gym; the worker answers
and then exits, and the parent starts a fresh one.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import os
import random
import signal
import sys
import time
from collections import OrderedDict
from typing import Any

PARENT_ENV = "SPADE_RLVE_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the parent goes; exit now if it already went."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: stdin EOF still ends the worker between requests
        pass
    expected = os.environ.get(PARENT_ENV)
    if expected is not None and os.getppid() != int(expected):
        os._exit(0)


class Problems:
    """Generated problems by ``(environment, seed, parameter)``: their configuration and prompt."""

    def __init__(self, capacity: int):
        from Gym.environments import identifier2environment
        from Gym.parameter_controllers import identifier2controller

        self.environments = identifier2environment
        self.controllers = identifier2controller
        self.capacity = capacity
        self.cache: OrderedDict[str, tuple[dict[str, Any], str]] = OrderedDict()
        self.timed_out = False  # a generation ran past its timeout: its thread may still be running

    def environment_class(self, name: str) -> Any:
        if name not in self.environments:
            raise KeyError(f"rlve-gym has no environment {name!r}")
        return self.environments[name]

    def generate(self, name: str, seed: int, parameter: dict[str, Any], timeout_s: float) -> tuple[dict, str] | None:
        key = json.dumps([name, seed, parameter], sort_keys=True)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        env = self.environment_class(name)()
        seconds = max(1, int(round(timeout_s)))
        started = time.monotonic()
        if not env.generator(seed=seed, parameter=parameter, timeout_second=seconds):
            self.timed_out = time.monotonic() - started >= seconds
            return None
        entry = (copy.deepcopy(env.get_config()), env.prompt_generator())
        self.cache[key] = entry
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
        return entry

    def candidates(self, name: str, max_difficulty: int, window: int) -> list[tuple[int, list[dict]]]:
        """The ``(difficulty, parameter list)`` of the levels ``max_difficulty - window + 1 .. max_difficulty``."""
        if name not in self.controllers:
            raise KeyError(f"rlve-gym has no parameter controller {name!r}")
        controller = self.controllers[name]()
        levels = []
        for difficulty in range(max_difficulty + 1):
            if difficulty > max_difficulty - window:
                levels.append((difficulty, copy.deepcopy(controller.get_parameter_list())))
            controller.update()
        return levels

    def verify(self, name: str, config: dict[str, Any], output: str) -> dict[str, Any]:
        env = self.environment_class(name)()
        env.set_config(copy.deepcopy(config))
        return {k: float(v) for k, v in env.verifier(output).items()}


def handle(problems: Problems, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "list":
        return {"ok": True, "environments": sorted(problems.environments)}
    name = request["environment"]
    timeout_s = float(request.get("timeout_s", 10.0))
    if op == "sample":
        levels = problems.candidates(name, int(request["max_difficulty"]), int(request["window"]))
        rng = random.Random(int(request["choice_seed"]))
        difficulty, parameters = rng.choice(levels)
        parameter = rng.choice(parameters)
        json.dumps(parameter)  # the problem travels as JSON: refuse a parameter that cannot
        entry = problems.generate(name, int(request["problem_seed"]), parameter, timeout_s)
        if entry is None:
            return {"ok": False, "error": f"generation failed (difficulty {difficulty}, parameter {parameter})"}
        config, prompt = entry
        return {"ok": True, "difficulty": difficulty, "parameter": parameter, "prompt": prompt,
                "threshold": float(config.get("passing_reward_threshold", 1.0))}
    entry = problems.generate(name, int(request["seed"]), request["parameter"], timeout_s)
    if entry is None:
        return {"ok": False, "error": "generation failed"}
    config, prompt = entry
    if op == "open":
        return {"ok": True, "prompt": prompt, "threshold": float(config.get("passing_reward_threshold", 1.0))}
    if op == "verify":
        return {"ok": True, **problems.verify(name, config, str(request["output"]))}
    return {"ok": False, "error": f"unknown op {op!r}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=int, default=256, help="generated problems kept per worker")
    args = parser.parse_args(argv)
    die_with_parent()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # rlve-gym's prints must not reach the protocol stream
    sys.stdout = sys.stderr
    try:
        problems = Problems(args.cache)
    except ImportError as exc:
        answers.write(json.dumps({"ready": False, "error": f"rlve-gym cannot be imported ({exc}); "
                                  "install it with: pip install --no-deps rlve-gym==0.0.1"}) + "\n")
        return 1
    answers.write(json.dumps({"ready": True, "environments": len(problems.environments)}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        started = time.monotonic()
        try:
            answer = handle(problems, json.loads(line))
        except Exception as exc:  # a bad request or a crash inside rlve-gym: reported, the worker lives
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answer["elapsed_s"] = time.monotonic() - started
        answers.write(json.dumps(answer) + "\n")
        if problems.timed_out:  # rlve-gym cannot stop the thread of a timed-out generation
            answers.flush()
            os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
