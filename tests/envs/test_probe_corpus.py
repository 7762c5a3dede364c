"""Issue 40: the probe families generalise to exploits written the way designer reward bugs look.

``tests/fixtures/probe_corpus/exploit`` holds games of this project's own writing, each with a
real goal and partial feedback but a trick that pays (a hint that prints the code, a correction
that prints the answer, an option letter fixed before the shuffle, a check that the answer is
somewhere in the reply, coordinates in the first ping, a bare command word, a secret a scan or a
bisection reaches, ...), or a game no one can win; the ``expected:`` line of each docstring names
the probe family that must win it (or ``unwinnable``). ``honest`` holds tricky honest games
(partial rewards, one-digit answers, long budgets, rare random wins, a search too tight to be
sure, a properly shuffled quiz, ...): all admitted, with every probe below its threshold. The
property test plays generated honest games in-process through the same loop.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from spade.agent.actions import parse_action
from spade.envs.admission import admit
from spade.envs.degenerate_probes import ProbeSettings, derive_probe_seeds, probe_plan, report_of
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.sandbox.runtime.probe_play import play
from spade.envs.winnability import WinnabilitySettings

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "probe_corpus"
EXPLOITS = sorted((CORPUS / "exploit").glob("*.py"))
HONEST = sorted((CORPUS / "honest").glob("*.py"))
ROOT = Path(__file__).resolve().parents[2]
KEPT = [*sorted((ROOT / "examples" / "envs").glob("*.py")), *sorted((ROOT / "examples" / "seed_envs").glob("*.py"))]


def expected(path: Path) -> str:
    found = re.search(r"^expected: (\w+)$", path.read_text(), re.MULTILINE)
    assert found, f"{path.name} names no expected family"
    return found.group(1)


def verdict_for(sandbox, path: Path, seed_base: int = 0):
    return sandbox.run(admit(sandbox.service, path.read_text(), max_turns=25,
                             probes=ProbeSettings(seed_base=seed_base), winnability=WinnabilitySettings()),
                       timeout=120)


def test_the_corpora_are_big_enough():
    assert len(EXPLOITS) >= 20 and len(HONEST) >= 10
    families = {expected(path) for path in EXPLOITS}
    assert families >= {"copy", "option", "list", "echo", "pairs", "command", "scan", "bisect", "macro",
                        "unwinnable"}


@pytest.mark.parametrize("path", EXPLOITS, ids=lambda p: p.stem)
def test_every_exploit_is_rejected_naming_its_family(sandbox, path):
    verdict = verdict_for(sandbox, path)
    assert not verdict.admitted
    family = expected(path)
    if family == "unwinnable":
        assert verdict.error.kind is ErrorKind.UNWINNABLE and verdict.error.stage is Stage.WINNABILITY
        assert verdict.probe_report.winner is None and verdict.winnability_report.verdict == "lost"
        return
    assert verdict.error.kind is ErrorKind.DEGENERATE_WIN, verdict.error
    assert verdict.probe_report.winning_family == family, verdict.error.message
    assert f"of family '{family}'" in verdict.error.message
    winner = verdict.probe_report.winner
    # Hoeffding over the seeds played: a clean sweep of eight seeds is a sure verdict
    assert verdict.probe_report.confidence() > (0.9 if winner.mean_return == 1.0 else 0.5)


@pytest.mark.parametrize("path", HONEST + KEPT, ids=lambda p: p.stem)
def test_every_honest_game_is_admitted(sandbox, path):
    verdict = verdict_for(sandbox, path)
    assert verdict.admitted, verdict.error
    report = verdict.probe_report
    assert report.winner is None and not report.budget_exhausted
    assert all(r.mean_return is None or r.mean_return < report.threshold_of(r) for r in report.results)
    assert verdict.winnability_report.verdict in ("won", "unproven")


def test_the_seeds_are_drawn_per_candidate_and_per_run():
    a = derive_probe_seeds(1, "class A: pass", 8)
    assert a == derive_probe_seeds(1, "class A: pass", 8) and len(set(a)) == 8
    assert a != derive_probe_seeds(2, "class A: pass", 8) and a != derive_probe_seeds(1, "class B: pass", 8)
    settings = ProbeSettings(seed_base=7).for_candidate("code")
    assert len(settings.seeds) == 24 and settings.round_seeds == 8 and settings.first_round == settings.seeds[:8]


# -- the false-rejection property --------------------------------------------------------------

class _GeneratedGame:
    """An honest game drawn from ``spec``: a secret (a number in a range, a word of a list, a sum of
    shown numbers, or one of 4-8 listed options with a single try), a budget of tries, and feedback
    that never states the secret ("wrong", how many letters are right, or warmer/colder between
    guesses)."""

    WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heath", "inlet", "karst", "larch"]

    def __init__(self, spec: random.Random, max_turns: int):
        self.kind = spec.choice(["number", "word", "sum", "choice"])
        self.tries = spec.randint(1, 6) if self.kind != "choice" else 1
        self.span = spec.choice([50, 100, 1000]) if self.kind != "choice" else spec.randint(4, 8)
        self.max_turns = max_turns

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.turn, self.last = 0, None
        if self.kind == "number":
            self.secret = str(rng.randint(1, self.span))
            return f"Find my number from 1 to {self.span} in {self.tries} tries; reply \\boxed{{N}}."
        if self.kind == "word":
            self.secret = rng.choice(self.WORDS)
            return f"Guess my five-letter tree-or-landform word in {self.tries} tries; you learn letters in place."
        if self.kind == "choice":  # one try among span options, one of them right: luck wins 1/span
            letters = "ABCDEFGH"[:self.span]
            self.secret = rng.choice(letters).lower()
            listed = "\n".join(f"{letter}) reading {rng.randint(10, 99)}" for letter in letters)
            return f"Which reading is the calibrated one?\n{listed}\nAnswer with one letter as \\boxed{{X}}."
        values = [rng.randint(10, 99) for _ in range(rng.randint(3, 6))]
        self.secret = str(sum(values) * 3 % 97)
        return f"Take the sum of {' '.join(map(str, values))}, triple it, and give the remainder by 97."

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        self.turn += 1
        found = re.search(r"\\boxed\{\s*([^{}]*?)\s*\}", action)
        guess = (found.group(1) if found else action).strip().lower()
        if guess == self.secret:
            return "Yes.", 1.0, True, False
        if self.turn >= self.tries:
            return "Out of tries.", 0.0, True, False
        if self.kind == "word":
            right = sum(a == b for a, b in zip(guess, self.secret))
            return f"{right} letters in place.", 0.0, False, self.turn >= self.max_turns
        if self.kind == "choice":
            return "Wrong.", 0.0, True, False
        if self.kind == "number" and guess.isdigit():
            closer = self.last is not None and abs(int(guess) - int(self.secret)) < abs(self.last - int(self.secret))
            self.last = int(guess)
            return ("Warmer." if closer else "Colder."), 0.0, False, self.turn >= self.max_turns
        return "Wrong.", 0.0, False, self.turn >= self.max_turns


def test_generated_honest_games_are_falsely_rejected_under_one_percent():
    """400 generated honest games, each on its own drawn seeds: fewer than 1% rejected. A constant
    reply wins a four-option one-try question one seed in four, so eight seeds alone reach the 0.5
    threshold one time in nine for some letter: the confirmation rounds keep that luck out."""
    spec = random.Random(40)
    rejected = []
    for index in range(400):
        max_turns = spec.randint(3, 25)
        game = _GeneratedGame(spec, max_turns)
        settings = ProbeSettings(seed_base=index).for_candidate(f"game {index}")
        plan = probe_plan(settings, max_turns)
        report = report_of(play(plan, game.reset, game.step, parse_action), settings.threshold, max_turns,
                           settings.seeds)
        if report.winner is not None:
            rejected.append((index, game.kind, game.tries, game.span, report.winner.policy, report.winner.returns))
    assert len(rejected) < 4, rejected


def test_rejections_are_counted_per_family_as_step_metrics(sandbox):
    """What the designer round reports after a regeneration (DesignerRound.metrics): each games
    family's degenerate_win rejections (0 for the families that won nothing) and the unwinnable ones."""
    from spade.selfplay.sources.designer_source import GateCounts, admit_candidate
    from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings

    settings = SelfPlaySettings(admission=AdmissionSettings(winnability_gate=True), max_turns=25)
    counts = GateCounts(settings)
    for name in ("correction_prints_answer", "debug_quote_later", "quiz_always_a", "never_terminates"):
        source = (CORPUS / "exploit" / f"{name}.py").read_text()
        counts.note(sandbox.run(admit_candidate(sandbox.service, settings, source, run_seed=3), timeout=120))
    metrics = counts.metrics()
    assert metrics["env/rejected_degenerate_win_copy"] == 2.0 and metrics["env/rejected_degenerate_win_option"] == 1.0
    assert metrics["env/rejected_degenerate_win_bisect"] == 0.0 and metrics["env/rejected_unwinnable"] == 1.0
    off = GateCounts(SelfPlaySettings(admission=AdmissionSettings(paper_exact=True)))
    assert off.metrics() == {} and GateCounts(None).metrics() == {}


