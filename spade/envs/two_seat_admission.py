"""Admitting a designed two-seat game (issue 44): the contract of :mod:`spade.envs.two_seat`, checked
stage by stage in the sandbox.

extract -> syntax -> load -> smoke -> determinism -> degenerate_probe -> winnability

* ``extract`` / ``syntax``: the ordinary code extraction (:func:`spade.designer.extract.extract_code`);
* ``load``: the class is loaded and built in a sandboxed process (:meth:`SandboxService.open`);
* ``smoke``: ``reset(SMOKE_SEED)`` names the seat to move and its observation lists valid moves;
  the first-valid-move player and the random-valid-move player each play a game against
  themselves with every return checked against the contract, and at least one of the two games
  ends on its own within the turn budget (else ``never_ends``);
* ``determinism``: the first of those games played again from the same seed shows the same
  observations to the same seats and ends the same way (else ``nondeterministic_reset``);
* ``degenerate_probe`` and ``winnability``: the round robin of :mod:`spade.envs.two_seat_probes`
  on the candidate's probe seeds: rejected as ``degenerate_win`` when a content-free reply beats
  the legal-move players, ``one_sided`` when one seat never wins on the rules, ``always_draw``
  when neither does, ``never_ends`` when no game ends.

The first failing stage rejects the candidate, named in the verdict with the error kind; a fault of
the game on the way (a crash, a contract break) rejects it with the fault's kind at that stage.
Infrastructure faults are raised: the candidate is not to blame.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, TypeVar

from ..designer.extract import extract_code
from .admission import SMOKE_SEED, CandidateRejected, not_text_error
from .protocol import EnvError, EnvFault, EnvInstance, ErrorKind, InfrastructureFault, Sandbox, Stage
from .two_seat import TwoSeatGame, valid_moves
from .two_seat_probes import Match, SeatProbeReport, SeatProbeSettings, play_match, run_seat_probes, seat_policies

T = TypeVar("T")


@dataclass(frozen=True)
class TwoSeatVerdict:
    admitted: bool
    code: str
    class_name: str | None = None
    error: EnvError | None = None
    first_observation: str | None = None
    report: SeatProbeReport | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "class_name": self.class_name,
                "error": None if self.error is None else self.error.to_json(),
                "first_observation": self.first_observation,
                "report": None if self.report is None else self.report.to_json(),
                "timings_ms": {stage: round(ms, 3) for stage, ms in self.timings_ms.items()}}


async def _staged(awaitable: Awaitable[T], stage: Stage) -> T:
    """Await a sandbox call; the game's fault becomes a rejection at ``stage``."""
    try:
        return await awaitable
    except InfrastructureFault:
        raise
    except EnvFault as fault:
        error = fault.error
        message = error.message if stage is Stage.LOAD else f"{error.stage.value}(): {error.message}"
        raise CandidateRejected(EnvError(error.kind, stage, message[:2_000])) from None


def _reject(kind: ErrorKind, stage: Stage, message: str) -> CandidateRejected:
    return CandidateRejected(EnvError(kind, stage, message))


async def _smoke(env: EnvInstance, turns: int) -> tuple[str, Match, list[tuple[int, str]]]:
    """The smoke stage: the first observation, and the first-valid-move game with its transcript."""
    game = await _staged(TwoSeatGame(env, turns).start(SMOKE_SEED), Stage.SMOKE)
    first = game.observation
    if not first.strip():
        raise _reject(ErrorKind.BAD_RETURN, Stage.SMOKE, f"reset(seed={SMOKE_SEED}) returned an empty observation")
    if not valid_moves(first):
        raise _reject(ErrorKind.BAD_RETURN, Stage.SMOKE,
                      f"reset(seed={SMOKE_SEED})'s observation has no 'Valid moves: [a], [b], ...' line: the "
                      "two-seat contract asks every observation to list the moves it accepts")
    legal = {policy.name: policy for policy in seat_policies()}
    transcript: list[tuple[int, str]] = []
    played = [await _staged(play_match(env, (legal["legal_first"], legal["legal_first"]), SMOKE_SEED, turns,
                                       record=transcript), Stage.SMOKE),
              await _staged(play_match(env, (legal["legal_random"], legal["legal_random"]), SMOKE_SEED, turns),
                            Stage.SMOKE)]
    if all(match.reason == "turn_limit" for match in played):
        raise _reject(ErrorKind.NEVER_ENDS, Stage.SMOKE,
                      f"neither the first-valid-move nor the random-valid-move player's game against itself ends "
                      f"within {turns} moves (seed {SMOKE_SEED})")
    return first, played[0], transcript


async def admit_two_seat(sandbox: Sandbox, response: str, settings: SeatProbeSettings, *,
                         code_extraction: str = "spade", max_repair_passes: int = 20) -> TwoSeatVerdict:
    """Every stage on a designer response (or plain source); see the module docstring."""
    timings: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(stage: Stage) -> None:
        now = time.perf_counter()
        timings[stage.value] = (now - clock[0]) * 1000.0
        clock[0] = now

    not_text = not_text_error(response)
    if not_text is not None:
        return TwoSeatVerdict(False, "", error=not_text)
    extraction = extract_code(response, max_repair_passes=max_repair_passes, how=code_extraction)
    code = extraction.code
    lap(Stage.EXTRACT)
    if not code.strip():
        return TwoSeatVerdict(False, code, error=EnvError(ErrorKind.SYNTAX_ERROR, Stage.EXTRACT,
                                                           "the response contains no code"), timings_ms=timings)
    if extraction.syntax_error is not None:
        return TwoSeatVerdict(False, code, error=EnvError(ErrorKind.SYNTAX_ERROR, Stage.SYNTAX,
                                                           extraction.syntax_error), timings_ms=timings)
    env: Any = None
    first: str | None = None
    report: SeatProbeReport | None = None
    try:
        env = await _staged(sandbox.open(code, max_turns=settings.turns), Stage.LOAD)
        lap(Stage.LOAD)
        first, smoke_match, transcript = await _smoke(env, settings.turns)
        lap(Stage.SMOKE)
        again: list[tuple[int, str]] = []
        legal_first = next(p for p in seat_policies() if p.name == "legal_first")
        replay = await _staged(play_match(env, (legal_first, legal_first), SMOKE_SEED, settings.turns, record=again),
                               Stage.DETERMINISM)
        if again != transcript or replay != smoke_match:
            turn = next((i for i, (a, b) in enumerate(zip(again, transcript)) if a != b),
                        min(len(again), len(transcript)))
            raise _reject(ErrorKind.NONDETERMINISTIC_RESET, Stage.DETERMINISM,
                          f"the same seed ({SMOKE_SEED}) and the same moves gave a different game the second time "
                          f"(first difference at move {turn + 1})")
        lap(Stage.DETERMINISM)
        report = await _staged(run_seat_probes(env, settings, settings.seeds_for(code)), Stage.DEGENERATE_PROBE)
        lap(Stage.DEGENERATE_PROBE)  # the round robin: degenerate_probe and winnability together
        error = report.verdict()
        if error is not None:
            raise CandidateRejected(error)
    except CandidateRejected as rejection:
        return TwoSeatVerdict(False, code, getattr(env, "class_name", None), rejection.error, first, report, timings)
    finally:
        if env is not None:
            await env.close()
    return TwoSeatVerdict(True, code, env.class_name, None, first, report, timings)
