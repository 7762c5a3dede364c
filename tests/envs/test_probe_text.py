"""What the probe policies read in an observation (issue 40, ``runtime/probe_text.py``), each
reader against values worked out by hand from the text."""

from __future__ import annotations

import random

from spade.envs.sandbox.runtime import probe_text as text
from spade.envs.sandbox.runtime.probe_family import ProbeView, probe_policies, threshold_for


def test_numbers_words_quoted_and_tokens():
    shown = 'Sensor 12 reads 7.5, then 12 again. The keeper says "amber lantern"; key `KX-4471` or node_3.'
    assert text.numbers(shown) == ("12", "7.5", "-4471", "3")
    assert text.words(shown)[:4] == ("Sensor", "reads", "keeper", "says")  # "then", "again", "The": common
    assert text.quoted(shown) == ("amber lantern", "KX-4471")
    assert text.code_tokens(shown) == ("KX-4471", "node_3")


def test_options_by_line_and_inline():
    assert text.options("Pick one:\nA) red\nB) green\n(C) blue\n") == ("red", "green", "blue")
    assert text.options("- oak\n- elm\n") == ("oak", "elm")
    assert text.options("Choices: copper, zinc or tin. Reply.") == ("copper", "zinc", "tin")
    assert text.options("No list here.") == ()


def test_commands_are_the_rules_examples_then_named_words():
    rules = "Move with \\boxed{go north} or \\boxed{<action>}; say done when finished, or ask for a hint."
    # the boxed examples (placeholders left out), then the command words in the order the text names them
    assert text.commands(rules) == ("go north", "go", "done", "ask", "hint")


def test_a_stated_range_and_comparison_words():
    assert text.number_range("a number between 1 and 100") == (1, 100)
    assert text.number_range("from 0 to 50 inclusive") == (0, 50)
    assert text.number_range("somewhere in [40, 140]") == (40, 140)
    assert text.number_range("only 3 left") is None
    assert text.direction("Too low! Try again.") == text.UP
    assert text.direction("too high, and higher than before") == text.DOWN  # "too" phrases first
    assert text.direction("The manuscript is older than that.") == text.DOWN
    assert text.direction("Your estimate is higher than the scale.", about_guess=True) == text.DOWN
    assert text.direction("Nothing to compare.") is None


def _play(policy_name: str, observations: list[str]) -> list[str]:
    """The replies a policy gives when the game answers with ``observations`` in turn."""
    policy = next(p for p in probe_policies() if p.name == policy_name)
    seen, replies, memory = [observations[0]], [], {}
    for following in observations[1:] + [""]:
        view = ProbeView(seen[0], seen[-1], replies[-1] if replies else None, random.Random(0), tuple(seen),
                         tuple(replies), memory)
        replies.append(policy.act(view))
        seen.append(following)
    return replies[:len(observations)]


def test_policies_read_the_latest_observation():
    # the first new number after a wrong answer is the correction's
    assert _play("copy_new_number", ["Sum 4 and 5.", "No: the sum is 9."]) == ["\\boxed{4}", "\\boxed{9}"]
    # bisection over 1-100 steered by "higher"/"lower" said of the secret: 50, then 75, then 62
    assert _play("bisect_secret", ["Guess between 1 and 100.", "higher", "lower"]) == [
        "\\boxed{50}", "\\boxed{75}", "\\boxed{62}"]
    # ask for the hint word the rules name, then copy what it printed
    assert _play("help_then_number", ["Commands: status, set N.", "Panel: rated 480."]) == [
        "\\boxed{status}", "\\boxed{480}"]
    assert _play("pair_first", ["Ping from (3, 14)."]) == ["\\boxed{3 14}"]
    assert _play("scan_range", ["A station between 40 and 140.", "static", "static"]) == [
        "\\boxed{40}", "\\boxed{41}", "\\boxed{42}"]


def test_the_search_family_needs_more_than_the_threshold():
    bisect = next(p for p in probe_policies() if p.family == "bisect")
    constant = next(p for p in probe_policies() if p.family == "constant")
    assert threshold_for(bisect, 0.5) == 0.9 and threshold_for(constant, 0.5) == 0.5
    names = [p.name for p in probe_policies()]
    assert len(names) == len(set(names))


def test_command_templates_and_how_they_are_filled():
    rules = ("Use \\boxed{guess N}, \\boxed{try NNN}, \\boxed{key VALUE}, \\boxed{open <door>}, \\boxed{dial D N} "
             "or \\boxed{N}.")
    assert text.templates(rules) == ("guess N", "try NNN", "key VALUE", "open <door>", "dial D N")
    assert text.fill("dial D N", ("3", "7"), ("x",)) == "dial 3 7"
    assert text.fill("key VALUE", ("12",), ("KX-1",)) == "key KX-1"  # a text placeholder takes text first
    assert text.fill("try NNN", ("0", "737"), ()) == "try 737"  # NNN: the value with three digits
    assert text.fill("try NNN", (), ()) == "try 111" and text.fill("open <door>", (), ()) == "open a"
    # a wrong try prints the log line; the template is filled with what it showed first
    assert _play("copy_into_template", ["Test with \\boxed{try NNN}.", "0 right. [log: set to 737]"]) == [
        "\\boxed{try 111}", "\\boxed{try 737}"]