class _GeneratedLeak:
    """An exploitable game drawn from ``spec``: a secret (a number, a word or a code) that some
    channel prints (the first observation, the correction after a wrong answer, a hint command the
    rules name, a status line with the secret quoted), read back bare or inside the rules' command
    template, with a turn budget of at least four."""

    WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heath", "inlet", "karst", "larch"]

    def __init__(self, spec: random.Random, max_turns: int):
        self.kind = spec.choice(["number", "word", "code"])
        self.channel = spec.choice(["first", "correction", "hint", "status"])
        self.template = spec.choice([None, "submit", "answer", "guess"])
        self.help_word = spec.choice(["hint", "clue", "status", "reveal"])
        self.max_turns = max_turns

    def _secret(self, rng: random.Random) -> str:
        if self.kind == "number":
            return str(rng.randint(100, 9999))
        if self.kind == "word":
            return rng.choice(self.WORDS)
        return f"{rng.choice('QXZ')}{rng.choice('RTV')}-{rng.randint(10, 99)}"

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.secret, self.turn = self._secret(rng), 0
        placeholder = "N" if self.kind == "number" else "WORD"
        how = f"\\boxed{{{self.template} {placeholder}}}" if self.template else "\\boxed{...}"
        rules = f"Find the hidden {self.kind}. Answer with {how}."
        if self.channel == "hint":
            rules += f" You may ask for a {self.help_word} with \\boxed{{{self.help_word}}}."
        if self.channel == "first":
            rules += f" (archive tag: {self.secret})"
        return rules

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        self.turn += 1
        found = re.search(r"\\boxed\{\s*([^{}]*?)\s*\}", action)
        said = (found.group(1) if found else action).strip()
        if self.channel == "hint" and said.lower() == self.help_word:
            return f"The {self.help_word}: it is {self.secret}.", 0.0, False, self.turn >= self.max_turns
        answer = said[len(self.template):].strip() if self.template and said.lower().startswith(self.template) else (
            None if self.template else said)
        if answer is not None and answer.lower() == self.secret.lower():
            return "Correct.", 1.0, True, False
        if self.channel == "correction":
            return f"No. The right answer was {self.secret}; try again.", 0.0, False, self.turn >= self.max_turns
        if self.channel == "status":
            return f"Wrong. [status: target='{self.secret}']", 0.0, False, self.turn >= self.max_turns
        return "Wrong.", 0.0, False, self.turn >= self.max_turns


