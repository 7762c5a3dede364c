"""rlve-gym's procedural problems (the Fixed-env RLVE baseline) behind the environment contract.

:mod:`.worker` runs rlve-gym in a process of its own, :mod:`.workers` starts and talks to those
processes, :mod:`.sandbox` adapts a generated problem to ``Sandbox``/``EnvInstance``.
"""

from .sandbox import ANSWER_INSTRUCTION, ProblemSpec, RLVEInstance, RLVESandbox, prompt_digest, to_rlve_output
from .workers import RLVEWorkers, WorkerDied, WorkerError, WorkerTimeout

__all__ = ["ANSWER_INSTRUCTION", "ProblemSpec", "RLVEInstance", "RLVESandbox", "RLVEWorkers", "WorkerDied",
           "WorkerError", "WorkerTimeout", "prompt_digest", "to_rlve_output"]
