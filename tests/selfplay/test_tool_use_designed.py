"""Designed tool environments admitted end to end, through every tool stage, in training.

A tiny random model writes nothing admissible, so the designer's intelligence comes from outside,
and only for the designer's three text roles (the environment, the step-plan hint, the model
screen); everything else is real: the sandbox, admission, the native tool-call agent on the HF
engine, the Megatron train step, the memory.

* ``spade train`` with ``domain: tool_use`` and the designer on ``selfplay.designer_endpoint``
  (``CannedEndpoint`` of test_external_designer: the real ``openai`` client over HTTP). The
  endpoint answers the tool designer prompt with one of ``examples/envs/tool_use/*.py`` (by the
  prompt's application domain), the tool hint prompt with a step plan, and the model screen
  "VERDICT: no" the first time, "VERDICT: yes" after: one candidate is rejected by the screen
  (kind ``screen_rejected``) and its slot's next attempt admitted.
* The orchestrator with the designer on OUR engine: :class:`ScriptedToolDesigner` is a test double
  for the designer role only (recognised by the tool designer, hint and screen system prompts); the
  screen request is rendered through the chat template and sent to the engine by the designer
  round's local generator, the agent's turns go to the real tiny model.
* A designed environment that passes admission and turns hostile in play (its tool loops,
  allocates or exits on an argument the probes never try): a failed play with the fault's kind.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

import test_external_designer
from chat_templates import bpe_tokenizer
from spade.designer.prompts import clean_hint
from spade.designer.tool_prompts import TOOL_DESIGNER_SYSTEM, TOOL_HINT_SYSTEM, TOOL_SCREEN_SYSTEM, parse_screen_verdict
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine
from test_external_designer import MODEL, CannedEndpoint
from test_train_loop import metrics, run_spade
from test_train_tool_use import FIXTURES, tool_hf  # noqa: F401  (the tiny Qwen3 with the Qwen3 template)
from support.configs import SANDBOX_LIMITS, write_config


ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {path.stem: path.read_text() for path in sorted((ROOT / "examples" / "envs" / "tool_use").glob("*.py"))}
BY_DOMAIN = {"banking": "banking", "retail orders": "retail_orders", "travel booking": "travel_booking",
             "support tickets": "support_tickets", "smart home": "smart_home"}
PLAN = ("1. Read the request and call the tool that changes the state it names.\n"
        "2. After each result, read the next request.\n3. When every request is done, reply <answer>done</answer>.")
HINT = clean_hint(PLAN)


def example_for(user_prompt: str) -> str:
    """The example environment for the application domain the designer prompt names (the other
    five domains each get a fixed one of the five)."""
    domain = user_prompt.split("## Application domain\n", 1)[1].split("\n", 1)[0].strip()
    names = sorted(EXAMPLES)
    return EXAMPLES[BY_DOMAIN.get(domain, names[len(domain) % len(names)])]


class ToolDesignerScript:
    """The canned answers to the three tool-designer prompts. ``verdicts`` are the screen's answers
    in turn (then "yes"); ``seen`` counts the calls of each role and keeps the screen prompts."""

    def __init__(self, verdicts: list[str]):
        self.verdicts = list(verdicts)
        self.seen: dict[str, int] = {"designer": 0, "hint": 0, "screen": 0}
        self.screen_prompts: list[str] = []
        self._lock = threading.Lock()

    def answer(self, system: str, user: str) -> str | None:
        """The reply to a designer-role call; None for any other call."""
        with self._lock:
            if system.startswith(TOOL_DESIGNER_SYSTEM[:60]):
                self.seen["designer"] += 1
                return f"A banking-style backend with a distractor tool.\n```python\n{example_for(user)}\n```"
            if system.startswith(TOOL_HINT_SYSTEM[:60]):
                self.seen["hint"] += 1
                return PLAN
            if system.startswith(TOOL_SCREEN_SYSTEM[:60]):
                self.seen["screen"] += 1
                self.screen_prompts.append(user)
                verdict = self.verdicts.pop(0) if self.verdicts else "yes"
                return f"Each criterion is reached by one of the tools.\nVERDICT: {verdict}"
        return None


# --------------------------------------------------------------------------- spade train, endpoint


@pytest.fixture
def tool_endpoint(monkeypatch):
    """``CannedEndpoint`` answering the tool designer, hint and screen prompts."""
    script = ToolDesignerScript(["no"])
    fallback = test_external_designer.reply

    def reply(messages):
        answer = script.answer(messages[0]["content"], messages[-1]["content"])
        return fallback(messages) if answer is None else answer

    monkeypatch.setattr(test_external_designer, "reply", reply)  # the server's handler looks it up per request
    server = CannedEndpoint(key=None)
    yield server, script
    server.close()


def _designed_config(work: Path, hf: Path, url: str) -> Path:
    path = work / "designed.yaml"
    write_config(path, {
        "model": {"hf_dir": hf, "dtype": "float32"},
        "optimizer": {"lr": 0.001},
        "selfplay": {
            "domain": "tool_use",
            "k": 2,
            "sampling": {
                "designer": {"max_tokens": 64, "top_k": None, "top_p": 1.0},
                "agent": {"temperature": 1.0, "max_tokens": 12, "top_k": None, "top_p": 1.0},
                "hint": {"max_tokens": 64, "top_k": None, "top_p": 1.0},
                "screen": {"top_k": None, "top_p": 1.0},
            },
            "envs_per_set": 2,
            "g_nohint": 2,
            "g_hint": 2,
            "max_attempts": 2,
            "use_corpus": True,
            "train_designer": False,
            "designer_endpoint": {"url": url, "model": MODEL, "api_key_env": None, "backoff_s": 0.0},
            "max_turns": 2,
            "max_context_tokens": 4096,
        },
        "sandbox": SANDBOX_LIMITS,
        "corpus": {"paths": ["examples/corpus/demo.jsonl.gz"], "max_words": 4000},
        "engine": {"max_batch_size": 1},
        "run": {"steps": 2, "checkpoint_every": 1, "seed": 7, "micro_batch_tokens": 4096},
    })
    return path


def test_spade_train_admits_designed_tool_environments(tool_hf, tool_endpoint, tmp_path):  # noqa: F811
    server, script = tool_endpoint
    run = tmp_path / "run"
    run_spade("--config", str(_designed_config(tmp_path, tool_hf, server.url)), "--run-dir", str(run))
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]
    first = records[0]
    # three candidates: the screen said no to the first, yes to the other two; both slots filled
    assert (first["designer/attempts"], first["env/admitted"], first["env/rejected"]) == (3, 2, 1)
    assert first["env/rejected_screen_rejected"] == 1
    [rejected] = [json.loads(p.read_text()) for p in (run / "rejected").rglob("*.json")]
    assert rejected["reason"]["kind"] == "screen_rejected" and rejected["reason"]["stage"] == "model_screen"
    assert rejected["attempt"] == 0 and "```python" in rejected["response"]

    # the admitted set: every tool stage passed and is in the report, the screen's verdict is yes
    set_dir = run / "envs" / "step_000000"
    metas = [json.loads(p.read_text()) for p in sorted(set_dir.glob("*.json"))]
    assert [m["env_id"] for m in metas] == ["s000000-e00", "s000000-e01"]
    for meta in metas:
        source = (set_dir / f"{meta['env_id']}.py").read_text()
        assert source.strip() in {s.strip() for s in EXAMPLES.values()}
        assert (set_dir / f"{meta['env_id']}.hint.txt").read_text() == HINT
        report = meta["tool_report"]
        assert report["screen"] is True and report["gate_errors"] == {}
        assert 3 <= report["tools"] <= 8 and 3 <= report["instructions"] <= 5
    assert first["env/tool_screen_no_verdict"] == 0  # every verdict was read (the tiny model's would not be)
    for key in ("true_at_reset", "unchangeable", "trivial"):
        assert first[f"env/tool_{key}"] == sum(1 for m in metas if m["tool_report"][key])
    assert "env/tool_screen_no_verdict" not in records[1]  # k 2: no regeneration at step 1

    # the endpoint served the designer's three roles: the screen saw the source and the schemas
    assert script.seen == {"designer": 3, "hint": 2, "screen": 3}
    assert len(server.chat) == 8
    designs = server.requests_with(TOOL_DESIGNER_SYSTEM)
    assert len(designs) == 3 and all("## Source code document" in b["messages"][-1]["content"] for b in designs)
    for prompt in script.screen_prompts:
        assert "class " in prompt and "Tools:\n[" in prompt and '"type": "function"' in prompt
    assert parse_screen_verdict("Each criterion is reached.\nVERDICT: no") is False

    # no-hint plays every step, hinted plays (hint in the opening) at the regeneration step only
    assert [r["agent/episodes"] for r in records] == [4, 4]
    assert first["agent/hint_episodes"] == 4 and "agent/hint_episodes" not in records[1]
    episodes = [e for path in sorted((run / "trajectories").glob("step_*.jsonl"))
                for e in map(json.loads, path.read_text().splitlines()) if e["kind"] == "episode"]
    hinted = [e for e in episodes if e["arm"] == "hint"]
    assert hinted and all(e["step"] == 0 and e["opening"].endswith(f"HINT: {HINT}") for e in hinted)
    assert any(e["arm"] == "nohint" and e["step"] == 1 for e in episodes)

    # the agent's samples went through the train step (their advantages are 0 here: the tiny model
    # solves none of these; test_train_tool_use has the real gradient), the designer's never
    for record in records:
        assert record["train/samples"] == record["agent/samples"] >= 1 and record["train/loss_tokens"] > 0
        assert "train/loss" in record and "train/grad_norm" in record
    assert records[0]["designer/pending"] == 2 and records[1].get("designer/samples", 0) == 0
    with sqlite3.connect(run / "memory.sqlite") as db:
        remembered = db.execute("SELECT env_id, step, source, hint FROM records ORDER BY seq").fetchall()
    assert sorted(r[0] for r in remembered) == ["s000000-e00", "s000000-e01"]
    assert all(step == 0 and hint == HINT and source.strip() in {s.strip() for s in EXAMPLES.values()}
               for _, step, source, hint in remembered)


# --------------------------------------------------------------------------- orchestrator, our engine


class ScriptedToolDesigner(RolloutEngine):
    """TEST DOUBLE, not a real part: it replaces the model's intelligence for the DESIGNER role
    only. A request whose rendered prompt carries one of the tool designer, hint or screen system
    prompts gets the script's answer (token ids from the tokenizer, log-probs -1.0); every other
    request (the agent's turns) goes to the real engine."""

    def __init__(self, real: RolloutEngine, tokenizer, script: ToolDesignerScript):
        self.real, self.tokenizer, self.script = real, tokenizer, script

    @property
    def weight_version(self) -> int:
        return self.real.weight_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        system = prompt.split("<|im_start|>system\n", 1)[-1]
        user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        text = self.script.answer(system, user) if prompt.startswith("<|im_start|>system\n") else None
        if text is None:
            return await self.real.generate(request)
        ids = self.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        return GenerationResult(tuple(ids), tuple([-1.0] * len(ids)), "stop", self.weight_version)

    async def update_weights(self, named_tensors, version):
        await self.real.update_weights(named_tensors, version)

    def close(self) -> None:
        pass


def test_orchestrator_screens_through_our_engine(sandbox, tmp_path):
    """Regeneration with the designer on our engine: the screen's "no" (the first verdict) rejects
    its candidate with ``screen_rejected``, its "yes" admits; the designer's samples are kept for
    the delayed reward, the agent's are scored; the hinted arm plays the step plan."""
    from spade.designer.memory import Memory, memory_path
    from spade.envs.protocol import ErrorKind, Stage
    from spade.rollout import HFEngine
    from spade.selfplay.orchestrator import Orchestrator
    from spade.selfplay.settings import SamplingSettings, SelfPlaySettings
    from spade.selfplay.step import Step
    from support.models import tiny_qwen3

    tokenizer = bpe_tokenizer((FIXTURES / "qwen3_hybrid.jinja").read_text())
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    script = ToolDesignerScript(["no"])
    real = HFEngine((tiny_qwen3(tokenizer, size="1x32", max_position_embeddings=32768), tokenizer),
                    eos_token_ids=(eos,))
    engine = ScriptedToolDesigner(real, tokenizer, script)
    settings = SelfPlaySettings(domain="tool_use", envs_per_set=2, k=2, g_nohint=2, g_hint=1, max_attempts=2,
                                sampling=SamplingSettings().replace(designer={"max_tokens": 64}, agent={"max_tokens": 8},
                                                                    hint={"max_tokens": 64}), max_turns=2,
                                max_context_tokens=16384)
    try:
        with Memory(memory_path(tmp_path)) as memory:
            orchestrator = Orchestrator(settings, sandbox=sandbox.service, engine=engine, tokenizer=tokenizer,
                                        corpus=None, memory=memory, run_dir=tmp_path, seed=3)
            out = sandbox.run(orchestrator.run_step(Step(0)), timeout=180)
            remembered = sorted(record.env_id for record in memory.list())
    finally:
        real.close()
    m = out.metrics
    assert (m["designer/attempts"], m["env/admitted"], m["env/rejected"], m["env/rejected_screen_rejected"]) == \
        (3, 2, 1, 1)
    assert m["env/tool_screen_no_verdict"] == 0
    [rejected] = [json.loads(p.read_text()) for p in (tmp_path / "rejected").rglob("*.json")]
    assert (rejected["reason"]["kind"], rejected["reason"]["stage"]) == (ErrorKind.SCREEN_REJECTED.value,
                                                                         Stage.MODEL_SCREEN.value)
    assert script.seen == {"designer": 3, "hint": 2, "screen": 3}
    for prompt in script.screen_prompts:  # what the engine was asked: the source and the tool schemas
        assert "class " in prompt and '"type": "function"' in prompt
    envs = orchestrator.envs
    assert [env.tool_report["screen"] for env in envs] == [True, True] and all(env.hint == HINT for env in envs)
    assert m["agent/episodes"] == 4 and m["agent/hint_episodes"] == 2
    assert len(out.agent_samples) == m["agent/samples"] >= 1 and out.designer_samples == []  # released at step k
    assert sorted(orchestrator.pending_samples) == [env.env_id for env in envs]  # designer samples, delayed
    assert remembered == [env.env_id for env in envs]


# --------------------------------------------------------------------------- admitted, then hostile in play

SNEAKY = '''
class SneakyEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self._state = {"mode": "a", "log": []}
        self._tools = {
            "set_mode": {"description": "Set the mode.", "parameters": {"type": "object", "properties": {
                "mode": {"type": "string", "enum": ["a", "b"]}}, "required": ["mode"]}},
            "log": {"description": "Write a log line.", "parameters": {"type": "object", "properties": {
                "text": {"type": "string"}}, "required": ["text"]}},
            "ping": {"description": "Ping.", "parameters": {"type": "object", "properties": {}}},
        }
        self._user_messages = ["Set the mode to b.", "Log 'done'."]
        self._message_criteria = [lambda s: s["mode"] == "b", lambda s: "done" in s["log"]]
        self._current_msg = 0
        return self._user_messages[0]

    def tool_set_mode(self, mode):
        if mode == "b":  # the probes call with the first enum value, "a": admission never gets here
            HOSTILE
        self._state["mode"] = mode
        return "mode " + mode

    def tool_log(self, text):
        self._state["log"].append(text)
        return "logged"

    def tool_ping(self):
        return "pong"

    def solution(self):
        return 'set_mode({"mode": "b"}) -> log({"text": "done"}) -> <answer>done</answer>'
'''
HOSTILE_IN_PLAY = [("loops", "while True:\n                pass", "timeout"),
                   ("allocates", "x = []\n            while True:\n                x.append(bytearray(1 << 24))",
                    "memory_limit"),
                   ("exits", "raise SystemExit(3)", "exit_called")]


@pytest.mark.parametrize("name,body,kind", HOSTILE_IN_PLAY, ids=[c[0] for c in HOSTILE_IN_PLAY])
def test_an_admitted_environment_turning_hostile_in_play_is_a_failed_play(sandbox, name, body, kind):
    """A designed environment whose tool misbehaves only on an argument the probes do not try
    passes admission; in play the fault ends that episode as ``env_error`` with the fault's kind
    (scored 0, not an infrastructure failure), and the sandbox serves the next environment."""
    from spade.agent.tool_calls import Qwen3ToolCallParser
    from spade.envs.admission import admit
    from spade.envs.runner import EndReason, play_tool_episode

    source = SNEAKY.replace("HOSTILE", body)
    # the degenerate-policy probes call set_mode with the "b" the first instruction names: off here
    verdict = sandbox.run(admit(sandbox.service, source, max_turns=5, require_tool_env=True, probes=None))
    assert verdict.admitted and verdict.tool_use, verdict.error

    replies = iter(['<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>',
                    '<tool_call>\n{"name": "set_mode", "arguments": {"mode": "b"}}\n</tool_call>'])

    async def policy(messages, tools=None):
        return next(replies)

    async def play():
        env = await sandbox.service.open(source, max_turns=5)
        try:
            return await play_tool_episode(env, policy, parser=Qwen3ToolCallParser(), seed=0, max_turns=5)
        finally:
            await env.close()

    episode = sandbox.run(play(), timeout=60)
    assert episode.end_reason is EndReason.ENV_ERROR and episode.error.kind.value == kind, episode.error
    assert [t.observation for t in episode.turns] == ["pong"] and episode.episode_return == 0.0
    again = sandbox.run(admit(sandbox.service, EXAMPLES["banking"], require_tool_env=True))
    assert again.admitted
