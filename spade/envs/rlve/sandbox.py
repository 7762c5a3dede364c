r"""rlve-gym problems behind the environment contract (:class:`~spade.envs.protocol.Sandbox`).

An RLVE "environment source" is not code but a :class:`ProblemSpec` in JSON: the rlve-gym
environment identifier, the problem seed, the generator parameter, the difficulty it was drawn
at, the reward that counts as solved, and a digest of the prompt. :meth:`RLVESandbox.open`
generates the problem in a worker process (or finds it in that worker's cache) and checks the
prompt against the digest. The instance is single-turn:

* ``reset`` ignores its seed (one problem per GRPO group: every play of a spec sees the same
  problem) and returns the problem's prompt with an instruction to answer in ``\boxed{}``;
* ``step`` turns the agent's ``\boxed{X}`` action into RLVE's ``<answer>X</answer>``, scores it
  with the problem's own verifier, and returns its reward with ``terminated=True``: by default
  the verifier's ``reward`` (in [-1, 1], RLVE's training reward), with ``reward="accuracy"`` its
  0/1 ``accuracy`` (what the paper's released adapter trained on);
  an action without a box is scored as an output without an answer (RLVE's format penalty).
* a reply cut off at its token limit is scored too (``scores_cut_off_replies``): RLVE scores a
  truncated response with the same verifier as any other, so a box closed before the cut counts
  and a reply without one gets the environment's no-answer reward (-1 in most of rlve-gym), not
  the 0 the episode rule gives other cut-off episodes. (The paper's released adapter instead
  scored every play 1 if accurate else 0, and a cut-off 0.)

Failures: a problem that does not generate, an unknown environment, a verification past its
timeout or a prompt that came out different are :class:`EnvFault`; a worker that died is an
:class:`InfrastructureFault` (the play is retried).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Optional

from ..protocol import EnvError, EnvFault, ErrorKind, InfrastructureFault, ResetResult, Stage, StepResult
from .workers import RLVEWorkers, WorkerDied, WorkerTimeout

__all__ = ["ANSWER_INSTRUCTION", "ProblemSpec", "RLVEInstance", "RLVESandbox", "prompt_digest", "to_rlve_output"]

ANSWER_INSTRUCTION = "Put your final answer inside \\boxed{...}; only the last box in your reply counts."
REWARDS = ("verifier", "accuracy")  # the verifier's reward in [-1, 1], or its 0/1 accuracy
ANSWER_MARKERS = ("<answer>", "</answer>")  # rlve-gym's default markers, which its verifiers read
_BOX = "\\boxed{"


@dataclass(frozen=True)
class ProblemSpec:
    """One generated rlve-gym problem (the ``source`` of its :class:`EnvSpec`, as JSON)."""

    environment: str
    seed: int
    parameter: dict[str, Any]
    difficulty: int
    threshold: float = 1.0  # rlve-gym's passing_reward_threshold: a reward at least this is "accurate"
    prompt_sha256: str = ""

    def to_source(self) -> str:
        return json.dumps({"rlve": asdict(self)}, sort_keys=True)

    @classmethod
    def from_source(cls, source: str) -> "ProblemSpec":
        try:
            data = json.loads(source)["rlve"]
            return cls(environment=str(data["environment"]), seed=int(data["seed"]),
                       parameter=dict(data["parameter"]), difficulty=int(data["difficulty"]),
                       threshold=float(data.get("threshold", 1.0)), prompt_sha256=str(data.get("prompt_sha256", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise EnvFault(EnvError(ErrorKind.PROTOCOL_ERROR, Stage.LOAD,
                                    f"not an rlve problem spec ({type(exc).__name__}: {exc})")) from None

    def worker_key(self) -> int:
        """Which worker generates and scores this problem (the same one every time: its cache)."""
        return self.seed


def prompt_digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def to_rlve_output(action: str) -> str:
    r"""The agent's action (``\boxed{X}``, see :func:`spade.agent.actions.parse_action`) as the
    output rlve-gym's verifiers read: ``<answer>X</answer>``; no box: no answer."""
    if not (action.startswith(_BOX) and action.endswith("}")):
        return ""
    return f"{ANSWER_MARKERS[0]}{action[len(_BOX):-1]}{ANSWER_MARKERS[1]}"


