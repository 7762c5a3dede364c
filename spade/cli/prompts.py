"""``spade prompts``: what a config asks the model, without loading the model.

For ``--config`` (and ``key=value`` overrides) it shows the designer prompt of the run's first
attempt (step 0, slot 0: the corpus document and memory examples drawn from the run's seed, as the
run draws them, ``spade.selfplay.sources.designer_source.designer_prompt``), the hint prompt for
``--env``, and the agent's first turn without and with the hint. With ``--env`` that turn comes from
the real episode runner: the environment is reset in the sandbox and the runner's opening is taken
at its first call to the policy; otherwise ``--observation`` (or a placeholder) is the observation.
``--reply`` shows the action the run would read from a model reply (games: the boxed action;
tool use: the tool calls, the answer or the format error). Each prompt is also shown as the chat
template renders it, with the thinking switch that role gets, when the model's tokenizer is on
disk; else the messages alone and why.

    spade prompts --config examples/smoke_cpu.yaml --env examples/envs/foggy_grid.py
    spade prompts --config RECIPE.yaml --observation "You see ..." --reply '\\boxed{north}' --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from .common import read_text, sandbox_config

OBSERVATION_PLACEHOLDER = "<the environment's first observation>"
HINT_PLACEHOLDER = "<the hint the model writes for this environment>"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("prompts", help="show the designer, hint and agent prompts of a config (no model)",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, metavar="FILE", help="YAML config (may 'include:' a base file)")
    parser.add_argument("--env", metavar="ENV.py", help="an environment: its hint prompt, and the agent's opening "
                        "from its reset in the sandbox")
    parser.add_argument("--observation", metavar="TEXT", help="the agent's first observation (default: --env's "
                        "reset, else a placeholder)")
    parser.add_argument("--hint", metavar="TEXT", default=HINT_PLACEHOLDER, help="the hint of the hinted arm")
    parser.add_argument("--reply", metavar="TEXT", help="a model reply: show the action the run reads from it")
    parser.add_argument("--seed", type=int, default=0, help="--env's reset seed (default 0)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    parser.set_defaults(handler=run_prompts)


@dataclass
class Rendered:
    """A prompt as the chat template renders it for one role."""

    thinking: str  # the role's setting: auto | on | off
    text: Optional[str] = None
    why_not: str = ""  # when ``text`` is None


@dataclass
class Prompts:
    designer: Optional[list[dict[str, str]]]
    hint: Optional[list[dict[str, str]]]
    agent: list[dict[str, Any]]
    agent_with_hint: Optional[list[dict[str, Any]]]
    action: Any = None
    domain: str = "games"
    designer_record: dict[str, Any] = field(default_factory=dict)
    tools: Optional[list[dict[str, Any]]] = None
    observation_from: str = ""
    rendered: dict[str, Rendered] = field(default_factory=dict)
    hinted_why: str = "give --env"  # why there is no hinted opening


def run_prompts(args: argparse.Namespace) -> int:
    from ..train_config import load_train_config

    config = load_train_config(args.config, args.overrides)
    source = read_text(args.env) if args.env else None
    prompts = asyncio.run(build_prompts(config, args, source))
    if args.json:
        print(json.dumps(asdict(prompts), indent=1, ensure_ascii=False))
    else:
        print(describe(prompts))
    return 0


async def build_prompts(config: Any, args: argparse.Namespace, source: Optional[str]) -> Prompts:
    sp = config.selfplay
    tokenizer, why_no_tokenizer = _tokenizer(config)
    designer, record = _designer(config)
    hint = None
    if source is not None:
        from ..designer.prompts import hint_messages
        from ..designer.tool_prompts import tool_hint_messages

        hint = tool_hint_messages(source) if sp.domain == "tool_use" else hint_messages(source, sp.hint_length)
    agent, agent_with_hint, tools, where = await _agent_openings(config, args, source, tokenizer)
    prompts = Prompts(designer=designer, hint=hint, agent=agent, agent_with_hint=agent_with_hint, domain=sp.domain,
                      designer_record=record, tools=tools, observation_from=where)
    if sp.env_source == "spiral":
        prompts.hinted_why = "selfplay.env_source spiral plays no hinted arm"
    if args.reply is not None:
        prompts.action = _action(sp, args.reply, tokenizer, tools)
    prompts.rendered = _render_all(config, prompts, tokenizer, why_no_tokenizer)
    return prompts


def _tokenizer(config: Any) -> tuple[Any, str]:
    from ..run.run_dir import RunDirError
    from ..run.trainer import resolve_hf_dir

    try:
        directory = resolve_hf_dir(config)
    except RunDirError as exc:
        return None, str(exc)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory), ""


def _designer(config: Any) -> tuple[Optional[list[dict[str, str]]], dict[str, Any]]:
    from ..designer.corpus import Corpus
    from ..designer.memory import Memory
    from ..selfplay.sources.designer_source import designer_prompt, seed_memory
    from ..designer.skills import slot_skills
    from ..selfplay.step import Step

    sp = config.selfplay
    if not sp.designer_enabled:
        return None, {"why": f"selfplay.env_source {sp.env_source}: no designer"}
    corpus = Corpus(config.corpus) if sp.use_corpus and config.corpus.paths else None
    if sp.env_source == "spice" and corpus is not None:  # the designer role is SPICE's Challenger
        from ..selfplay.sources.spice_source import challenger_prompt

        drawn = challenger_prompt(sp, corpus, seed=config.run.seed, step=0, slot=0)
        return [dict(m) for m in drawn.messages], drawn.record
    skill = slot_skills(sp.skills.active(sp.domain, Step(0).regeneration(sp.k)), sp.envs_per_set)[0]
    with tempfile.TemporaryDirectory(prefix="spade-prompts-") as folder:
        memory = Memory(Path(folder) / "memory.sqlite", capacity=sp.memory_capacity) if sp.use_memory else None
        try:
            seed_memory(sp, memory)
            drawn = designer_prompt(sp, corpus=corpus, memory=memory, seed=config.run.seed, step=0, slot=0, attempt=0,
                                    skill=skill)
        finally:
            if memory is not None:
                memory.close()
    return [dict(m) for m in drawn.messages], drawn.record


class _Opening(Exception):
    """Raised by the capturing policy: the runner's opening is known, nothing more is played."""

    def __init__(self, messages: list[Any], tools: Any) -> None:
        super().__init__("opening captured")
        self.messages = messages
        self.tools = tools


