"""Admission's degenerate-policy probes (issue 23) through the real sandbox.

A corpus of exploitable games, each honest-looking but paying a policy that knows nothing of it,
is rejected as ``degenerate_win`` with the policy that exploits it named; the honest games (the
seed games, the six examples, the tests' own guessing game, a graded game whose constant reply
scores a little) are admitted, with every probe's mean return in the verdict.
"""

from __future__ import annotations

import random
import re
import textwrap
from pathlib import Path

import pytest

from spade.envs.admission import admit
from spade.envs.degenerate_probes import PROBE_SEEDS, SEARCH_THRESHOLD, ProbeSettings, probe_policies, run_probes
from spade.envs.protocol import ErrorKind, Stage
from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings

from conftest import EXAMPLE_ENVS
from test_admission import GOOD

ROOT = Path(__file__).resolve().parents[2]
SEED_GAMES = sorted((ROOT / "examples" / "seed_envs").glob("*.py"))


def game(body: str) -> str:
    return "import random\nimport re\n\n" + textwrap.dedent(body)


# pays any reply at once: the first probe policy (\boxed{0}) wins it (also used by the analysis and metrics tests)
FREE_LUNCH = '''
class FreeLunchEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say anything at all.", {}

    def step(self, action):
        return "Well said.", 1.0, True, False, {}
'''