def _fault(stage: Stage, exc: WorkerDied | WorkerTimeout) -> EnvFault:
    """A dead worker is the infrastructure's failure (retry); one past its timeout, the problem's."""
    if isinstance(exc, WorkerDied):
        return InfrastructureFault(EnvError(ErrorKind.CRASHED, Stage.SERVICE, str(exc), infrastructure=True))
    return EnvFault(EnvError(ErrorKind.TIMEOUT, stage, str(exc)))


class RLVEInstance:
    """One play of one problem (single-turn; see the module docstring)."""

    max_turns: Optional[int] = 1
    scores_cut_off_replies = True  # RLVE's verifier scores a truncated response as it stands

    def __init__(self, sandbox: "RLVESandbox", spec: ProblemSpec, prompt: str):
        self.sandbox = sandbox
        self.spec = spec
        self.prompt = prompt
        self.class_name = spec.environment
        self.done = False

    async def reset(self, seed: Optional[int] = None) -> ResetResult:
        self.done = False
        return ResetResult(f"{self.prompt}\n\n{ANSWER_INSTRUCTION}",
                           {"environment": self.spec.environment, "difficulty": self.spec.difficulty})

    async def step(self, action: str) -> StepResult:
        if self.done:
            raise EnvFault(EnvError(ErrorKind.STEP_ERROR, Stage.STEP, "the problem was already answered"))
        verdict = await self.sandbox.verify(self.spec, to_rlve_output(action))
        self.done = True
        reward = float(verdict["reward"] if self.sandbox.reward == "verifier" else verdict.get("accuracy", 0.0))
        info = {"accuracy": verdict.get("accuracy", 0.0), "format_score": verdict.get("format_score", 0.0)}
        return StepResult("", reward, True, False, info)

    async def close(self) -> None:
        pass


class RLVESandbox:
    """Where rlve-gym problems are played (a :class:`~spade.envs.protocol.Sandbox`)."""

    def __init__(self, workers: RLVEWorkers, *, generation_timeout_s: float = 10.0, request_timeout_s: float = 60.0,
                 reward: str = "verifier"):
        if reward not in REWARDS:
            raise ValueError(f"reward: {reward!r} is not allowed; choose one of: {', '.join(REWARDS)}")
        self.workers = workers
        self.reward = reward
        self.generation_timeout_s = generation_timeout_s
        self.request_timeout_s = request_timeout_s

    async def request(self, key: int, message: dict[str, Any], stage: Stage) -> dict[str, Any]:
        """One worker request with rlve-gym's own generation timeout; worker failures as faults."""
        try:
            return await self.workers.call(key, {**message, "timeout_s": self.generation_timeout_s},
                                           self.request_timeout_s)
        except (WorkerDied, WorkerTimeout) as exc:
            raise _fault(stage, exc) from None

    async def open(self, source: str, *, max_turns: Optional[int] = None) -> RLVEInstance:
        spec = ProblemSpec.from_source(source)
        answer = await self.request(spec.worker_key(), {"op": "open", "environment": spec.environment,
                                                        "seed": spec.seed, "parameter": spec.parameter}, Stage.LOAD)
        if not answer.get("ok"):
            raise EnvFault(EnvError(ErrorKind.INIT_ERROR, Stage.LOAD,
                                    f"rlve {spec.environment}: {answer.get('error', 'no answer')}"))
        prompt = str(answer["prompt"])
        if spec.prompt_sha256 and prompt_digest(prompt) != spec.prompt_sha256:
            raise EnvFault(EnvError(ErrorKind.NONDETERMINISTIC_RESET, Stage.RESET,
                                    f"rlve {spec.environment} seed {spec.seed}: the regenerated prompt differs"))
        return RLVEInstance(self, spec, prompt)

    async def verify(self, spec: ProblemSpec, output: str) -> dict[str, Any]:
        answer = await self.request(spec.worker_key(), {"op": "verify", "environment": spec.environment,
                                                        "seed": spec.seed, "parameter": spec.parameter,
                                                        "output": output}, Stage.STEP)
        if not answer.get("ok"):
            raise EnvFault(EnvError(ErrorKind.STEP_ERROR, Stage.STEP,
                                    f"rlve {spec.environment}: {answer.get('error', 'no answer')}"))
        return answer

    async def close(self) -> None:
        self.workers.close()
