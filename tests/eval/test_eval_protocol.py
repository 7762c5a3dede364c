"""The evaluation protocol of the paper's released in-loop evaluator (spade-rl/spade): the sampling
each benchmark sends, the prompts, strict extraction (no answer read from reasoning or prose), and
a Reasoning-Gym category with a task that failed to build left unscored."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Iterable

import pytest

from spade.eval import extract
from spade.eval.aime import AIME
from spade.eval.gpqa import GPQADiamond
from spade.eval.reasoning_gym_bench import ReasoningGymHard, hard_settings
from spade.eval.runner import ChatModel, run_benchmark
from spade.eval.suites import BenchmarkOptions, build_benchmarks
from spade.eval.types import SamplingSettings
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine

from eval_helpers import ByteTokenizer

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"


class RecordingEngine(RolloutEngine):
    """Replies ``reply(prompt)`` and keeps every request's sampling parameters."""

    def __init__(self, reply=lambda prompt: "no answer"):
        self.reply = reply
        self.requests: list[GenerationRequest] = []

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        ids = tuple(self.reply(bytes(request.prompt_ids).decode()).encode())
        return GenerationResult(ids, tuple(0.0 for _ in ids), "stop", 0)

    async def update_weights(self, named_tensors: Iterable, version: int) -> None:
        pass

    def close(self) -> None:
        pass


def _sent(benchmark, limit=None):
    engine = RecordingEngine()
    score = asyncio.run(run_benchmark(benchmark, ChatModel(engine, ByteTokenizer()), seed=0, limit=limit))
    params = {(r.sampling.temperature, r.sampling.top_p, r.sampling.top_k, r.sampling.max_new_tokens)
              for r in engine.requests}
    assert len(params) == 1
    return score, params.pop(), len(engine.requests)


def test_aime_sends_the_released_avg32_sampling():
    # eval_configs/eval_aime_avg32.yaml: n_samples_per_eval_prompt 32, temperature 0.7, top_p 0.8,
    # top_k 20, max_response_len 32768
    for name in ("aime25", "aime26"):
        (bench,) = build_benchmarks([name], BenchmarkOptions(data_dir=FIXTURES))
        assert (bench.sampling.n, bench.sampling.temperature, bench.sampling.top_p, bench.sampling.top_k,
                bench.sampling.max_new_tokens) == (32, 0.7, 0.8, 20, 32768)
    (bench,) = build_benchmarks(["aime25"], BenchmarkOptions(data_dir=FIXTURES))
    score, sent, requests = _sent(bench)
    assert sent == (0.7, 0.8, 20, 32768) and requests == 3 * 32


def test_gpqa_sends_the_released_inloop_sampling():
    # eval_configs/gem_eval_inloop.yaml: mcq:GPQA-Diamond-official, episodes 396 (= 2 x 198 items),
    # temperature 0.7, max_tokens 16384; spade/core/eval/gem_evaluator.py sends top_p 0.8, top_k 20
    (bench,) = build_benchmarks(["gpqa_diamond"], BenchmarkOptions(data_dir=FIXTURES))
    score, sent, requests = _sent(bench)
    assert sent == (0.7, 0.8, 20, 16384)
    assert requests == 396 // 198 * score.items


def test_reasoning_gym_sends_the_released_inloop_sampling():
    # eval_configs/gem_eval_inloop.yaml: rg:<task>-hard, episodes 4, temperature 0.6, max_tokens 8192;
    # gem_evaluator.py sends top_p 0.8, top_k 20 for every task
    (bench,) = build_benchmarks(["rg_logic"], BenchmarkOptions(rg_tasks={"logic": ["syllogism"]}))
    score, sent, requests = _sent(bench)
    assert sent == (0.6, 0.8, 20, 8192)
    assert requests == 4 and bench.sampling.n == 1


def test_aime_prompt_is_the_problem_and_the_released_instruction():
    # cmd/eval/prepare_aime_datasets.py appends this to the problem
    released = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    items = AIME(2025, data_dir=FIXTURES).load(seed=0)
    assert items[0].messages[0]["content"] == "Invented fixture: what is 17 + 25?" + released


def test_gpqa_options_and_prompt_as_released():
    # spade/core/eval/boxed_qa_env.py: options [correct, inc 1, inc 2, inc 3] shuffled by
    # random.Random(42 + row); General-Reasoner's template
    bench = GPQADiamond(data_dir=FIXTURES)
    items = bench.load(seed=0)
    assert items == bench.load(seed=9)  # the letters do not depend on the run seed
    rows = [("Invented fixture question: which gas do plants mostly take in for photosynthesis?",
             ["Carbon dioxide", "Helium", "Neon", "Argon"]),
            ("Invented fixture question: how many sides does a hexagon have, in words?",
             ["Six", "Five", "Seven", "Eight"])]
    for row, (item, (question, options)) in enumerate(zip(items, rows)):
        order = list(options)
        random.Random(42 + row).shuffle(order)
        assert item.reference == "ABCD"[order.index(options[0])]
        assert item.messages[0]["content"] == (
            f"{question}\n\nA: {order[0]}\nB: {order[1]}\nC: {order[2]}\nD: {order[3]}\n\n"
            "Please reason step by step, and put your final answer within \\boxed{}.\n"
            "Please only provide the letter of the answer in the box.")


