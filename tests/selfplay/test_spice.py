"""SPICE's pieces (issue 44): the Challenger reply's checks, the question played with real
``math-verify``, the Challenger reward against hand-computed values, and an invalid question
rejected, written under ``rejected/`` and penalised through the delay buffer."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from spade.config import ConfigError, from_mapping
from spade.designer.spice_prompts import challenger_messages, parse_challenger_reply, quote_in_document
from spade.envs.protocol import ErrorKind
from spade.envs.spice import QuestionSpec, SpiceSandbox, answers_match
from spade.selfplay.rewards.advantages import designer_advantages
from spade.selfplay.rewards.delay_buffer import DesignerBuffer
from spade.selfplay.rewards.designer_rewards import DesignerEvidence, SolverVarianceReward
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.sources.spice_source import SpiceSource, check_reply
from spade.selfplay.sources.text_generators import GeneratedText

DOCUMENT = ("The pendulum clock was invented by Christiaan Huygens in 1656. Its period depends on the length "
            "of the pendulum: a pendulum four times as long swings with twice the period.")
SPICE = {"env_source": "spice", "rewards": {"designer_reward": "solver_variance", "failed_hint": "hint_return_zero"}}


def settings(**overrides) -> SelfPlaySettings:
    data = json.loads(json.dumps(SPICE))
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return from_mapping(SelfPlaySettings, data, where="selfplay")


MCQ_REPLY = """<question>A pendulum of length L has period T. What is the period of a pendulum of length 4L?</question>
<options>
A) T/2
B) T
C) 2T
D) 4T
</options>
<answer>C</answer>
<evidence>a pendulum four times as long swings with twice the period</evidence>"""

FREE_REPLY = """<question>A clock was invented in 1656. How many years passed until 1700?</question>
<answer>44</answer>
<evidence>The pendulum clock was invented by Christiaan Huygens in 1656.</evidence>"""


def play(spec: QuestionSpec, reply_action: str) -> float:
    async def go():
        instance = await SpiceSandbox().open(spec.to_source())
        opening = await instance.reset()
        assert spec.question in opening.observation and "\\boxed" in opening.observation
        return (await instance.step(reply_action)).reward

    return asyncio.run(go())


def test_a_valid_multiple_choice_reply_becomes_a_question():
    verdict = check_reply(MCQ_REPLY, "mcq", DOCUMENT, "demo:1", settings())
    assert verdict.spec is not None and verdict.spec.answer == "C" and len(verdict.spec.options) == 4
    assert verdict.spec.document == "demo:1" and DOCUMENT not in verdict.spec.to_source()  # the Reasoner never sees it
    assert play(verdict.spec, "\\boxed{C}") == 1.0
    assert play(verdict.spec, "\\boxed{(C) 2T}") == 1.0
    assert play(verdict.spec, "\\boxed{\\text{C}}") == 1.0
    assert play(verdict.spec, "\\boxed{D}") == 0.0
    assert play(verdict.spec, "C") == 0.0  # no box: no answer


def test_free_form_answers_are_checked_with_math_verify():
    verdict = check_reply(FREE_REPLY, "free_form", DOCUMENT, "demo:2", settings())
    assert verdict.spec is not None and verdict.spec.answer == "44"
    assert play(verdict.spec, "\\boxed{44}") == 1.0
    assert play(verdict.spec, "\\boxed{44.0}") == 1.0
    assert play(verdict.spec, "\\boxed{88/2}") == 1.0
    assert play(verdict.spec, "\\boxed{45}") == 0.0
    spec = QuestionSpec("free_form", "Simplify 2/4.", "\\frac{1}{2}")
    assert answers_match(spec, "0.5") and answers_match(spec, "1/2") and not answers_match(spec, "2")


@pytest.mark.parametrize("reply, kind, error, words", [
    ("no tags at all", "free_form", ErrorKind.INVALID_QUESTION, "no <question>"),
    ("<question>What?</question>", "free_form", ErrorKind.INVALID_QUESTION, "no <answer>"),
    (MCQ_REPLY.replace("<answer>C</answer>", "<answer>E</answer>"), "mcq", ErrorKind.INVALID_QUESTION, "not an option"),
    (MCQ_REPLY.replace("D) 4T\n", ""), "mcq", ErrorKind.INVALID_QUESTION, "3 options, expected 4"),
    (MCQ_REPLY.replace("B) T\n", "B) T/2\n"), "mcq", ErrorKind.INVALID_QUESTION, "two options are the same"),
    (FREE_REPLY.replace("<answer>44</answer>", "<answer>}{</answer>"), "free_form", ErrorKind.INVALID_QUESTION,
     "math-verify cannot read"),
    (FREE_REPLY.replace("Christiaan Huygens", "Galileo"), "free_form", ErrorKind.UNGROUNDED, "not in the document"),
    (FREE_REPLY.replace("The pendulum clock was invented by Christiaan Huygens in 1656.", "in 1656"), "free_form",
     ErrorKind.UNGROUNDED, "at least 5 needed"),
])
def test_invalid_replies_are_rejected_with_the_reason(reply, kind, error, words):
    verdict = check_reply(reply, kind, DOCUMENT, "demo:3", settings())
    assert verdict.spec is None and verdict.kind is error and words in verdict.message


def test_grounding_none_checks_format_and_answer_only():
    reply = FREE_REPLY.replace("Christiaan Huygens", "Galileo")
    assert check_reply(reply, "free_form", DOCUMENT, "d", settings(spice={"grounding": "none"})).spec is not None


def test_the_prompt_carries_the_document_and_the_format():
    [message] = challenger_messages(DOCUMENT, "mcq", options=4)
    assert DOCUMENT in message["content"] and "<options>" in message["content"] and "A, B, C, D" in message["content"]
    [message] = challenger_messages(DOCUMENT, "free_form")
    assert "<options>" not in message["content"] and "<evidence>" in message["content"]
    assert parse_challenger_reply("<question>q</question><answer>1</answer>draft <answer>2</answer>",
                                  "free_form").answer == "2"  # the last tag counts
    assert quote_in_document("PENDULUM clock was invented, by Christiaan", DOCUMENT, 5) is None


def test_the_challenger_reward_is_the_gaussian_of_the_group_variance():
    reward = SolverVarianceReward.from_settings(settings().rewards)

    def of(returns):
        return reward(DesignerEvidence((), tuple(returns), hint_failed=True))

    # half right: variance 0.25, the Gaussian's centre
    assert of([1, 0, 1, 0, 1, 0, 1, 0]) == pytest.approx(1.0)
    # 2 of 8 right: variance 0.25 * 0.75 = 0.1875; exp(-(0.0625)^2 / 0.02) = exp(-0.1953125)
    assert of([1, 1, 0, 0, 0, 0, 0, 0]) == pytest.approx(0.8225775623986646)
    assert of([1, 1, 0, 0, 0, 0, 0, 0]) == pytest.approx(math.exp(-0.1953125))
    # all right or all wrong: variance 0; exp(-0.0625 / 0.02) = exp(-3.125)
    assert of([1] * 8) == pytest.approx(0.04393693362340742) == of([0] * 8)


class Replies:
    """A Challenger that answers each call with the next of ``replies`` (a stand-in for its trajectory)."""

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.trajectories: list[object] = []

    async def generate(self, messages, sampling):
        self.trajectories.append(object())
        return GeneratedText(self.replies.pop(0), "stop", self.trajectories[-1])


class OneDocument:
    def sample(self, rng):
        from spade.designer.corpus import Document

        return Document(text=DOCUMENT, path="demo.jsonl", position=rng.randrange(100), doc_id=None, words=30,
                        truncated=False)


def test_an_invalid_question_is_rejected_and_trains_on_the_penalty(tmp_path: Path):
    s = settings(envs_per_set=2, spice={"mcq_share": 0.0})
    source = SpiceSource(s, corpus=OneDocument(), generator=Replies([FREE_REPLY, "<question>no answer</question>"]),
                         run_dir=tmp_path, seed=3)
    regen = asyncio.run(source.next_set(0))
    assert [env.env_id for env in regen.envs] == ["s000000-e00"] and set(regen.designer_fields) == {"s000000-e00"}
    [rejection] = regen.rejections
    assert rejection.kind is ErrorKind.INVALID_QUESTION and rejection.slot == 1
    written = json.loads((tmp_path / "rejected" / "step_000000" / "slot1_attempt0.json").read_text())
    assert written["reason"]["kind"] == "invalid_question" and written["response"] == "<question>no answer</question>"
    [penalised] = regen.penalised
    assert penalised.reward == -0.1 and penalised.ref == "s000000-e01-invalid" and penalised.skill == "spice"
    assert source.metrics()["spice/challenger_valid_share"] == 0.5
    # the buffer scores the valid question by the Gaussian and the invalid one by the penalty
    buffer = DesignerBuffer(1, s.rewards)
    buffer.add(0, "s000000-e00", "spice", "s000000-e00", (), (1.0, 1.0, 0.0, 0.0))
    buffer.add(0, penalised.ref, "spice", penalised.ref, (), (), penalty=penalised.reward)
    restored = DesignerBuffer.from_json(json.loads(json.dumps(buffer.to_json())), s.rewards)  # resumes alike
    released = restored.release(1)
    assert [r.reward for r in released] == [pytest.approx(1.0), -0.1]
    # centred per skill (SPICE's group baseline): the valid one up, the invalid one down
    assert designer_advantages([r.reward for r in released], [r.skill for r in released], 1.0) == \
        [pytest.approx(0.55), pytest.approx(-0.55)]


def test_spice_settings_name_their_keys():
    with pytest.raises(ConfigError, match=r"selfplay\.rewards\.designer_reward"):
        from_mapping(SelfPlaySettings, {"env_source": "spice"}, where="selfplay")
    with pytest.raises(ConfigError, match=r"selfplay\.rewards\.failed_hint"):
        settings(rewards={"failed_hint": "drop"})
    with pytest.raises(ConfigError, match=r"selfplay\.use_corpus"):
        settings(use_corpus=False)
    with pytest.raises(ConfigError, match=r"selfplay\.spice\.mcq_share"):
        settings(spice={"mcq_share": 1.5})
    with pytest.raises(ConfigError, match=r"selfplay\.spice\.grounding"):
        settings(spice={"grounding": "judge"})
    with pytest.raises(ConfigError, match=r"selfplay\.spice\.options"):
        settings(spice={"options": 1})
    assert settings().designer_enabled  # the Challenger is the designer role


def test_the_progress_line_tells_questions_and_answers():
    from spade.run.console import set_text

    metrics = {"designer/attempts": 4.0, "env/admitted": 3.0, "env/rejected": 1.0,
               "env/rejected_invalid_question": 1.0, "spice/reasoner_accuracy": 0.625}
    assert set_text(metrics, "spice") == \
        "questions 3 valid of 4, 1 invalid (invalid_question 1), reasoner accuracy 0.62"


@pytest.mark.parametrize("check_reply_text, valid", [("With the text: 2000 - 1956 = 44. \\boxed{44}", True),
                                                     ("\\boxed{45}", False), ("no box", False)])
def test_the_challengers_own_check_with_the_document(tmp_path: Path, check_reply_text, valid):
    s = settings(envs_per_set=1, spice={"mcq_share": 0.0, "grounding": "self_answer"})
    challenger = Replies([FREE_REPLY, check_reply_text])
    source = SpiceSource(s, corpus=OneDocument(), generator=challenger, run_dir=tmp_path, seed=3)
    regen = asyncio.run(source.next_set(0))
    assert len(challenger.trajectories) == 2  # the question, then the check (not trained)
    assert len(regen.envs) == int(valid) and len(regen.penalised) == int(not valid)
    if valid:
        assert set(regen.designer_fields.values()) == {challenger.trajectories[0]}
    else:
        [rejection] = regen.rejections
        assert rejection.kind is ErrorKind.UNGROUNDED and "answers its own question" in rejection.message
        assert regen.penalised[0].trajectory is challenger.trajectories[0]


@pytest.mark.parametrize("form, expected", [("centred", [0.5, -0.5, 0.5, -0.5]), ("zscore", [1.0, -1.0, 1.0, -1.0])])
def test_the_reasoners_advantages(tmp_path: Path, form, expected):
    from types import SimpleNamespace

    source = SpiceSource(settings(spice={"reasoner_advantage": form}), corpus=OneDocument(), generator=Replies([]),
                         run_dir=tmp_path, seed=0)
    plays = [SimpleNamespace(episode_return=r) for r in (1.0, 0.0, 1.0, 0.0)]
    assert source.advantages(None, plays) == pytest.approx(expected)
    assert source.advantages(None, [SimpleNamespace(episode_return=1.0)] * 3) == [0.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match=r"selfplay\.spice\.reasoner_advantage"):
        settings(spice={"reasoner_advantage": "rae"})