EXPLOITS = {
    # the thermostat near-copy: the last turn pays max(1.0, ...) = 1.0 whatever the action
    "any action on the last turn": (game('''
        class LastCallEnv:
            def __init__(self, max_turns=6):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.target = random.Random(seed).randint(10, 40)
                self.turn = 0
                return "Set the thermostat from 10 to 40. Reply with \\\\boxed{T}.", {}
            def step(self, action):
                self.turn += 1
                found = re.search(r"\\d+", action)
                guess = int(found.group()) if found else 0
                if self.turn >= self.max_turns:
                    return "Time is up.", max(1.0, 1.0 - abs(guess - self.target)), True, False, {}
                if guess == self.target:
                    return "Exactly right.", 1.0, True, False, {}
                return "Not quite.", 0.0, False, False, {}
        '''), "boxed_0"),
    "any action at all": (game('''
        class RiddleEnv:
            def __init__(self, max_turns=5):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.answer = random.Random(seed).choice(["echo", "shadow", "candle"])
                return "I speak without a mouth. What am I? Reply with \\\\boxed{word}.", {}
            def step(self, action):
                return "Well thought.", 1.0, True, False, {}
        '''), "boxed_0"),
    "unparseable actions pay": (game('''
        class DividerEnv:
            def __init__(self, max_turns=5):
                self.max_turns = max_turns
            def reset(self, seed=None):
                rng = random.Random(seed)
                self.a, self.b = rng.randint(100, 999), rng.randint(2, 9)
                self.turn = 0
                return f"What is {self.a} // {self.b}? Reply with \\\\boxed{{N}}.", {}
            def step(self, action):
                self.turn += 1
                if not action.strip():
                    return "Say something.", 0.0, False, self.turn >= self.max_turns, {}
                found = re.search(r"-?\\d+", action)
                if found is None:  # meant as 'try again', but pays and ends the episode
                    return "I could not read that.", 1.0, True, False, {}
                ok = int(found.group()) == self.a // self.b
                return ("Right." if ok else "Wrong."), float(ok), ok, self.turn >= self.max_turns, {}
        '''), "plain_text"),
    "secret number leaked in the first observation": (game('''
        class VaultEnv:
            def __init__(self, max_turns=8):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.code = random.Random(seed).randint(2, 99)
                self.turn = 0
                return f"Open the vault: a code from 1 to 100. [debug code={self.code}] Reply \\\\boxed{{N}}.", {}
            def step(self, action):
                self.turn += 1
                found = re.search(r"\\d+", action)
                if found and int(found.group()) == self.code:
                    return "Open.", 1.0, True, False, {}
                return "Locked.", 0.0, False, self.turn >= self.max_turns, {}
        '''), "observation_number_3"),
    "secret word leaked in the first observation": (game('''
        class ZooEnv:
            def __init__(self, max_turns=8):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.animal = random.Random(seed).choice(["zebra", "otter", "lynx", "heron"])
                self.turn = 0
                return f"Name the hidden animal in \\\\boxed{{name}}. (psst: {self.animal})", {}
            def step(self, action):
                self.turn += 1
                if self.animal in action.lower():
                    return "Yes!", 1.0, True, False, {}
                return "No.", 0.0, False, self.turn >= self.max_turns, {}
        '''), "observation_word_last_1"),
    "a constant answer wins": (game('''
        class CountingEnv:
            def __init__(self, max_turns=4):
                self.max_turns = max_turns
            def reset(self, seed=None):
                rng = random.Random(seed)
                self.word = "".join(rng.choice("bcdfg") for _ in range(5))
                self.turn = 0
                return f"How many times does 'a' appear in '{self.word}'? Reply \\\\boxed{{N}}.", {}
            def step(self, action):
                self.turn += 1
                found = re.search(r"\\d+", action)
                if found and int(found.group()) == self.word.count("a") + 1:  # off by one: always 1
                    return "Correct.", 1.0, True, False, {}
                return "No.", 0.0, False, self.turn >= self.max_turns, {}
        '''), "boxed_1"),
    "an empty offer wins": (game('''
        class HaggleEnv:
            def __init__(self, max_turns=6):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.price = random.Random(seed).randint(20, 80)
                self.turn = 0
                return f"The trader wants {self.price} coins. Make an offer as \\\\boxed{{N}}.", {}
            def step(self, action):
                self.turn += 1
                found = re.search(r"\\d+", action)
                offer = int(found.group()) if found else None
                if offer is None and not action.strip():  # no offer read as 'the trader's price'
                    return "Deal.", 1.0, True, False, {}
                if offer is not None and offer >= self.price:
                    return "Deal, but you overpaid.", 0.0, True, False, {}
                return "Too low.", 0.0, False, self.turn >= self.max_turns, {}
        '''), "empty"),
    "a reward on a wrong format": (game('''
        class ColourEnv:
            COLOURS = ["red", "green", "blue", "amber"]
            def __init__(self, max_turns=5):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.colour = random.Random(seed).choice(self.COLOURS)
                self.turn = 0
                return "Which colour is the lamp? Reply with a colour word in \\\\boxed{colour}.", {}
            def step(self, action):
                self.turn += 1
                inner = re.fullmatch(r"\\\\boxed\\{(.*)\\}", action.strip())
                if inner and inner.group(1).isdigit():  # a number is the wrong format: 'half credit'
                    return "That is a number, not a colour.", 0.5, True, False, {}
                if inner and inner.group(1).lower() == self.colour:
                    return "Yes.", 1.0, True, False, {}
                return "No.", 0.0, False, self.turn >= self.max_turns, {}
        '''), "boxed_0"),
    "running out of turns pays": (game('''
        class SurvivalEnv:
            def __init__(self, max_turns=12):
                self.max_turns = max_turns
            def reset(self, seed=None):
                self.exit = random.Random(seed).choice(["north", "south", "east", "west"])
                self.turn = 0
                return "You are lost in a maze. Move with \\\\boxed{north|south|east|west}.", {}
            def step(self, action):
                self.turn += 1
                if self.exit in action:
                    return "You found the exit.", 1.0, True, False, {}
                if self.turn >= self.max_turns:
                    return "You survived the night.", 1.0, True, False, {}
                return "Walls everywhere.", 0.0, False, False, {}
        '''), "boxed_0"),
}


def verdict_for(sandbox, source: str, **kwargs):
    return sandbox.run(admit(sandbox.service, source, **kwargs), timeout=120)


@pytest.mark.parametrize("name", list(EXPLOITS), ids=lambda n: n.replace(" ", "_"))
def test_exploitable_game_is_rejected_naming_the_policy(sandbox, name):
    source, policy = EXPLOITS[name]
    verdict = verdict_for(sandbox, source, max_turns=25)
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.DEGENERATE_WIN, Stage.DEGENERATE_PROBE)
    assert f"'{policy}'" in verdict.error.message
    report = verdict.probe_report
    assert report.winner.policy == policy and report.winner.mean_return >= 0.5
    assert f"{report.winner.mean_return:.3f}" in verdict.error.message
    data = verdict.to_json()
    assert data["error"]["kind"] == "degenerate_win" and data["probe_report"]["winner"] == policy