@pytest.mark.parametrize("reply,letter", [
    ("The answer is a bit subtle; I pick B", None),
    ("Answer: B", None),
    ("The correct option is (C).", None),
    ("<answer>B</answer>", None),
    (r"\boxed{Both}", None),
    (r"\boxed{\text{Answer: C}}", None),
    (r"\boxed{E}", None),
    (r"\boxed{}", None),
    (r"first \boxed{A}, then on reflection \boxed{C", None),
    (r"<think>so \boxed{B}</think>", None),
    (r"<think>it must be \boxed{B} since", None),
    (r"\boxed{B}", "B"),
    (r"\boxed{b}", "B"),
    (r"\boxed{\text{B}}", "B"),
    (r"\boxed{(B)}", "B"),
    (r"\boxed{B: 2.4 eV}", "B"),
    (r"\boxed{A} no wait, \boxed{D}", "D"),
    (r"<think>maybe \boxed{A}</think>Final: \boxed{C}", "C"),
])
def test_gpqa_reads_the_last_box_only(reply, letter):
    bench = GPQADiamond(data_dir=FIXTURES)
    item = bench.load(seed=0)[0]
    record = asyncio.run(bench.score(item, reply))
    assert record.answer == letter
    assert record.correct is (letter == item.reference)


def test_a_reply_cut_inside_think_scores_zero():
    bench = AIME(2025, data_dir=FIXTURES)
    item = bench.load(seed=0)[0]  # 17 + 25, gold 42
    cut = "<think>17 + 25 = 42, so the answer is \\boxed{42}. Let me double-check"
    assert asyncio.run(bench.score(item, cut)).score == 0.0
    closed = "<think>17 + 25 = 42</think>\n\nThe sum is \\boxed{42}."
    assert asyncio.run(bench.score(item, closed)).score == 1.0
    assert asyncio.run(bench.score(item, "<think>\\boxed{42}</think>\n\nNo box here.")).score == 0.0
    assert extract.strip_thinking("plain \\boxed{1}") == "plain \\boxed{1}"
    assert extract.strip_thinking("reasoning \\boxed{1}", inside=True) == ""


class OpenThinkTokenizer(ByteTokenizer):
    """A thinking template whose generation prompt opens the block (Qwen3-Thinking-2507's)."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs):
        return super().apply_chat_template(messages, tokenize, add_generation_prompt, **kwargs) + "<think>\n"


@pytest.mark.parametrize("reply,expected", [
    ("17 + 25 = 42, so \\boxed{42}. But wait", 0.0),  # cut inside the block the prompt opened
    ("17 + 25 = 42.\n</think>\n\n\\boxed{42}", 100.0),
])
def test_a_reply_to_a_prompt_that_opened_think_is_scored_from_its_answer_only(reply, expected):
    bench = AIME(2025, data_dir=FIXTURES, sampling=SamplingSettings(n=1, max_new_tokens=256))
    engine = RecordingEngine(lambda prompt: reply)
    score = asyncio.run(run_benchmark(bench, ChatModel(engine, OpenThinkTokenizer()), seed=0, limit=1))
    assert score.score == expected


def _answering_engine(bench: ReasoningGymHard) -> RecordingEngine:
    def reply(prompt: str) -> str:
        for holder in bench._loaded.values():
            for entry in holder.entries.values():
                if entry["question"] in prompt:
                    return f"<answer>{entry['answer']}</answer>"
        return "no idea"
    return RecordingEngine(reply)


def test_reasoning_gym_category_with_a_task_that_failed_to_build_is_not_scored(monkeypatch):
    settings = dict(hard_settings())
    params = dict(settings["params"])
    params["aiw"] = {**params["aiw"], "no_such_parameter": 3}  # a bad config: create_dataset refuses it
    monkeypatch.setitem(settings, "params", params)
    monkeypatch.setattr("spade.eval.reasoning_gym_bench.hard_settings", lambda: settings)
    bench = ReasoningGymHard("logic", episodes=2, tasks=["syllogism", "aiw"])
    score = asyncio.run(run_benchmark(bench, ChatModel(_answering_engine(bench), ByteTokenizer()), seed=0))
    assert score.score is None
    assert "aiw" in score.skipped and "not scored" in score.skipped
    assert score.groups == {"syllogism": 100.0}  # the tasks that built are still reported


def test_reasoning_gym_category_with_every_task_built_is_scored():
    bench = ReasoningGymHard("logic", episodes=2, tasks=["syllogism", "aiw"])
    score = asyncio.run(run_benchmark(bench, ChatModel(_answering_engine(bench), ByteTokenizer()), seed=0))
    assert score.score == 100.0 and score.skipped is None and score.samples == 4


def test_reasoning_gym_task_short_of_items_is_a_failed_build(monkeypatch):
    bench = ReasoningGymHard("logic", episodes=2, tasks=["syllogism", "aiw"])
    bench._dataset("aiw", 0)

    class Broken:
        def __getitem__(self, index):
            raise ValueError("cannot generate")

    bench._loaded["aiw"].dataset = Broken()
    bench.load(seed=0)
    assert "aiw" in bench.absent
    summary = bench.summarize([])
    assert summary.score is None and "aiw" in summary.skipped


def test_reasoning_gym_prompt_is_the_package_instruction_around_the_problem():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    bench = ReasoningGymHard("logic", episodes=1, tasks=["syllogism"])
    item = bench.load(seed=0)[0]
    question = bench._loaded["syllogism"].entries[0]["question"]
    first, rest = SYSTEM_PROMPTS["default"].split("\n", 1)
    assert item.messages[0]["content"] == f"{first}\nProblem: {question}\n{rest.strip()}"


def test_reasoning_gym_answer_inside_unclosed_think_does_not_count():
    bench = ReasoningGymHard("logic", episodes=1, tasks=["syllogism"])
    item = bench.load(seed=0)[0]
    gold = bench._loaded["syllogism"].entries[0]["answer"]
    cut = asyncio.run(bench.score(item, f"<think>I would write <answer>{gold}</answer> but first"))
    done = asyncio.run(bench.score(item, f"<think>hmm</think>\n<answer>{gold}</answer>"))
    assert (cut.correct, cut.answer, done.correct) == (False, None, True)
