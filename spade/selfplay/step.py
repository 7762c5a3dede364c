"""Algorithm 1's step counter: a step is named by the policy updates done before it.

The first step runs with 0 updates done, step ``s`` with ``s``. That one count is read seven ways;
each reading has its name here, and no other module does arithmetic on a step:

* :meth:`Step.regenerates` (``s % k == 0``): the step designs a new environment set;
* :meth:`Step.regeneration` (``s // k``): which set that is (the skills it covers);
* :attr:`Step.updates_done` (``s``): the step's number, in the seeds derived for it, its files
  (``step_000123``), its environment ids and its ``metrics.jsonl`` line;
* :attr:`Step.after` (``s + 1``): the updates done once this step's update is in: the weight
  version the engine serves next, the checkpoint written after the step, the next step;
* :attr:`Step.last_run` (``s - 1``): the step before, what a resumed run keeps (memory records,
  trajectory files, metrics lines); -1 at the start of a run;
* :attr:`Step.ordinal` (``s + 1``): which of the run's steps it is, the console's ``(N/total)`` after ``step s``;
* :meth:`Step.release_step` (``s + k``), :meth:`Step.in_window` and :meth:`Step.window_overlaps`:
  when a design of this step is scored, which later steps' plays count for it, and whether two
  windows share a step (the delay buffer's rules).

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Step"]


@dataclass(frozen=True, order=True)
class Step:
    """One self-play step: the number of policy updates done before it (see the module docstring)."""

    updates_done: int

    def __post_init__(self) -> None:
        if isinstance(self.updates_done, bool) or not isinstance(self.updates_done, int) or self.updates_done < 0:
            raise ValueError(f"step: must be an integer >= 0, got {self.updates_done!r}")

    def every(self, n: int) -> bool:
        """Whether ``n`` divides the updates done (something done every ``n`` steps, from the first)."""
        return self.updates_done % n == 0

    def regenerates(self, k: int) -> bool:
        """Whether this step designs a new set (every ``k`` steps, from the first)."""
        return self.every(k)

    def regeneration(self, k: int) -> int:
        """Which regeneration this step's set comes from (0 for the first set)."""
        return self.updates_done // k

    @property
    def after(self) -> "Step":
        """The updates done once this step's update is in (weight version, checkpoint, next step)."""
        return Step(self.updates_done + 1)

    @property
    def ordinal(self) -> int:
        """Which of the run's steps it is: 1 for the first (the console's ``step s (N/total)``)."""
        return self.updates_done + 1

    @property
    def last_run(self) -> int:
        """The number of the step before this one (-1 before the first step)."""
        return self.updates_done - 1

    def release_step(self, k: int) -> int:
        """The step that scores a design of this step: its window ``s .. s+k-1`` is over."""
        return self.updates_done + k

    def in_window(self, step: int, k: int) -> bool:
        """Whether ``step`` is a later step of the window of a set designed at this step."""
        return self.updates_done < step < self.release_step(k)

    def window_overlaps(self, step: int, k: int) -> bool:
        """Whether the windows of sets designed at this step and at ``step`` share a step."""
        return abs(self.updates_done - step) < k