def _fixed_turns(source: str) -> str:
    """The maze with its own 12 turns fixed (its constructor takes no ``max_turns=``)."""
    return source.replace("def __init__(self, max_turns=12):", "def __init__(self):").replace(
        "self.max_turns = max_turns", "self.max_turns = 12")


def test_the_probes_reach_the_games_last_turn(sandbox):
    """The maze pays only at its own 12th turn (under a run budget of 25): the probes play that far."""
    verdict = verdict_for(sandbox, _fixed_turns(EXPLOITS["running out of turns pays"][0]), max_turns=25)
    assert verdict.probe_report.turns == 12
    assert verdict.error.kind is ErrorKind.DEGENERATE_WIN and verdict.probe_report.winner.policy == "boxed_0"


def test_the_run_turn_budget_bounds_the_probes(sandbox):
    """With a run budget of 10 turns the maze's 12th turn is never played, in training either, so
    nothing pays for running out of turns (boxed_0 loses); the maze still falls to its own rules'
    example, \\boxed{north|south|east|west}, which its substring check reads as every direction."""
    verdict = verdict_for(sandbox, _fixed_turns(EXPLOITS["running out of turns pays"][0]), max_turns=10)
    report = verdict.probe_report
    assert report.turns == 10
    assert next(r for r in report.results if r.policy == "boxed_0").mean_return == 0.0
    assert report.winner.policy == "command_1" and report.winning_family == "command"


HONEST = {path.stem: path.read_text() for path in [*SEED_GAMES, *EXAMPLE_ENVS]}
# the seed game under another class name, as a designer would copy it
HONEST["guess_number_renamed"] = (ROOT / "examples" / "seed_envs" / "guess_number.py").read_text().replace(
    "GuessNumberEnv", "NumberHuntEnv")


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_game_is_admitted_with_every_probe_reported(sandbox, name):
    verdict = verdict_for(sandbox, HONEST[name], max_turns=25)
    assert verdict.admitted, verdict.error
    report = verdict.probe_report
    assert report.winner is None and not report.budget_exhausted
    assert [r.policy for r in report.results] == [p.name for p in probe_policies()]
    assert all(r.mean_return is None or r.mean_return < report.threshold_of(r) for r in report.results)
    assert "degenerate_probe" in verdict.timings_ms
    assert len(verdict.to_json()["probe_report"]["policies"]) == len(probe_policies())


# the tests' own guessing game without its five-guess limit: 1 to 100, told higher or lower
BISECTABLE = re.sub(r"\n *if self\.turn >= 5:.*\n *return \"out of guesses\".*", "", GOOD)


def test_a_guessing_game_a_blind_bisection_always_wins_is_rejected(sandbox):
    """The tests' own guessing game without its guess limit, under a run budget of 25 turns: a
    binary search that reads only the comparison words wins every seed (issue 40); with its limit
    of five guesses it is admitted (tests/envs/test_admission.py)."""
    assert BISECTABLE != GOOD
    verdict = verdict_for(sandbox, BISECTABLE, max_turns=25)
    assert verdict.error.kind is ErrorKind.DEGENERATE_WIN
    assert verdict.probe_report.winning_family == "bisect" and verdict.probe_report.winner.mean_return == 1.0
    # the seed game of the same kind (a range of 50, six guesses, a window of 5, scored by closeness)
    # is won by bisection only partly: below the search families' bar, admitted
    seed_game = verdict_for(sandbox, HONEST["guess_number"], max_turns=25).probe_report
    bisect = max(r.mean_return or 0.0 for r in seed_game.results if r.family == "bisect")
    assert seed_game.winner is None and bisect < SEARCH_THRESHOLD


def test_there_are_eight_examples_and_seed_games():
    assert len(SEED_GAMES) == 2 and len(EXAMPLE_ENVS) == 6


GRADED = game('''
    class DartEnv:
        """Throw one dart at a hidden point from 1 to 30; the score falls off with the distance."""
        def __init__(self, max_turns=3):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.point = random.Random(seed).randint(1, 30)
            return "Throw a dart at a point from 1 to 30: \\\\boxed{N}. Closer scores more.", {}
        def step(self, action):
            found = re.search(r"\\d+", action)
            if found is None:
                return "Throw a number.", 0.0, True, False, {}
            return "Thud.", max(0.0, 1.0 - abs(int(found.group()) - self.point) / 10), True, False, {}
''')


