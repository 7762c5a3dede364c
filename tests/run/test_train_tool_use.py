"""``spade train`` with ``selfplay.domain: tool_use`` end to end on CPU: a tiny random Qwen3 whose
tokenizer carries the real Qwen3 chat template (tests/fixtures/qwen3_hybrid.jinja, so the native
tool-call parser is chosen and the tool schemas go through the template's ``tools=``), the real
sandbox, the real HF engine and the real Megatron train step, each run a subprocess with a hard
timeout.

* the fixed pool (designer off): the five example tool environments plus one whose any answer is
  accepted, so that some episodes end with 1.0 and the GRPO update has a real gradient;
* resume equality after a kill -9 mid-step (step 2 playing, found by its progress line):
  ``--resume`` == 2 steps straight (metrics without ``time/`` keys, bit-identical weights);
* the designer on: a random model writes nothing admissible; every candidate is rejected with a
  named reason and the run still completes its steps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from support.configs import SANDBOX_LIMITS, write_config
from test_train_loop import RUN_TIMEOUT_S, checkpoint_tensors, metrics, run_spade, spade_cmd, without_time

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures"
TOOL_EXAMPLES = sorted((ROOT / "examples" / "envs" / "tool_use").glob("*.py"))

# A tool environment that accepts any final answer: the tiny model below writes <answer>...</answer>
# in some replies (and not in others), so returns within a group differ and advantages are not 0.
QUICK_ANSWER_ENV = '''
class QuickAnswerEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self.turn_count = 0
        self._call_history = []
        self._state = {"lights": "off", "notes": []}
        self._tools = {
            "set_lights": {"description": "Switch the lights.", "parameters": {
                "type": "object", "properties": {"mode": {"type": "string", "enum": ["on", "off"]}},
                "required": ["mode"]}},
            "add_note": {"description": "Add a note.", "parameters": {
                "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
            "weather": {"description": "Today's weather.", "parameters": {"type": "object", "properties": {}}},
        }
        self._user_messages = ["Turn the lights on, please."]
        self._message_criteria = [lambda s: s["lights"] == "on"]
        self._current_msg = 0
        return self._user_messages[0], {}

    def tool_set_lights(self, mode):
        self._state["lights"] = mode
        return f"lights {mode}"

    def tool_add_note(self, text):
        self._state["notes"].append(text)
        return "noted"

    def tool_weather(self):
        return "sunny"

    def _check_answer(self, answer):
        return True

    def solution(self):
        return 'set_lights({"mode": "on"}) -> <answer>done</answer>'
'''


@pytest.fixture(scope="module")
def tool_hf(tmp_path_factory) -> Path:
    """A tiny random Qwen3 with the Qwen3 (hybrid) chat template; ``<answer>`` and ``</answer>``
    are single tokens that, like ``<|im_end|>``, read only a large residual feature, so replies
    often stop early and often hold an answer."""
    from chat_templates import bpe_tokenizer
    from tokenizers import AddedToken
    from support.models import tiny_qwen3

    directory = tmp_path_factory.mktemp("tiny_qwen3_tools")
    tokenizer = bpe_tokenizer((FIXTURES / "qwen3_hybrid.jinja").read_text())
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<answer>", "</answer>")])
    model = tiny_qwen3(tokenizer, max_position_embeddings=32768, special_ids=True, rope_theta=1e6)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 4.0
        for token, scale in (("<|im_end|>", 0.5), ("<answer>", 0.6), ("</answer>", 0.6)):
            index = tokenizer.convert_tokens_to_ids(token)
            model.lm_head.weight[index] = 0.0
            model.lm_head.weight[index, 0] = scale
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _config(work: Path, hf: Path, envs: Path, *, designer: bool) -> Path:
    pool = ({"designer_enabled": True, "max_attempts": 1, "use_corpus": True} if designer else
            {"designer_enabled": False, "fixed_env_dir": envs, "use_corpus": False})
    return write_config(work / ("designer.yaml" if designer else "fixed.yaml"), {
        "model": {"hf_dir": hf, "dtype": "float32"},
        "optimizer": {"lr": 0.001},
        "selfplay": {
            "domain": "tool_use",
            "k": 2,
            "sampling": {
                "designer": {"max_tokens": 16, "top_k": None, "top_p": 1.0},
                "agent": {"temperature": 1.0, "max_tokens": 12, "top_k": None, "top_p": 1.0},
                "hint": {"max_tokens": 12, "top_k": None, "top_p": 1.0},
                "screen": {"top_k": None, "top_p": 1.0},
            },
            "envs_per_set": 2 if designer else len(TOOL_EXAMPLES) + 1,  # the fixed pool: its whole six, every set
            "g_nohint": 2,
            "g_hint": 2,
            **pool,
            "max_turns": 2,
            "max_context_tokens": 16384 if designer else 4096,
            "admission": {"probes": False},  # QuickAnswerEnv accepts any answer on purpose (the probes would reject it)
        },
        "sandbox": SANDBOX_LIMITS,
        "corpus": {"paths": ["examples/corpus/demo.jsonl.gz"], "max_words": 4000},
        "engine": {"max_batch_size": 1},  # batch-invariant rollout log-probs: exact resume down to the last bit
        "run": {"steps": 2, "checkpoint_every": 1, "seed": 7, "micro_batch_tokens": 4096},
    })


@pytest.fixture(scope="module")
def fixed_config(tool_hf, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("tool_cfg")
    envs = work / "envs"
    envs.mkdir()
    for path in TOOL_EXAMPLES:
        shutil.copy(path, envs / path.name)
    (envs / "quick_answer.py").write_text(QUICK_ANSWER_ENV)
    (envs / "quick_answer.hint.txt").write_text("Switch the lights on, then answer done.")
    return _config(work, tool_hf, envs, designer=False)


@pytest.fixture(scope="module")
def straight_run(fixed_config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("tool_straight") / "run"
    run_spade("--config", str(fixed_config), "--run-dir", str(run))
    return run


def _episodes(run: Path) -> list[dict]:
    out = []
    for path in sorted((run / "trajectories").glob("step_*.jsonl")):
        out += [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "episode"]
    return out


def test_two_tool_use_steps_on_the_fixed_pool(straight_run):
    assert len(TOOL_EXAMPLES) >= 5
    records = metrics(straight_run)
    assert [r["step"] for r in records] == [0, 1]
    first = records[0]
    assert first["env/admitted"] == len(TOOL_EXAMPLES) + 1 and first["env/rejected"] == 0
    # every environment of the pool was played, and the hinted arm ran on the regeneration step
    assert first["agent/episodes"] == 2 * (len(TOOL_EXAMPLES) + 1)
    assert first["agent/hint_episodes"] == 2
    # the tool stages' diagnostics are counted over the admitted set (banking's probes leave two
    # criteria unchanged; the quick-answer environment's one criterion changes)
    for key in ("env/tool_true_at_reset", "env/tool_unchangeable", "env/tool_trivial", "env/tool_screen_no_verdict"):
        assert key in first and key not in records[1], key
    assert 1 <= first["env/tool_unchangeable"] <= len(TOOL_EXAMPLES)
    # a real policy gradient: some episodes ended with an accepted answer, others did not
    assert any(r["train/loss"] != 0.0 and r["train/grad_norm"] > 0.0 for r in records), records
    episodes = _episodes(straight_run)
    terminated = [e for e in episodes if e["end_reason"] == "terminated"]
    assert terminated and all(e["env_id"] == "fixed-quick_answer" and e["return"] == 1.0 for e in terminated)
    assert any(e["return"] == 0.0 for e in episodes)
    # replies without a call or an answer got the format-error observation (-0.1, not terminal)
    format_errors = [t for e in episodes for t in e["turns"] if t["reward"] == -0.1]
    assert format_errors and all(t["observation"].startswith("Format error") and not t["terminated"]
                                 for t in format_errors)
    openings = {e["env_id"]: e["opening"] for e in episodes}
    assert openings["fixed-quick_answer"] == "Turn the lights on, please."
    assert (straight_run / "checkpoints" / "latest").read_text().strip() == "step_2"


def test_tool_use_kill_mid_step_then_resume(straight_run, fixed_config, tmp_path):
    """SIGKILL of the whole process group (trainer, sandbox service, its sandboxes) once step 2
    is playing, found by its progress line (no clock): the checkpoint of step 1 is the newest,
    step 2's plays are mid-flight. ``--resume`` replays step 2 and ends equal to the straight run
    (metrics without ``time/`` keys, bit-identical weights)."""
    run = tmp_path / "run"
    proc = subprocess.Popen(spade_cmd("--config", str(fixed_config), "--run-dir", str(run)), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S  # the line arrives or the run ends: no window
        for line in proc.stderr:
            seen.append(line)
            if "step 1 (2/2) playing" in line:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "".join(seen)[-3000:]
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it was killed:\n{''.join(seen)[-3000:]}"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_1"
    assert [r["step"] for r in metrics(run)] == [0]
    resumed = run_spade("--resume", str(run))
    assert "resumed from" in resumed.stderr
    assert without_time(metrics(straight_run)) == without_time(metrics(run))
    ta, tb = (checkpoint_tensors(r / "checkpoints" / "step_2") for r in (straight_run, run))
    model_keys = [k for k in ta if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert model_keys and set(ta) == set(tb)
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key
    before = checkpoint_tensors(straight_run / "checkpoints" / "step_1")
    assert any(not torch.equal(before[k], ta[k]) for k in model_keys)  # the replayed step moved the weights


def test_tool_use_with_the_designer_on_rejects_and_completes(tool_hf, tmp_path):
    config = _config(tmp_path, tool_hf, tmp_path, designer=True)
    run = tmp_path / "run"
    proc = run_spade("--config", str(config), "--run-dir", str(run))
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["designer/attempts"] == 2 and records[0]["env/admitted"] == 0
    assert records[0]["env/rejected"] == 2
    assert "rejected" in proc.stdout + proc.stderr
    rejected = [p for p in (run / "rejected").rglob("*") if p.is_file()]
    assert rejected, "the rejected candidates are kept on disk"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
