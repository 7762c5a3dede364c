"""``spade prompts``: the designer, hint and agent prompts a config gives, without a model.

The command runs for real (a subprocess of ``spade``); its agent openings come from the real
episode runner in the real sandbox, and the designer prompt is compared with the one the run's own
designer round sends for step 0, slot 0, attempt 0 (captured from ``DesignerRound.fill_slot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted([*(ROOT / "examples" / "recipes").glob("*.yaml"), *(ROOT / "examples" / "recipes" / "paper").glob("*.yaml")])
GAME = ROOT / "examples" / "envs" / "foggy_grid.py"
TOOL_ENV = ROOT / "examples" / "envs" / "tool_use" / "smart_home.py"


def spade_prompts(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spade", "prompts", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


def captured_designer_prompt(config) -> list[dict]:
    """What the run's designer round sends first: the generator records it and fails the call."""
    import tempfile

    from spade.designer.corpus import Corpus
    from spade.designer.memory import Memory
    from spade.designer.skills import slot_skills
    from spade.selfplay.sources.designer_source import DesignerRound
    from spade.selfplay.sources.slot_stages import SlotStages
    from spade.selfplay.step import Step
    from spade.envs.protocol import ErrorKind
    from spade.selfplay.sources.text_generators import GenerationFailed

    sent = []

    class Recording:
        async def generate(self, messages, sampling):
            sent.append([dict(m) for m in messages])
            raise GenerationFailed(ErrorKind.TIMEOUT, "recorded, not generated")

    sp = config.selfplay
    with tempfile.TemporaryDirectory() as folder:
        designer = DesignerRound.__new__(DesignerRound)  # only what fill_slot reads
        designer.settings, designer.seed, designer.run_dir = sp, config.run.seed, Path(folder)
        designer.corpus = Corpus(config.corpus) if sp.use_corpus and config.corpus.paths else None
        designer.memory = Memory(Path(folder) / "memory.sqlite", capacity=sp.memory_capacity)
        designer.generator = designer.designer_generator = Recording()
        designer.stages = SlotStages()
        designer.seed_memory()
        skill = slot_skills(sp.skills.active(sp.domain, Step(0).regeneration(sp.k)), sp.envs_per_set)[0]
        asyncio.run(designer.fill_slot(0, 0, skill))
        designer.memory.close()
    return sent[0]


def test_the_smoke_run_prompts_are_the_runs_own(tmp_path):
    from spade.train_config import load_train_config

    proc = spade_prompts("--config", "examples/smoke_cpu.yaml", "--env", str(GAME), "--reply",
                         "I go east. \\boxed{move east}", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    assert {"designer", "hint", "agent", "agent_with_hint", "action"} <= set(shown)
    assert shown["designer"] == captured_designer_prompt(load_train_config(str(ROOT / "examples/smoke_cpu.yaml"), []))
    source = GAME.read_text()
    assert source in shown["hint"][-1]["content"]  # the hint call reads the environment's code
    [opening] = shown["agent"]
    assert opening["role"] == "user" and "You are lost in fog" in opening["content"]
    assert "HINT" not in opening["content"]
    assert shown["agent_with_hint"][0]["content"].startswith(opening["content"])
    assert shown["agent_with_hint"][0]["content"].endswith("HINT: <the hint the model writes for this environment>")
    assert shown["action"] == "\\boxed{move east}"
    rendered = shown["rendered"]["agent"]
    assert rendered["thinking"] == "auto" and opening["content"] in rendered["text"]  # the embedded model's template


def test_text_output_names_each_prompt_and_the_template():
    proc = spade_prompts("--config", "examples/smoke_cpu.yaml", "--observation", "A locked door.", "--hint", "Knock.")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for title in ("=== designer prompt ===", "=== agent, first turn (no hint) ===", "=== agent, first turn (with hint) ===",
                  "observation from: --observation", "as the chat template renders it (thinking: auto)"):
        assert title in proc.stdout
    assert "A locked door.\n\nHINT: Knock." in proc.stdout
    assert "=== hint prompt ===\n(none: give --env)" in proc.stdout


def test_tool_use_prompts_come_from_the_tool_runner():
    call = '<tool_call>\n{"name": "list_devices", "arguments": {}}\n</tool_call>'
    proc = spade_prompts("--config", "examples/recipes/tool_use_base.yaml", "--env", str(TOOL_ENV), "--reply", call,
                         "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    assert shown["domain"] == "tool_use" and shown["tools"]
    names = [tool["function"]["name"] for tool in shown["tools"]]
    assert shown["agent"][0]["role"] == "user" and len(shown["agent"]) == 1  # no system message: tools go via the template
    assert shown["agent_with_hint"][0]["content"].endswith("HINT: <the hint the model writes for this environment>")
    assert shown["action"]["kind"] == ("calls" if "list_devices" in names else "format_error")
    # the recipe's model is not on this machine: the messages are shown and the reason is given
    assert "model.hf_dir" in shown["rendered"]["agent"]["why_not"]


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(r.relative_to(ROOT / "examples" / "recipes")) for r in RECIPES])
def test_every_recipe_has_its_prompts(recipe):
    from spade.cli.prompts import build_prompts
    from spade.train_config import load_train_config

    config = load_train_config(str(recipe), [])
    args = argparse.Namespace(observation="An observation.", hint="A hint.", reply="\\boxed{1}", seed=0, env=None)
    prompts = asyncio.run(build_prompts(config, args, None))
    assert (prompts.designer is not None) == config.selfplay.designer_enabled
    if prompts.designer is not None:
        assert prompts.designer[-1]["role"] == "user" and prompts.designer_record["skill"]
    assert prompts.agent[0]["content"].startswith("An observation.") or "An observation." in prompts.agent[0]["content"]
    hinted = prompts.agent_with_hint[0]["content"]
    if config.selfplay.domain == "games" and config.selfplay.agent_game_prompt == "paper":
        assert "\n\nHINT: A hint.\n" in hinted  # the released layout: the request follows the hinted observation
    else:
        assert hinted.endswith("A hint.")
    assert prompts.action is not None