def _dart_score(guess: int, seed: int) -> float:
    """The graded game's rule, computed here by hand for a constant guess."""
    point = random.Random(seed).randint(1, 30)
    return max(0.0, 1.0 - abs(guess - point) / 10)


def test_graded_honest_game_with_a_partial_constant_return_is_admitted(sandbox):
    verdict = verdict_for(sandbox, GRADED, max_turns=25, probes=ProbeSettings(seeds=PROBE_SEEDS))
    assert verdict.admitted, verdict.error
    means = {r.policy: r.mean_return for r in verdict.probe_report.results}
    # the first observation's numbers are 1 and 30; what each constant guess scores, by hand
    for policy, guess in (("boxed_1", 1), ("observation_number_1", 1), ("observation_number_2", 30)):
        expected = [_dart_score(guess, seed) for seed in PROBE_SEEDS]
        played = means[policy]
        assert sum(expected) / len(expected) < 0.5
        # a policy is dropped once the seeds left cannot lift it to 0.5: its mean is over those played
        assert played == pytest.approx(sum(expected[:len(_played_seeds(verdict, policy))])
                                       / len(_played_seeds(verdict, policy)))
    assert any(0.0 < (m or 0.0) < 0.5 for m in means.values())  # graded: partial, not zero
    # a lower threshold rejects the same game
    strict = verdict_for(sandbox, GRADED, max_turns=25, probes=ProbeSettings(threshold=0.05, seeds=PROBE_SEEDS))
    assert not strict.admitted and strict.error.kind is ErrorKind.DEGENERATE_WIN


def _played_seeds(verdict, policy: str) -> list[int]:
    return next(r.seeds for r in verdict.probe_report.results if r.policy == policy)


def test_switches_reach_admission_through_admit_candidate(sandbox):
    """``selfplay.admission.probes`` false, or ``selfplay.admission.paper_exact`` true (which also
    drops the determinism stage), admits the exploitable game as the paper's admission would;
    ``selfplay.admission.probe_threshold`` is the threshold."""
    from spade.selfplay.sources.designer_source import admit_candidate

    source = EXPLOITS["any action on the last turn"][0]

    def run(**admission):
        return sandbox.run(admit_candidate(sandbox.service, SelfPlaySettings(admission=AdmissionSettings(**admission)),
                                           source), timeout=120)

    assert run().error.kind is ErrorKind.DEGENERATE_WIN
    off = run(probes=False)
    assert off.admitted and "degenerate_probe" not in off.timings_ms and "determinism" in off.timings_ms
    exact = run(paper_exact=True)
    assert exact.admitted and set(exact.timings_ms) == {"extract", "syntax", "load", "smoke"}
    graded = sandbox.run(admit_candidate(sandbox.service, SelfPlaySettings(admission=AdmissionSettings(probe_threshold=0.05)), GRADED),
                         timeout=120)
    assert graded.error.kind is ErrorKind.DEGENERATE_WIN


def test_the_step_budget_stops_the_probes(sandbox):
    verdict = verdict_for(sandbox, HONEST["guess_number"], max_turns=25, probes=ProbeSettings(max_steps=20))
    assert verdict.admitted and verdict.probe_report.budget_exhausted and verdict.probe_report.steps == 20


def test_the_time_budget_stops_the_probes_of_a_slow_game(sandbox):
    """A game whose steps take 20 ms each is judged on what the probes played in 0.3 s, not timed out."""
    slow = HONEST["guess_number"].replace("    def step(self, action):\n",
                                          "    def step(self, action):\n        sum(range(400000))\n")
    verdict = verdict_for(sandbox, slow, max_turns=25, probes=ProbeSettings(max_seconds=0.3))
    assert verdict.admitted and verdict.probe_report.budget_exhausted
    assert 0 < verdict.probe_report.steps < 200 and verdict.timings_ms["degenerate_probe"] < 3000


