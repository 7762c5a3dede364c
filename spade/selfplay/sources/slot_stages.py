"""Which stage each designer slot of a regeneration is in, told as one phase for the progress line.

The slots of a set run concurrently, each through ``designing`` (the designer call), ``admitting``
(the sandbox's checks) and ``hinting`` (the hint call of an admitted candidate), back to
``designing`` after a rejection. The phase reported is the earliest stage a slot is still in,
with how many slots are in each (``3 designing, 2 admitting, 1 hinting``). Standard library only.
"""

from __future__ import annotations

from typing import Callable

STAGES = ("designing", "admitting", "hinting")
# the phase of a regeneration by ``selfplay.env_source`` (the designer's slots refine it with STAGES)
SET_STAGE = {"designer": "designing", "fixed_pool": "drawing", "rlve": "generating", "spice": "challenging",
             "spiral": "dealing"}


def no_stage(name: str, detail: str | None = None) -> None:
    """The default listener: nobody shows the stages (``spade pool generate``, tests)."""


class SlotStages:
    def __init__(self) -> None:
        self.report: Callable[[str, str | None], None] = no_stage
        self._of: dict[int, str] = {}

    def enter(self, slot: int, stage: str) -> None:
        self._of[slot] = stage
        self._tell()

    def leave(self, slot: int) -> None:
        if self._of.pop(slot, None) is not None:
            self._tell()

    def _tell(self) -> None:
        counts = {stage: sum(1 for s in self._of.values() if s == stage) for stage in STAGES}
        present = [stage for stage in STAGES if counts[stage]]
        if present:
            self.report(present[0], ", ".join(f"{counts[stage]} {stage}" for stage in present))
