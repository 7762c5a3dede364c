"""``eval.protocol``: spade's own settings (default) and the two released evaluation configurations
(in_loop, offline) for AIME, GPQA-Diamond, LiveCodeBench and Reasoning-Gym hard: the sampling each
protocol sends, the extraction and score each gives a hand-written reply, and `spade eval report`
naming the protocol of a table."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from spade.eval.in_loop import EvalSettings
from spade.eval.protocol import PROTOCOLS, check_protocol
from spade.eval.rg_released import BOXED_SUFFIX, POOL_SEED, POOL_SIZE, episode_indices, released_answer
from spade.eval.runner import EvalError, run_suite
from spade.eval.suites import BenchmarkOptions, build_benchmarks
from spade.eval.types import ItemRecord

from test_eval_protocol import _sent

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"
ROOT = Path(__file__).resolve().parents[2]


def _score(bench, item, reply):
    return asyncio.run(bench.score(item, reply))


def _sampling(name, protocol):
    (bench,) = build_benchmarks([name], BenchmarkOptions(protocol=protocol, data_dir=FIXTURES))
    s = bench.sampling
    return (s.n, s.temperature, s.top_p, s.top_k, s.max_new_tokens)


# --- the key ----------------------------------------------------------------------------------------

def test_protocol_errors_name_the_key_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"eval\.protocol must be one of spade, in_loop, offline, got 'paper'"):
        EvalSettings(protocol="paper")
    with pytest.raises(ValueError, match="--protocol must be one of spade, in_loop, offline"):
        check_protocol("inloop", "--protocol")
    assert EvalSettings().protocol == "spade" and BenchmarkOptions().protocol == "spade"


def test_unknown_protocol_on_the_command_line_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "spade", "eval", "--model", "x", "--protocol", "paper"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0
    assert "--protocol must be one of spade, in_loop, offline, got 'paper'" in done.stderr


# --- sampling each protocol passes -------------------------------------------------------------------

@pytest.mark.parametrize("name, protocol, expected", [
    # eval_configs/eval_aime_avg32.yaml:3-7 / eval_offline/configs/games.yaml:5-9
    ("aime25", "spade", (32, 0.7, 0.8, 20, 32768)),
    ("aime25", "in_loop", (32, 0.7, 0.8, 20, 32768)),
    ("aime25", "offline", (64, 1.0, 0.95, 20, 32768)),
    # gem_eval_inloop.yaml:10 (396 episodes = 2 x 198) + gem_evaluator.py:296-297 / games.yaml:13-16
    ("gpqa_diamond", "spade", (2, 0.7, 0.8, 20, 16384)),
    ("gpqa_diamond", "in_loop", (2, 0.7, 0.8, 20, 16384)),
    ("gpqa_diamond", "offline", (8, 0.7, 0.95, None, 32768)),
    # gem_eval_inloop.yaml:9 + gem_evaluator.py:296-297 / games.yaml:21-24
    ("lcb_v6", "spade", (1, 0.7, 0.8, 20, 16384)),
    ("lcb_v6", "in_loop", (1, 0.7, 0.8, 20, 16384)),
    ("lcb_v6", "offline", (1, 0.2, 0.95, None, 16384)),
    # gem_eval_inloop.yaml:3-6 / _games_gem.yaml:12-15, both with gem_evaluator.py:296-297
    ("rg_logic", "spade", (1, 0.6, 0.8, 20, 8192)),
    ("rg_logic", "in_loop", (1, 0.6, 0.8, 20, 8192)),
    ("rg_logic", "offline", (1, 0.6, 0.8, 20, 8192)),
])
def test_each_protocol_sets_the_released_sampling(name, protocol, expected):
    assert _sampling(name, protocol) == expected


def test_overrides_apply_on_top_of_the_protocol():
    (bench,) = build_benchmarks(["aime25"], BenchmarkOptions(protocol="offline", n=2, max_new_tokens=64))
    assert (bench.sampling.n, bench.sampling.temperature, bench.sampling.max_new_tokens) == (2, 1.0, 64)


@pytest.mark.parametrize("protocol, episodes", [("spade", 4), ("in_loop", 4), ("offline", 8)])
def test_reasoning_gym_episodes_per_protocol(protocol, episodes):
    (bench,) = build_benchmarks(["rg_math"], BenchmarkOptions(protocol=protocol))
    assert bench.episodes == episodes
    (bench,) = build_benchmarks(["rg_math"], BenchmarkOptions(protocol=protocol, rg_episodes=2))
    assert bench.episodes == 2


def test_offline_aime_sends_its_sampling_to_the_engine():
    (bench,) = build_benchmarks(["aime25"], BenchmarkOptions(protocol="offline", data_dir=FIXTURES))
    _, sent, requests = _sent(bench)
    assert sent == (1.0, 0.95, 20, 32768) and requests == 3 * 64


# --- Reasoning-Gym: prompt, items, extraction, score ------------------------------------------------

def _rg(protocol):
    pytest.importorskip("reasoning_gym")
    (bench,) = build_benchmarks(["rg_math"], BenchmarkOptions(protocol=protocol,
                                                              rg_tasks={"math": ["basic_arithmetic"]}))
    items = bench.load(seed=0, limit=1)
    assert len(items) == 1
    return bench, items[0]


def _gold(bench, item):
    return str(bench._loaded[item.group].entries[item.reference]["answer"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reasoning_gym_prompt_suffix(protocol):
    bench, item = _rg(protocol)
    prompt = item.messages[0]["content"]
    assert prompt.startswith("Given a problem, your task is to answer the question")
    assert "<answer>answer here</answer>" in prompt
    # the released environment appends the boxed instruction to the question
    assert (BOXED_SUFFIX + "\n" in prompt) == (protocol != "spade")


@pytest.mark.parametrize("protocol", ["in_loop", "offline"])
def test_reasoning_gym_released_items_come_from_the_seed_42_pool(protocol):
    import reasoning_gym

    bench, item = _rg(protocol)
    (index,) = episode_indices("basic_arithmetic", 0, 1)
    assert item.reference == index and item.item_id == f"basic_arithmetic/0:{index}"
    params = bench._loaded["basic_arithmetic"].dataset.config
    pool = reasoning_gym.create_dataset("basic_arithmetic", seed=POOL_SEED, size=POOL_SIZE,
                                        **{k: getattr(params, k) for k in ("min_terms", "max_terms",
                                                                           "min_digits", "max_digits")})
    assert pool[index]["question"] in item.messages[0]["content"]


@pytest.mark.parametrize("protocol, expected", [
    # reply form:          <answer>   only \boxed{}  <ANSWER> (caps)  both (answer tag wins)  neither
    ("spade", (1.0, 0.0, 0.0, 1.0, 0.0)),
    ("in_loop", (1.0, 1.0, 1.0, 1.0, 0.0)),
    ("offline", (1.0, 1.0, 1.0, 1.0, 0.0)),
])
def test_reasoning_gym_extraction_and_score_per_protocol(protocol, expected):
    bench, item = _rg(protocol)
    gold = _gold(bench, item)
    replies = [f"Adding up.\n<answer>{gold}</answer>",
               f"Adding up, the result is \\boxed{{{gold}}}.",
               f"Adding up.\n<ANSWER> {gold} </ANSWER>",
               f"\\boxed{{0}} ... <answer>{gold}</answer>",
               f"The result is {gold}."]
    records = [_score(bench, item, reply) for reply in replies]
    assert tuple(r.score for r in records) == expected
    assert records[4].answer is None
    if protocol != "spade":
        assert [r.detail["answer_from"] for r in records] == ["answer_tag", "boxed", "answer_tag", "answer_tag",
                                                              "none"]
        assert records[1].answer == gold


def test_released_boxed_fallback_reads_as_gem_does():
    assert released_answer("x \\boxed{a{b}c} y") == ("a{b}c", "boxed")
    assert released_answer("\\boxed {7}") == (None, "none")  # the last \boxed must open a brace directly
    assert released_answer("\\fbox{7}") == (None, "none")
    assert released_answer("\\boxed{1} then \\boxed{2") == (None, "none")  # the last box never closes
    assert released_answer("<Answer>\n 5 \n</answer> \\boxed{6}") == ("5", "answer_tag")


class _RaisingDataset:
    def score_answer(self, answer, entry):
        raise ValueError("not a number")


def test_released_protocol_leaves_a_raising_scorer_out_spade_counts_it_a_loss():
    pytest.importorskip("reasoning_gym")
    for protocol, samples, score in (("in_loop", 1, 100.0), ("spade", 2, 50.0)):
        bench, item = _rg(protocol)
        gold = _gold(bench, item)
        good = _score(bench, item, f"<answer>{gold}</answer>")
        bench._loaded[item.group].dataset = _RaisingDataset()
        bad = _score(bench, item, "<answer>x</answer>")
        assert bad.score == 0.0 and "scorer_error" in bad.detail
        result = bench.summarize([ItemRecord(item.item_id, item.group, (good, bad), 0)])
        assert (result.samples, result.score) == (samples, score)
        assert ("excluded" in result.notes) == (protocol == "in_loop")


# --- AIME -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol, nested_box, flat_box", [
    ("spade", True, True), ("in_loop", True, True),
    ("offline", False, True),  # the offline suite's box regex takes no braces inside
])
def test_aime_extraction_and_score_per_protocol(protocol, nested_box, flat_box):
    (bench,) = build_benchmarks(["aime25"], BenchmarkOptions(protocol=protocol, data_dir=FIXTURES))
    item = bench.load(seed=0)[0]  # gold 42
    assert item.messages[0]["content"].endswith(
        "\nPlease reason step by step, and put your final answer within \\boxed{}.")
    nested = _score(bench, item, "So it is \\boxed{\\text{42}}.")
    flat = _score(bench, item, "So it is \\boxed{42}.")
    assert (nested.correct, flat.correct) == (nested_box, flat_box)
    assert _score(bench, item, "So it is 42.").answer is None


# --- GPQA-Diamond (invented fixture items) ----------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_gpqa_prompt_order_and_extraction_per_protocol(protocol):
    (bench,) = build_benchmarks(["gpqa_diamond"], BenchmarkOptions(protocol=protocol, data_dir=FIXTURES))
    items = bench.load(seed=0)
    first = items[0]
    prompt = first.messages[0]["content"]
    gold = first.reference
    wrong = next(letter for letter in "ABCD" if letter != gold)
    phrase = _score(bench, first, f"Thinking it over, the answer is {gold}.")
    boxed = _score(bench, first, f"So \\boxed{{{gold}}}")
    wrapped = _score(bench, first, f"So \\boxed{{\\text{{{gold}}}}}")
    last_box = _score(bench, first, f"\\boxed{{{gold}}} or rather \\boxed{{{wrong}}}")
    assert boxed.correct and not last_box.correct
    if protocol == "offline":
        assert "\nA. " in prompt and "\\boxed{LETTER} where LETTER is one of ABCD" in prompt
        # one Random(42) shuffles every row in turn
        rng = random.Random(42)
        for item in items:
            order = list(range(4))
            rng.shuffle(order)
            assert item.reference == "ABCD"[order.index(0)]
        assert phrase.correct and not wrapped.correct
    else:
        assert "\nA: " in prompt and "Please only provide the letter of the answer in the box." in prompt
        assert not phrase.correct and wrapped.correct


# --- LiveCodeBench ----------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol, problem_set, layout", [
    ("spade", "v6", "in_loop"), ("in_loop", "v6", "in_loop"), ("offline", "release_v6", "offline")])
def test_lcb_problem_set_prompt_and_extraction_per_protocol(protocol, problem_set, layout):
    (bench,) = build_benchmarks(["lcb_v6"], BenchmarkOptions(protocol=protocol, data_dir=FIXTURES))
    assert (bench.problem_set, bench.prompt_layout) == (problem_set, layout)
    items = bench.load(seed=0, limit=1)
    prompt = items[0].messages[-1]["content"]
    reply = "print(int(input()) * 2)"  # a program with no fence at all
    if protocol == "offline":
        assert prompt.endswith("\nWrite the complete solution in a single ```python ... ``` block.")
        from spade.eval.livecodebench import offline_program

        assert offline_program(reply) == reply  # the whole reply is the program
        assert offline_program("a\n```python\nx = 1\n```\nb\n```python\ny = 2\n```") == "y = 2"
    else:
        assert "### Answer: (use the provided format with backticks)" in prompt
        record = _score(bench, items[0], reply)
        assert record.detail["status"] == "no_code" and not record.correct


# --- recorded and reported --------------------------------------------------------------------------

def _summary(directory: Path, protocol, label):
    directory.mkdir(parents=True)
    data = {"label": label, "benchmarks": {"aime25": {"name": "aime25", "score": 50.0}}}
    if protocol:
        data["protocol"] = protocol
    (directory / "summary.json").write_text(json.dumps(data))


def _report(*args):
    done = subprocess.run([sys.executable, "-m", "spade", "eval", "report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_eval_report_names_the_protocol_of_a_table(tmp_path):
    _summary(tmp_path / "off", "offline", "run-a")
    text = _report(tmp_path / "off")
    assert text.count("Evaluation protocol: offline (the released offline evaluation configuration)") == 2
    _summary(tmp_path / "old", None, "run-b")  # written before protocols: spade's own
    assert "Evaluation protocol: spade (spade's own settings" in _report(tmp_path / "old")
    mixed = _report(tmp_path / "off", tmp_path / "old")
    assert "Evaluation protocols differ between rows (not comparable): run-a: offline; run-b: spade" in mixed
    assert json.loads(_report(tmp_path / "off", "--format", "json"))["protocols"] == {"run-a": "offline"}


def test_a_results_dir_of_another_protocol_is_not_resumed(tmp_path):
    _summary(tmp_path / "r", "in_loop", "run")
    with pytest.raises(EvalError, match="holds results of eval protocol 'in_loop', not 'offline'"):
        asyncio.run(run_suite([], None, out_dir=tmp_path / "r", info={"protocol": "offline"}))
    asyncio.run(run_suite([], None, out_dir=tmp_path / "r", info={"protocol": "in_loop"}))