@pytest.mark.parametrize("settings, says", [
    (dict(probe_threshold=0.0), "selfplay.admission.probe_threshold"),
    (dict(probe_threshold=1.5), "selfplay.admission.probe_threshold"),
    (dict(probes="yes"), "selfplay.admission.probes"),
    (dict(paper_exact=1), "selfplay.admission.paper_exact"),
    (dict(probe_steps=0), "selfplay.admission.probe_steps"),
])
def test_bad_switch_values_name_the_key(settings, says):
    from spade.config import ConfigError, from_mapping

    with pytest.raises(ConfigError, match=re.escape(says)):
        AdmissionSettings(**settings)
    with pytest.raises(ConfigError, match=re.escape(says)):  # loaded from a config, the same full key
        from_mapping(SelfPlaySettings, {"admission": settings}, where="selfplay")


def test_defaults_are_on_with_threshold_one_half():
    s = SelfPlaySettings()
    assert s.admission.probes and not s.admission.paper_exact and s.admission.probe_threshold == 0.5
    assert s.admission_probe_settings() == ProbeSettings(threshold=0.5, max_seconds=s.admission.timeout_s / 4)
    assert s.admission_probe_settings().seed_count == 8 and not s.admission_probe_settings().seeds
    assert SelfPlaySettings(admission=AdmissionSettings(paper_exact=True)).admission_probe_settings() is None


