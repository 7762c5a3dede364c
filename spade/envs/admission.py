"""Admitting a generated environment (SPEC section 3), stage by stage.

extract -> syntax -> load -> smoke -> determinism -> degenerate_probe -> winnability -> reference_policy
(``admit(determinism=False)``, ``admit(probes=None)``, ``admit(winnability=None)`` and
``admit(reference=None)``, the default for the last two, leave those out). Games get the probes of
``spade.envs.degenerate_probes`` (on seeds drawn for the candidate), the winnability stage of
``spade.envs.winnability`` and, when asked for, the reference policy; tool environments go through their own stages
(``spade.envs.tool_use.admission``), whose ``degenerate_probe`` is ``spade.envs.tool_use.degenerate_probes``.
The first failing stage rejects the candidate and is named in the verdict with the error kind.
Everything past ``syntax`` runs in the sandbox.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..designer.extract import extract_code
from .degenerate_probes import ProbeReport, ProbeSettings, run_probes
from .protocol import EnvError, EnvFault, ErrorKind, InfrastructureFault, Stage, StepResult
from .reference_policy import ReferenceReport, ReferenceSettings, run_reference
from .released_smoke import released_smoke_test
from .sandbox.client import SandboxedEnv, SandboxService
from .tool_use.admission import ModelScreen, ToolAdmissionSettings, ToolRejection, ToolReport, tool_stages
from .winnability import UNPROVEN, WON, WinnabilityReport, WinnabilitySettings, run_winnability

SMOKE_SEED = 42
SECOND_SEED = 123
PROBE_ACTIONS = ("\\boxed{1}", "\\boxed{a}", "hello")
REWARD_BOUND = 10.0


@dataclass(frozen=True)
class AdmissionVerdict:
    admitted: bool
    code: str
    class_name: str | None = None
    max_turns: int | None = None
    error: EnvError | None = None
    first_observation: str | None = None
    repairs: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
    tool_use: bool = False
    tool_report: ToolReport | None = None  # the tool stages' findings (tool environments only)
    probe_report: ProbeReport | None = None  # the degenerate-policy probes' returns (games, probes on)
    reference_report: ReferenceReport | None = None  # the reference policy's returns (games, when required)
    winnability_report: WinnabilityReport | None = None  # the designer's proofs played (games, gate on)

    @property
    def degenerate_family(self) -> str | None:
        """The family of the probe policy that won the game or tool environment (None: none won)."""
        if self.probe_report is not None and self.probe_report.winner is not None:
            return self.probe_report.winning_family
        probes = None if self.tool_report is None else self.tool_report.probes
        return None if probes is None else probes.winning_family

    def to_json(self, path: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {} if path is None else {"path": path}
        data.update(
            admitted=self.admitted,
            class_name=self.class_name,
            error=None if self.error is None else {
                "kind": self.error.kind.value, "stage": self.error.stage.value, "message": self.error.message},
            first_observation=self.first_observation,
            timings_ms={stage: round(ms, 3) for stage, ms in self.timings_ms.items()},
        )
        if self.probe_report is not None:
            data["probe_report"] = self.probe_report.to_json()
        if self.reference_report is not None:
            data["reference_report"] = self.reference_report.to_json()
        if self.winnability_report is not None:
            data["winnability_report"] = self.winnability_report.to_json()
        if self.tool_use:
            data["tool_use"] = True
            data["tool_report"] = None if self.tool_report is None else self.tool_report.to_json()
        return data


class CandidateRejected(Exception):
    """A candidate rejected by an admission stage; ``error`` says which and why."""

    def __init__(self, error: EnvError):
        super().__init__(error.message)
        self.error = error


class _Timer:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def stage(self, name: Stage) -> "_StageClock":
        return _StageClock(self.timings, name.value)


class _StageClock:
    def __init__(self, timings: dict[str, float], name: str):
        self.timings, self.name = timings, name

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.timings[self.name] = (time.perf_counter() - self.start) * 1000.0


def not_text_error(text: str) -> EnvError | None:
    """A ``syntax_error`` for source that is not text: bytes that are not UTF-8 (read with
    ``surrogateescape`` they are lone surrogates) or a NUL byte, naming the first one and where it
    is; None for proper text."""
    for index, char in enumerate(text):
        if char == "\x00" or "\udc80" <= char <= "\udcff":
            line = text.count("\n", 0, index) + 1
            column = index - (text.rfind("\n", 0, index) + 1) + 1
            byte = 0 if char == "\x00" else ord(char) - 0xDC00
            what = "a NUL byte" if char == "\x00" else f"byte 0x{byte:02x}, which is not UTF-8"
            return EnvError(ErrorKind.SYNTAX_ERROR, Stage.SYNTAX,
                            f"the source is not text: {what}, at line {line}, column {column}; "
                            f"an environment must be Python source in UTF-8")
        if "\ud800" <= char <= "\udfff":
            return EnvError(ErrorKind.SYNTAX_ERROR, Stage.SYNTAX,
                            "the source contains a lone surrogate character, which UTF-8 cannot encode")
    return None


async def admit(service: SandboxService, response: str, *, max_turns: int | None = None,
                seed: int = SMOKE_SEED, probe_actions: tuple[str, ...] = PROBE_ACTIONS,
                smoke_test: str = "paper",
                max_repair_passes: int = 20, require_tool_env: bool = False,
                tool_settings: ToolAdmissionSettings | None = None,
                screen: ModelScreen | None = None, determinism: bool = True,
                probes: ProbeSettings | None = ProbeSettings(),
                reference: ReferenceSettings | None = None, code_extraction: str = "spade",
                winnability: WinnabilitySettings | None = None) -> AdmissionVerdict:
    """Run every admission stage on a designer response (or plain source).

    A tool environment (its class subclasses ``ToolUseBaseEnv``) also goes through the tool-use
    stages (:mod:`spade.envs.tool_use.admission`); ``require_tool_env`` (the tool-use domain)
    rejects any other class at ``load``. ``screen`` is the model screen (None: not asked).
    ``determinism`` False leaves out the determinism stage, this project's addition (SPEC 3.5;
    ``selfplay.admission.determinism``). ``probes`` are the settings of
    the degenerate-policy probes (another addition, :mod:`spade.envs.degenerate_probes`); None
    leaves them out (``selfplay.admission.probes``, ``selfplay.admission.paper_exact``). ``reference``
    are the settings of the reference-policy stage (:mod:`spade.envs.reference_policy`;
    ``selfplay.admission.reference_policy``); None, the default, leaves it out. ``code_extraction`` is how
    the code is taken out of the response (``selfplay.code_extraction``, :func:`extract_code`).
    ``winnability`` are the settings of the winnability stage (:mod:`spade.envs.winnability`;
    ``selfplay.admission.winnability_gate``); None, the default, leaves it out. It plays on the probes' seeds
    for this candidate (:meth:`ProbeSettings.seeds_for`).

    Infrastructure faults are raised, not turned into a rejection: the candidate is not to blame.
    ``smoke_test`` ``"released"`` (``selfplay.admission.smoke_test``) runs the released code's smoke
    test (:mod:`spade.envs.released_smoke`) instead of the paper's (``seed``, ``probe_actions``).
    """
    timer = _Timer()
    not_text = not_text_error(response)
    if not_text is not None:
        return AdmissionVerdict(False, code="", error=not_text)
    with timer.stage(Stage.EXTRACT):
        extraction = extract_code(response, max_repair_passes=max_repair_passes, how=code_extraction)
    code = extraction.code
    partial = dict(code=code, repairs=extraction.repairs, timings_ms=timer.timings)
    if not code.strip():
        error = EnvError(ErrorKind.SYNTAX_ERROR, Stage.EXTRACT, "the response contains no code")
        return AdmissionVerdict(False, error=error, **partial)
    with timer.stage(Stage.SYNTAX):
        syntax_error = extraction.syntax_error
    if syntax_error is not None:
        return AdmissionVerdict(False, error=EnvError(ErrorKind.SYNTAX_ERROR, Stage.SYNTAX, syntax_error), **partial)

    env: SandboxedEnv | None = None
    first_observation: str | None = None
    report: ToolReport | None = None
    probe_report: ProbeReport | None = None
    reference_report: ReferenceReport | None = None
    winnability_report: WinnabilityReport | None = None
    candidate_probes = (probes or ProbeSettings()).for_candidate(code)
    try:
        with timer.stage(Stage.LOAD):
            env = await _staged(service.open(code, max_turns=max_turns), Stage.LOAD)
            if require_tool_env and not getattr(env, "tool_use", False):
                raise CandidateRejected(EnvError(ErrorKind.NO_ENV_CLASS, Stage.LOAD,
                                          f"class {env.class_name} does not subclass ToolUseBaseEnv, which a "
                                          "tool-use environment must"))
        with timer.stage(Stage.SMOKE):
            if smoke_test == "released":
                first_observation = await _staged(released_smoke_test(
                    env, lambda: service.open(code, max_turns=max_turns)), Stage.SMOKE)
            else:
                first_observation = await _smoke_test(env, seed, probe_actions)
        if determinism:
            with timer.stage(Stage.DETERMINISM):
                again = await _staged(env.reset(seed=seed), Stage.DETERMINISM)
                if again.observation != first_observation:
                    raise CandidateRejected(EnvError(ErrorKind.NONDETERMINISTIC_RESET, Stage.DETERMINISM,
                                              f"reset(seed={seed}) gave a different first observation the second "
                                              "time"))
        if probes is not None and not getattr(env, "tool_use", False):
            with timer.stage(Stage.DEGENERATE_PROBE):
                probe_report = await _staged(run_probes(env, candidate_probes, max_turns=max_turns),
                                             Stage.DEGENERATE_PROBE)
            if probe_report.winner is not None:
                raise CandidateRejected(EnvError(ErrorKind.DEGENERATE_WIN, Stage.DEGENERATE_PROBE,
                                          _win_message(probe_report)))
        if winnability is not None and not getattr(env, "tool_use", False):
            with timer.stage(Stage.WINNABILITY):
                proving = run_winnability(env, winnability, candidate_probes.first_round, max_turns=max_turns)
                winnability_report = await _staged(proving, Stage.WINNABILITY)
            verdict = winnability_report.verdict
            if verdict != WON and (verdict != UNPROVEN or winnability.unproven == "reject"):
                raise CandidateRejected(EnvError(ErrorKind.UNWINNABLE, Stage.WINNABILITY, winnability_report.message()))
        if reference is not None and not getattr(env, "tool_use", False):
            with timer.stage(Stage.REFERENCE_POLICY):
                if not reference.seeds:  # the run's settings: the candidate's own seeds (issue 40)
                    reference = replace(reference, seeds=candidate_probes.first_round)
                reference_report = await _reference_stage(env, reference, max_turns, probe_report)
            if not reference_report.won:
                raise CandidateRejected(EnvError(ErrorKind.REFERENCE_LOST, Stage.REFERENCE_POLICY, reference_report.message()))
        if getattr(env, "tool_use", False):
            current = [Stage.TOOL_SCHEMA]

            def clock(stage: Stage) -> "_StageClock":
                current[0] = stage
                return timer.stage(stage)

            try:
                report = await tool_stages(env, code, tool_settings or ToolAdmissionSettings(), timer.timings,
                                           screen=screen, clock=clock,
                                           probes=None if probes is None else candidate_probes, max_turns=max_turns)
            except ToolRejection as rejection:
                raise CandidateRejected(rejection.error) from None
            except InfrastructureFault:
                raise
            except EnvFault as fault:
                raise CandidateRejected(EnvError(fault.error.kind, current[0],
                                          f"{fault.error.stage.value}(): {fault.error.message}")) from None
    except CandidateRejected as rejection:
        return AdmissionVerdict(False, class_name=env.class_name if env else None, error=rejection.error,
                                first_observation=first_observation, tool_use=bool(getattr(env, "tool_use", False)),
                                tool_report=report, probe_report=probe_report, reference_report=reference_report,
                                winnability_report=winnability_report, **partial)
    finally:
        if env is not None:
            await env.close()
    return AdmissionVerdict(True, class_name=env.class_name, max_turns=env.max_turns,
                            first_observation=first_observation, tool_use=bool(getattr(env, "tool_use", False)),
                            tool_report=report, probe_report=probe_report, reference_report=reference_report,
                            winnability_report=winnability_report, **partial)


async def _reference_stage(env: SandboxedEnv, settings: ReferenceSettings, max_turns: int | None,
                           probes: ProbeReport | None) -> ReferenceReport:
    """Play the reference policy; a class without one is rejected as ``reference_missing``, an
    environment that already failed (in the probes) as ``reference_lost``."""
    try:
        report = await run_reference(env, settings, max_turns=max_turns)
    except InfrastructureFault:
        raise
    except EnvFault as fault:
        error = fault.error
        if error.kind is ErrorKind.REFERENCE_MISSING:
            raise CandidateRejected(EnvError(ErrorKind.REFERENCE_MISSING, Stage.REFERENCE_POLICY,
                                      f"{error.message}: selfplay.admission.reference_policy asks every game for one"
                                      )) from None
        raise CandidateRejected(EnvError(ErrorKind.REFERENCE_LOST, Stage.REFERENCE_POLICY,
                                  f"the environment failed before its reference policy could win ({error.kind.value}: "
                                  f"{error.message})"[:2_000])) from None
    played = [r.mean_return for r in probes.results if r.mean_return is not None] if probes is not None else []
    report.probes_best_return = max(played) if played else None
    return report


def _win_message(report: ProbeReport) -> str:
    winner = report.winner
    assert winner is not None and winner.mean_return is not None
    confidence = report.confidence()
    return (f"the probe policy '{winner.policy}' of family '{winner.family}' ({winner.description}) wins: mean "
            f"return {winner.mean_return:.3f} over seeds {winner.seeds} (threshold {report.threshold_of(winner):g}, "
            f"confidence {confidence or 0.0:.3f}); a game that a policy knowing nothing of it wins pays for "
            "something other than skill")


async def _staged(awaitable: Any, stage: Stage) -> Any:
    """Await a sandbox call; an environment fault becomes a rejection labelled with ``stage``."""
    try:
        return await awaitable
    except InfrastructureFault:
        raise
    except EnvFault as fault:
        error = fault.error
        message = error.message if stage in (Stage.LOAD,) else f"{error.stage.value}(): {error.message}"
        raise CandidateRejected(EnvError(error.kind, stage, message)) from None


async def _smoke_test(env: SandboxedEnv, seed: int, probe_actions: tuple[str, ...]) -> str:
    first = await _staged(env.reset(seed=seed), Stage.SMOKE)
    if not first.observation.strip():
        raise CandidateRejected(EnvError(ErrorKind.BAD_RETURN, Stage.SMOKE, f"reset(seed={seed}) returned an empty observation"))
    for action in probe_actions:
        result = await _staged(env.step(action), Stage.SMOKE)
        _check_reward_bound(result, action)
        if result.terminated or result.truncated:
            break
    await _staged(env.reset(seed=SECOND_SEED), Stage.SMOKE)
    return first.observation


def _check_reward_bound(result: StepResult, action: str) -> None:
    if not (math.isfinite(result.reward) and -REWARD_BOUND <= result.reward <= REWARD_BOUND):
        raise CandidateRejected(EnvError(ErrorKind.BAD_RETURN, Stage.SMOKE,
                                  f"step({action!r}) returned reward {result.reward}, outside "
                                  f"[-{REWARD_BOUND:g}, {REWARD_BOUND:g}]"))