async def _capture(messages: list[Any], tools: Any = None) -> str:
    raise _Opening(messages, tools)


def _plain(messages: list[Any]) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.content} if hasattr(m, "role") else dict(m) for m in messages]


async def _agent_openings(config: Any, args: argparse.Namespace, source: Optional[str], tokenizer: Any):
    """(no-hint opening, hinted opening, tool schemas, where the observation came from)."""
    from ..agent.prompts import first_tool_message, first_user_message

    tool_use = config.selfplay.domain == "tool_use"
    if config.selfplay.env_source == "spiral" and source is None:
        return _spiral_opening(config, args)
    if source is None or args.observation is not None:
        observation = args.observation if args.observation is not None else OBSERVATION_PLACEHOLDER
        if tool_use:
            plain, hinted = first_tool_message(observation), first_tool_message(observation, args.hint)
        else:
            style = config.selfplay.agent_game_prompt
            plain, hinted = first_user_message(observation, None, style), first_user_message(observation, args.hint, style)
        return ([{"role": "user", "content": plain}], [{"role": "user", "content": hinted}], None,
                "--observation" if args.observation is not None else "placeholder")
    from ..envs.runner import play_episode, play_tool_episode
    from ..envs.sandbox.client import SandboxService

    openings, tools = [], None
    async with await SandboxService.start(sandbox_config(args)) as service:
        for hint in (None, args.hint):
            env = await service.open(source)
            try:
                if tool_use:
                    await play_tool_episode(env, _capture, parser=_tool_parser(tokenizer), seed=args.seed, hint=hint)
                else:
                    await play_episode(env, _capture, seed=args.seed, hint=hint,
                                       game_prompt=config.selfplay.agent_game_prompt)
                raise RuntimeError("the environment ended before the agent's first turn")
            except _Opening as opening:
                openings.append(_plain(opening.messages))
                tools = opening.tools
            finally:
                await env.close()
    return openings[0], openings[1], tools, f"{args.env} reset with seed {args.seed}"


def _spiral_opening(config: Any, args: argparse.Namespace):
    """SPIRAL's turn prompt around a real observation: its first game reset with ``--seed`` (the seat
    to move sees it), or ``--observation``; no hinted arm."""
    from ..selfplay.sources.spiral_games import TextArenaGame, turn_prompt

    spiral = config.selfplay.spiral
    observation, where = args.observation, "--observation"
    if observation is None:
        seat, observation = TextArenaGame(spiral.games[0], args.seed, spiral).observation()
        where = f"TextArena's {spiral.games[0]} reset with seed {args.seed}, seat {seat} to move"
    return [{"role": "user", "content": turn_prompt(observation)}], None, None, where