def test_generated_leaky_games_are_rejected():
    """300 generated games that print their secret somewhere (four channels, three secret kinds,
    bare or templated answers, 4-25 turns), each on its own drawn seeds: every one rejected, so the
    families catch the kinds of leak, not the corpus's particular games."""
    spec = random.Random(41)
    missed = []
    for index in range(300):
        max_turns = spec.randint(4, 25)
        game = _GeneratedLeak(spec, max_turns)
        settings = ProbeSettings(seed_base=index).for_candidate(f"leak {index}")
        report = report_of(play(probe_plan(settings, max_turns), game.reset, game.step, parse_action),
                           settings.threshold, max_turns, settings.seeds)
        if report.winner is None:
            missed.append((index, game.kind, game.channel, game.template, game.help_word, max_turns))
    assert not missed, missed


def test_after_the_fact_probes_draw_the_runs_own_seeds():
    """spade analyze --probe plays each saved environment on the seeds its run's admission drew:
    the run's seed and seeds a round from its config, the environment's code."""
    from spade.analysis.degenerate_share import probe_settings

    settings = probe_settings({"run": {"seed": 1234}, "selfplay": {"admission": {"probe_seeds": 6}}})
    assert (settings.seed_base, settings.seed_count) == (1234, 6)
    # a run written before the admission section: its flat key
    assert probe_settings({"selfplay": {"degenerate_probe_seeds": 5}}).seed_count == 5
    admitted = ProbeSettings(seed_base=1234, seed_count=6).for_candidate("code")
    assert settings.for_candidate("code").seeds == admitted.seeds
    assert probe_settings({}).seed_base == 0 and probe_settings({"run": {"seed": True}}).seed_base == 0