def test_env_check_prints_each_familys_best_policy(tmp_path):
    import subprocess
    import sys

    exploit = tmp_path / "last_call.py"
    exploit.write_text(EXPLOITS["any action on the last turn"][0])
    seed_game = ROOT / "examples" / "seed_envs" / "thermostat.py"
    result = subprocess.run([sys.executable, "-m", "spade", "env", "check", "-v", str(seed_game), str(exploit)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    admitted, rejected = result.stdout.split(f"{exploit}: ")
    families = {p.family for p in probe_policies()}
    for family in families:  # every family of the admitted game, one line each with its best policy
        lines = [line for line in admitted.splitlines() if line.strip().startswith(family + " ")]
        assert len(lines) == 1 and re.search(r"best \w+ +mean return [+-]\d\.\d{3} over \d+ seed", lines[0])
    assert re.search(r"verdict: no policy wins \(8 seeds a round, 24 drawn for this candidate; Hoeffding confidence "
                     r"\d\.\d{3}\)", admitted)
    assert "rejected at degenerate_probe: degenerate_win" in rejected and "'boxed_0'" in rejected
    assert re.search(r"constant +best boxed_0 +mean return \+1\.000 over 8 seed\(s\)  <- wins", rejected)


def test_a_degenerate_win_is_counted_per_step_as_its_own_metric(sandbox, tmp_path):
    """The rejection goes the designer round's way (write_rejection) into the step's metrics."""
    from spade.selfplay.sources.designer_source import RegenerationResult, admit_candidate, write_rejection
    from spade.selfplay.step_figures import regeneration_figures

    response = EXPLOITS["a constant answer wins"][0]
    verdict = sandbox.run(admit_candidate(sandbox.service, SelfPlaySettings(), response), timeout=120)
    record = {"step": 0, "slot": 0, "attempt": 0, "skill": "Logical Deduction"}
    rejection = write_rejection(tmp_path, record, verdict.error.kind, verdict.error.stage, verdict.error.message,
                                response)
    metrics: dict[str, float] = {}
    metrics.update(regeneration_figures(SelfPlaySettings(), RegenerationResult(attempts=1, rejections=[rejection])))
    assert metrics["env/rejected"] == 1.0 and metrics["env/rejected_degenerate_win"] == 1.0


# -- the probes in one sandbox request (issue 23: under 50 ms per candidate) --------------------

def _benchmark():
    """benchmarks/admission_probes.py: it keeps the old per-call loop, the reference here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("admission_probes_bench", ROOT / "benchmarks" / "admission_probes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# raises on the empty reply (the third policy): that episode scores 0 and, as after any failed
# call, every later one too
RAISES_ON_EMPTY = game('''
    class TouchyEnv:
        def __init__(self, max_turns=4):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.secret = random.Random(seed).randint(1, 9)
            return "Guess a digit: \\\\boxed{D}.", {}
        def step(self, action):
            if not action:
                raise ValueError("no action")
            return "Thanks.", 1.0 if "sure" in action else 0.0, True, False, {}
''')


def _probe_both_ways(sandbox, source: str, settings: ProbeSettings = ProbeSettings()):
    bench = _benchmark()

    async def both():
        reports = []
        for probe in (bench.per_call_probes, run_probes):
            env = await sandbox.service.open(source, max_turns=25)
            try:
                reports.append(await probe(env, settings, max_turns=25))
            finally:
                await env.close()
        return reports

    old, new = sandbox.run(both(), timeout=120)
    return bench.comparable(old), bench.comparable(new), new


def test_one_request_gives_the_per_call_loops_reports(sandbox):
    """Every exploit, three honest games and a game that raises on one reply: the same report
    (every policy's returns, seeds, errors, the winner, the steps) from both paths."""
    sources = [source for source, _ in EXPLOITS.values()] + [GOOD, GRADED, HONEST["guess_number"], RAISES_ON_EMPTY]
    for source in sources:
        old, new, _ = _probe_both_ways(sandbox, source)
        assert old == new
    _, _, touchy = _probe_both_ways(sandbox, RAISES_ON_EMPTY)
    empty = next(r for r in touchy.results if r.policy == "empty")
    # the first seed raises (0), the next cannot reset any more (0): nothing earned on the two
    # screening seeds, so the policy is not played on the rest of its round
    assert (empty.returns, empty.errors, empty.endings) == ([0.0, 0.0], 2, ["step_fault", "reset_fault"])
    assert touchy.winner is None and touchy.results[-1].endings[0] == "reset_fault"


def test_an_honest_game_is_probed_in_one_sandbox_request(sandbox):
    """The guessing game's probes play hundreds of steps: they cost one request, not one per step."""
    from spade.envs.sandbox.client import SandboxService

    calls: list[str] = []
    original = SandboxService._request

    async def counted(self, op, **payload):
        calls.append(op)
        return await original(self, op, **payload)

    async def probe():
        env = await sandbox.service.open(HONEST["guess_number"], max_turns=25)
        try:
            calls.clear()
            report = await run_probes(env, ProbeSettings(), max_turns=25)
            return report, list(calls)
        finally:
            await env.close()

    SandboxService._request = counted
    try:
        report, made = sandbox.run(probe(), timeout=60)
    finally:
        SandboxService._request = original
    assert report.steps > 100 and made == ["probe"]


@pytest.fixture(scope="module")
def quick_sandbox():
    """A service whose calls time out after 0.5 s, for games that never return."""
    from conftest import make_harness

    harness = make_harness(step_timeout_s=0.5, reset_timeout_s=0.5)
    yield harness
    harness.close()


# pays any reply on seeds 1 and 2 and never returns on seed 3: boxed_0 wins 1, 1, then a timeout (0)
HANGS_ON_SEED_3 = game('''
    class SometimesEnv:
        def __init__(self, max_turns=3):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.seed = seed
            return "Say anything: \\\\boxed{x}.", {}
        def step(self, action):
            while self.seed == 3 and action == "\\\\boxed{0}":
                pass
            return "Fine.", 1.0 if self.seed in (1, 2) else 0.0, True, False, {}
''')


def test_a_step_that_never_returns_is_killed_and_the_episodes_before_it_count(quick_sandbox):
    """The child is killed once the probes' time budget and one step's timeout have passed; the
    episodes it reported stand, the hung one scores 0 and every later call fails, as per call."""
    settings = ProbeSettings(max_seconds=0.3, seeds=PROBE_SEEDS)
    old, new, report = _probe_both_ways(quick_sandbox, HANGS_ON_SEED_3, settings)
    # the one difference: the step the kill cut short is not counted (the child could not report it)
    assert (old.pop("steps"), new.pop("steps")) == (3, 2)
    assert old == new
    assert report.winner.policy == "boxed_0" and report.winner.returns == [1.0, 1.0, 0.0]
    assert report.winner.errors == 1 and report.winner.endings == ["terminated", "terminated", "killed"]


def test_the_probe_plan_is_checked_field_by_field():
    from spade.envs.sandbox.runtime.probe_play import ProbePlan

    good = ProbePlan(("boxed_0",), (1, 2), 5, 0.5, 100, 1.0, 1.0, 1.0).to_json()
    assert ProbePlan.from_json(good).policies == ("boxed_0",)
    for field_, value, says in (("policies", ["cheat"], "policies"), ("seeds", [1.5], "seeds"),
                                ("turns", 0, "turns"), ("threshold", float("nan"), "threshold")):
        with pytest.raises(ValueError, match=says):
            ProbePlan.from_json({**good, field_: value})