# -- the issue 39 prompt keys: the shown prompts follow each of them ---------------------------------

def prompts_with(*overrides: str, env: bool = False, reply: str = "\\boxed{1}"):
    from spade.cli.prompts import build_prompts
    from spade.train_config import load_train_config

    config_path = str(ROOT / "examples/smoke_cpu.yaml")
    config = load_train_config(config_path, list(overrides))
    args = argparse.Namespace(config=config_path, observation=None if env else "An observation.", hint="A hint.",
                              reply=reply, seed=0, env=str(GAME) if env else None)
    return asyncio.run(build_prompts(config, args, GAME.read_text() if env else None))


def test_agent_game_prompt_shapes_the_runners_opening():
    from spade.agent.prompts import PAPER_GAME_REQUEST, PAPER_GAME_TASK

    spade_way, paper = prompts_with(env=True), prompts_with("selfplay.agent_game_prompt=paper", env=True)
    assert paper.observation_from.endswith("reset with seed 0")  # the real runner's opening
    observation = spade_way.agent[0]["content"].split("\n\n", 1)[1]  # after spade's instructions
    assert paper.agent[0]["content"] == f"{PAPER_GAME_TASK}\nObservation: {observation}\n{PAPER_GAME_REQUEST}"
    assert paper.agent_with_hint[0]["content"] == (
        f"{PAPER_GAME_TASK}\nObservation: {observation}\n\nHINT: A hint.\n{PAPER_GAME_REQUEST}")
    placeholder = prompts_with("selfplay.agent_game_prompt=paper")  # no --env: the same layout
    assert placeholder.agent[0]["content"] == f"{PAPER_GAME_TASK}\nObservation: An observation.\n{PAPER_GAME_REQUEST}"


def test_action_extraction_reads_the_reply():
    reply = "\\boxed{north} or maybe \\boxed{south}"
    assert prompts_with(reply=reply).action == "\\boxed{south}"
    assert prompts_with("selfplay.action_extraction=first_flat_box", reply=reply).action == "\\boxed{north}"


def test_designer_prompt_rules_and_skill_descriptions_reach_the_designer_prompt():
    default = prompts_with().designer[-1]["content"]
    rules = prompts_with("selfplay.designer_prompt_rules=released").designer[-1]["content"]
    assert "a formula that gives it away" in default and "formula" not in rules
    described = prompts_with("selfplay.skills.descriptions=released").designer[-1]["content"]
    from spade.designer.skills import GAME_SKILLS, RELEASED_DESCRIPTIONS

    skill = prompts_with().designer_record["skill"]
    spade_text = next(s.description for s in GAME_SKILLS if s.name == skill)
    assert spade_text in default and spade_text not in described
    assert f"({RELEASED_DESCRIPTIONS[skill]})." in described


def test_hint_length_reaches_the_hint_prompt():
    default = prompts_with(env=True).hint[0]["content"]
    released = prompts_with("selfplay.hint_length=three_sentences", env=True).hint[0]["content"]
    assert "(at most four sentences)" in default
    assert "(one to three sentences, fewer than 100 words)" in released


def test_designer_and_hinted_arm_thinking_switches_are_rendered():
    """Each role's prompt is rendered with its own switch (model.thinking on): the designer with
    selfplay.sampling.designer.thinking, the agent's hinted opening with
    selfplay.sampling.agent.hinted_thinking, the hint call with selfplay.sampling.hint.thinking; auto
    follows model.thinking, as the run does."""
    from chat_templates import bpe_tokenizer
    from spade.cli.prompts import _render_all, describe

    tokenizer = bpe_tokenizer((ROOT / "tests" / "fixtures" / "qwen3_hybrid.jinja").read_text())
    on, off = "<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"

    def endings(*overrides: str) -> dict[str, str]:
        from spade.train_config import load_train_config

        config = load_train_config(str(ROOT / "examples/smoke_cpu.yaml"), ["model.thinking=on", *overrides])
        prompts = prompts_with(*overrides, env=True)  # the messages; the embedded model has no switch
        prompts.rendered = _render_all(config, prompts, tokenizer, "")
        assert "(thinking: " in describe(prompts)
        return {role: "off" if shown.text.endswith(off) else "on" if shown.text.endswith(on) else "?"
                for role, shown in prompts.rendered.items()}

    assert endings() == {"designer": "on", "hint": "on", "agent": "on", "agent_with_hint": "on"}
    assert endings("selfplay.sampling.designer.thinking=off", "selfplay.sampling.agent.hinted_thinking=off") == \
        {"designer": "off", "hint": "on", "agent": "on", "agent_with_hint": "off"}
    assert endings("selfplay.sampling.hint.thinking=off", "selfplay.sampling.designer.thinking=on") == \
        {"designer": "on", "hint": "off", "agent": "on", "agent_with_hint": "on"}
    # the embedded model's template has no switch: the role is shown unrendered, naming the key
    shown = prompts_with("selfplay.sampling.designer.thinking=off", env=True).rendered
    assert shown["designer"].text is None and "selfplay.sampling.designer.thinking: 'off' needs" in shown["designer"].why_not
    assert shown["agent"].text is not None