def _action(sp: Any, reply: str, tokenizer: Any, tools: Any) -> Any:
    if sp.env_source == "spiral":  # the move SPIRAL's player hands TextArena
        from ..selfplay.sources.spiral_games import action_of

        return action_of(reply)
    if sp.domain != "tool_use":
        from ..agent.actions import parse_action

        return parse_action(reply, sp.action_extraction)
    from ..envs.tool_use.replies import read_tool_turn

    turn = read_tool_turn(reply, _tool_parser(tokenizer), tools)
    return {"kind": turn.kind, "calls": [{"name": c.name, "arguments": c.arguments} for c in turn.calls],
            "answer": turn.answer, "errors": [str(e) for e in turn.errors]}


def _tool_parser(tokenizer: Any) -> Any:
    """The parser training picks from the model's chat template (the Qwen3 one without a tokenizer)."""
    from ..agent.tool_calls import Qwen3ToolCallParser, UnknownToolFormat, parser_for_template
    from .common import UsageError

    if tokenizer is None:
        return Qwen3ToolCallParser()
    try:
        return parser_for_template(getattr(tokenizer, "chat_template", None))
    except UnknownToolFormat as exc:
        raise UsageError(str(exc)) from None


def _render_all(config: Any, prompts: Prompts, tokenizer: Any, why_not: str) -> dict[str, Rendered]:
    from ..rollout.conversation import TemplateError, thinking_template_kwargs
    from ..selfplay.sources.role_thinking import role_template_kwargs

    sp = config.selfplay
    shared_setting = config.model.thinking
    # each role's thinking switch: auto follows model.thinking (spade.selfplay.sources.role_thinking)
    roles = {"designer": (prompts.designer, sp.sampling.designer.thinking, None, "selfplay.sampling.designer.thinking"),
             "hint": (prompts.hint, sp.sampling.hint.thinking, None, "selfplay.sampling.hint.thinking"),
             "agent": (prompts.agent, shared_setting, prompts.tools, "model.thinking"),
             "agent_with_hint": (prompts.agent_with_hint, sp.sampling.agent.hinted_thinking, prompts.tools,
                                 "selfplay.sampling.agent.hinted_thinking")}
    rendered = {}
    for role, (messages, setting, tools, key) in roles.items():
        if messages is None:
            continue
        if tokenizer is None:
            rendered[role] = Rendered(str(setting), why_not=f"no tokenizer: {why_not}")
            continue
        template = getattr(tokenizer, "chat_template", None)
        try:
            shared = thinking_template_kwargs(template, shared_setting)
            kwargs = role_template_kwargs(template, shared, setting, key)
        except TemplateError as exc:  # a switch this model's template lacks: the run's preflight refuses it too
            rendered[role] = Rendered(str(setting), why_not=str(exc))
            continue
        if tools:
            kwargs = {**kwargs, "tools": tools}
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        rendered[role] = Rendered(str(setting), text)
    return rendered


def describe(prompts: Prompts) -> str:
    lines = [f"domain: {prompts.domain}"]
    sections = (("designer prompt", "designer"), ("hint prompt", "hint"), ("agent, first turn (no hint)", "agent"),
                ("agent, first turn (with hint)", "agent_with_hint"))
    for title, key in sections:
        messages = getattr(prompts, key)
        lines.append(f"\n=== {title} ===")
        if messages is None:
            why = prompts.designer_record.get("why") if key == "designer" else (
                prompts.hinted_why if key == "agent_with_hint" else "give --env")
            lines.append(f"(none: {why})")
            continue
        if key == "designer" and prompts.designer_record:
            lines.append("drawn: " + ", ".join(f"{k}={v}" for k, v in prompts.designer_record.items()))
        if key.startswith("agent"):
            lines.append(f"observation from: {prompts.observation_from}")
        for message in messages:
            lines.append(f"--- {message['role']} ---\n{message['content']}")
        shown = prompts.rendered.get(key)
        if shown is not None:
            lines.append(f"--- as the chat template renders it (thinking: {shown.thinking}) ---")
            lines.append(shown.text if shown.text is not None else f"(not rendered: {shown.why_not})")
    if prompts.action is not None:
        lines.append("\n=== action read from --reply ===")
        lines.append(prompts.action if isinstance(prompts.action, str) else json.dumps(prompts.action, indent=1))
    return "\n".join(lines)
