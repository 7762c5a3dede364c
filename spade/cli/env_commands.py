"""``spade env``: admit, run, play and extract generated environments from the shell.

Tool environments (a class that subclasses ``ToolUseBaseEnv``) are recognised by their source:

* ``check`` takes files or folders of them and prints one verdict line per file and a summary line
  (``checked N: A admitted, R rejected (kind n, ...)``); ``-v`` adds, under each verdict, every probe
  family's best policy, the winnability proofs played and, for a tool environment, each stage with its
  time and the tool report (criteria true at reset, unchangeable by any probe call, met by any first call; the
  reset gate's errors). There is no model here, so the model screen is not asked (no verdict counts
  as accept, as in training); ``--reject`` turns diagnostics into rejections as the
  ``selfplay.admission.tool_use`` switches do.
* ``run --actions`` takes the agent's raw responses (text with ``<tool_call>`` blocks, or
  ``<answer>...</answer>``) and plays them through the training loop
  (:func:`spade.envs.runner.play_tool_episode`) with the parser training would choose from the
  model's chat format: ``--chat-template FILE`` (a Jinja template) or ``--model DIR`` (a Hugging
  Face directory: ``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``); by
  default the Qwen3 parser. It reports each call with its result, each turn's reward and the return.
* ``play`` is the same loop with a person typing the responses; besides raw responses it takes
  ``TOOL {json arguments}`` for one call and ``answer TEXT`` for ``<answer>TEXT</answer>``.

In a tool environment's raw responses (typed, or lines of ``run --actions-file``) ``\\n`` is a new
line and ``\\\\`` a backslash (``spade.cli.env_input``); Ctrl-C at ``play``'s prompt ends it with exit
status 130.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..agent.actions import parse_action
from ..agent.tool_calls import CLOSE, OPEN, Qwen3ToolCallParser, UnknownToolFormat, parser_for_template
from ..designer.extract import extract_code
from ..envs.admission import admit, not_text_error
from ..envs.degenerate_probes import ProbeSettings
from ..envs.protocol import EnvError, EnvFault, InfrastructureFault, episode_return
from ..envs.runner import DEFAULT_MAX_TURNS, EpisodeResult, StopEpisode, play_tool_episode, turn_budget
from ..envs.sandbox.client import SandboxedEnv, SandboxService
from ..envs.tool_use.admission import ToolAdmissionSettings
from ..envs.tool_use.local import is_tool_source
from ..envs.winnability import WinnabilitySettings
from .common import UsageError, read_text, sandbox_config
from .env_input import PlayInterrupted, check_text, decode_escapes, prompt, read_actions_file


def add_parser(subparsers: Any) -> None:
    env = subparsers.add_parser("env", help="check, run, play or extract generated environments")
    commands = env.add_subparsers(dest="env_command", metavar="COMMAND", required=True)

    check = commands.add_parser("check", help="run the admission pipeline on files (exit 1 if any is rejected)")
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help="environment source or raw designer response, or a folder of them (its "
                            f"{', '.join('*' + s for s in CHECKED_SUFFIXES)} files)")
    check.add_argument("--json", action="store_true", help="one JSON object per file, one per line")
    check.add_argument("-v", "--verbose", action="store_true",
                       help="under each verdict, every probe family's best policy, the winnability proofs "
                            "played and the tool stages (default: the verdict lines and a summary)")
    check.add_argument("--seed", type=int, default=42, help="seed of the smoke test and determinism check, and the "
                       "run seed the probes' seeds are drawn from (with each candidate's code)")
    check.add_argument("--winnability", choices=("off", "admit", "reject"), default="admit",
                       help="the winnability stage: off, on with a game whose designer offered only a description "
                            "admitted (the default, as spade's GPU recipes), or on with such a game rejected")
    check.add_argument("--reject", action="append", choices=REJECT_SWITCHES, default=[], metavar="WHAT",
                       help="tool environments: reject instead of report criteria that are WHAT "
                            f"({', '.join(REJECT_SWITCHES)}); repeatable")
    _add_sandbox_options(check)
    check.set_defaults(handler=run_check)

    run = commands.add_parser("run", help="play a fixed list of actions in the sandbox")
    run.add_argument("path", metavar="PATH")
    actions = run.add_mutually_exclusive_group(required=True)
    actions.add_argument("--actions", nargs="+", metavar="A", help="actions, in order")
    actions.add_argument("--actions-file", metavar="F",
                         help="a file with one action per line (tool environments: \\n in a line is a new line, "
                              "\\\\ a backslash)")
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--json", action="store_true", help="print one JSON object")
    _add_parser_options(run)
    _add_sandbox_options(run)
    run.set_defaults(handler=run_actions)

    play = commands.add_parser("play", help="play an environment yourself in the terminal")
    play.add_argument("path", metavar="PATH")
    play.add_argument("--seed", type=int, default=None)
    play.add_argument("--max-turns", type=int, default=DEFAULT_MAX_TURNS)
    _add_parser_options(play)
    _add_sandbox_options(play)
    play.set_defaults(handler=run_play)

    extract = commands.add_parser("extract", help="print the repaired code of a raw designer response")
    extract.add_argument("file", nargs="?", metavar="FILE", help="the response (default: standard input)")
    extract.set_defaults(handler=run_extract)


REJECT_SWITCHES = ("true_at_reset", "unchangeable", "trivial")


def _add_parser_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--chat-template", metavar="FILE",
                       help="tool environments: the model's chat template (Jinja); it chooses the tool-call "
                            "parser as training does (default: the Qwen3 parser)")
    group.add_argument("--model", metavar="DIR",
                       help="tool environments: a Hugging Face model directory whose chat template chooses "
                            "the tool-call parser")


def tool_parser(args: argparse.Namespace) -> Qwen3ToolCallParser:
    """The parser training would use: chosen from ``--chat-template`` / ``--model``'s chat template,
    else the Qwen3 parser."""
    template = None
    if getattr(args, "chat_template", None):
        template = read_text(args.chat_template)
    elif getattr(args, "model", None):
        template = _model_chat_template(args.model)
    else:
        return Qwen3ToolCallParser()
    try:
        return parser_for_template(template)
    except UnknownToolFormat as exc:
        raise UsageError(str(exc)) from None


def _model_chat_template(directory: str) -> str:
    root = Path(directory)
    if (root / "chat_template.jinja").is_file():
        return read_text(str(root / "chat_template.jinja"))
    config = root / "tokenizer_config.json"
    if not config.is_file():
        raise UsageError(f"{directory}: no chat_template.jinja or tokenizer_config.json")
    try:
        template = json.loads(read_text(str(config))).get("chat_template")
    except json.JSONDecodeError as exc:
        raise UsageError(f"{config}: not JSON: {exc}") from None
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise UsageError(f"{config}: no chat_template")
    return template


def _add_sandbox_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML file whose 'sandbox:' section sets the limits")
    parser.add_argument("--isolation", choices=("bubblewrap", "unsafe-local"),
                        help="override sandbox.isolation (also: SPADE_SANDBOX_ISOLATION)")


CHECKED_SUFFIXES = (".py", ".txt", ".md")  # environment code, raw designer responses


def checked_files(paths: list[str]) -> list[str]:
    """``paths`` with each folder replaced by its environment files, sorted; a folder with none is
    a usage error."""
    files: list[str] = []
    for path in paths:
        folder = Path(path)
        if not folder.is_dir():
            files.append(path)
            continue
        found = sorted(str(f) for f in folder.iterdir() if f.is_file() and f.suffix in CHECKED_SUFFIXES)
        if not found:
            raise UsageError(f"{path}: a folder with no {', '.join('*' + s for s in CHECKED_SUFFIXES)} file to check")
        files.extend(found)
    return files


def run_check(args: argparse.Namespace) -> int:
    sources = {path: read_text(path) for path in checked_files(args.paths)}
    return asyncio.run(_check(args, sources))


def check_summary(verdicts: list[Any]) -> str:
    """One line for the whole check: how many were admitted, and the rejections by kind."""
    kinds = Counter(v.error.kind.value for v in verdicts if not v.admitted and v.error is not None)
    rejected = sum(not v.admitted for v in verdicts)
    line = f"checked {len(verdicts)}: {len(verdicts) - rejected} admitted, {rejected} rejected"
    if kinds:
        line += " (" + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()) + ")"
    return line


async def _check(args: argparse.Namespace, sources: dict[str, str]) -> int:
    verdicts = []
    verbose = getattr(args, "verbose", False)
    switches = set(getattr(args, "reject", None) or ())
    tool_settings = ToolAdmissionSettings(reject_true_at_reset="true_at_reset" in switches,
                                          reject_unchangeable="unchangeable" in switches,
                                          reject_trivial="trivial" in switches)
    rule = getattr(args, "winnability", "admit")
    winnability = None if rule == "off" else WinnabilitySettings(unproven=rule)
    async with await SandboxService.start(sandbox_config(args)) as service:
        for path, source in sources.items():
            verdict = await admit(service, source, seed=args.seed, tool_settings=tool_settings,
                                  probes=ProbeSettings(seed_base=args.seed), winnability=winnability)
            verdicts.append(verdict)
            if args.json:
                print(json.dumps(verdict.to_json(path)), flush=True)
                continue
            if verdict.admitted:
                print(f"{path}: admitted ({verdict.class_name})", flush=True)
            else:
                error = verdict.error
                assert error is not None
                print(f"{path}: rejected at {error.stage.value}: {error.kind.value}: {error.message}", flush=True)
            if not verbose:
                continue
            if verdict.probe_report is not None:  # the degenerate-policy probes: each family's best policy
                print(f"  degenerate-policy probes ({verdict.probe_report.turns} turns, threshold "
                      f"{verdict.probe_report.threshold:g}):")
                for line in verdict.probe_report.lines():
                    print(f"    {line}", flush=True)
            if verdict.winnability_report is not None:  # the designer's proofs played
                print(f"  winnability (min return {verdict.winnability_report.min_return:g}):")
                for line in verdict.winnability_report.lines():
                    print(f"    {line}", flush=True)
            if verdict.tool_use:
                _print_tool_verdict(verdict)
    summary = check_summary(verdicts)
    print(summary, file=sys.stderr if args.json else sys.stdout, flush=True)  # --json: stdout stays JSON lines
    return 1 if any(not v.admitted for v in verdicts) else 0


def _print_tool_verdict(verdict: Any) -> None:
    """Each stage the tool environment went through, and what the tool stages found."""
    failed = None if verdict.error is None else verdict.error.stage.value
    for stage, ms in verdict.timings_ms.items():
        print(f"  {'FAIL' if stage == failed else 'ok':<4} {stage} ({ms:.1f} ms)")
    report = verdict.tool_report
    if report is None:
        return
    print(f"  tools {report.tools}, instructions {report.instructions}")
    for label, found in (("true at reset", report.true_at_reset), ("unchangeable by any probe call", report.unchangeable),
                         ("met by any first call", report.trivial)):
        print(f"  criteria {label}: {_indices(found)}")
    errors = ", ".join(f"{i} (raised under {n} of 3 seeds)" for i, n in sorted(report.gate_errors.items()))
    print(f"  reset gate errors: {errors or 'none'}")
    print("  model screen: " + {None: "not asked (no model here; no verdict counts as accept)",
                                True: "accepted", False: "rejected"}[report.screen], flush=True)
    if report.probes is not None:  # the degenerate-policy probes: one line per policy
        print(f"  degenerate-policy probes ({report.probes.turns} turns, threshold {report.probes.threshold:g}):")
        for line in report.probes.lines():
            print(f"    {line}", flush=True)


def _indices(found: list[int]) -> str:
    return ", ".join(str(i) for i in found) if found else "none"


def _read_actions(args: argparse.Namespace, *, escapes: bool) -> list[str]:
    if args.actions is not None:
        check_text(args.actions, "--actions")
        return list(args.actions)
    return read_actions_file(args.actions_file, escapes=escapes)


def _read_source(path: str) -> str:
    """The environment code in ``path`` (a raw designer response is extracted); source that is not
    UTF-8 text is refused with the byte and where it is."""
    text = read_text(path)
    not_text = not_text_error(text)
    if not_text is not None:
        raise UsageError(f"{path}: {not_text.message}")
    return extract_code(text).code


def run_actions(args: argparse.Namespace) -> int:
    source = _read_source(args.path)
    actions = _read_actions(args, escapes=is_tool_source(source))
    if is_tool_source(source):
        report = asyncio.run(_run_tool(args, source, actions, tool_parser(args)))
        printer = _print_tool_run
    else:
        report = asyncio.run(_run(args, source, actions))
        printer = _print_run
    if args.json:
        print(json.dumps(report))
    else:
        printer(report)
    return 0 if report["error"] is None else 1


async def _run(args: argparse.Namespace, source: str, actions: list[str]) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    report: dict[str, Any] = {"class_name": None, "first_observation": None, "steps": steps, "return": 0.0,
                              "error": None}
    async with await SandboxService.start(sandbox_config(args)) as service:
        try:
            env = await service.open(source)
            report["class_name"] = env.class_name
            report["first_observation"] = (await env.reset(seed=args.seed)).observation
            terminated = False
            for raw in actions:
                action = parse_action(raw)
                result = await env.step(action)
                steps.append({"action": action, "observation": result.observation, "reward": result.reward,
                              "terminated": result.terminated, "truncated": result.truncated})
                terminated = result.terminated
                if result.terminated or result.truncated:
                    break
            report["return"] = episode_return([step["reward"] for step in steps], terminated)
            await env.close()
        except EnvFault as fault:
            report["error"] = _error_fields(fault.error)
    return report


def _error_fields(error: EnvError) -> dict[str, str]:
    """An environment error as the run reports print and write it."""
    return {"kind": error.kind.value, "stage": error.stage.value, "message": error.message}


def _print_run(report: dict[str, Any]) -> None:
    if report["first_observation"] is not None:
        print(report["first_observation"])
    for step in report["steps"]:
        print(f"\n> {step['action']}\n{step['observation']}\n[reward {step['reward']:g}"
              f"{', terminated' if step['terminated'] else ''}{', truncated' if step['truncated'] else ''}]")
    if report["error"] is not None:
        error = report["error"]
        print(f"\nerror at {error['stage']}: {error['kind']}: {error['message']}")
    print(f"\nreturn: {report['return']:g}")


# -- tool environments ----------------------------------------------------------------------------


class _ScriptedResponses:
    """A policy that gives the agent's responses in order and stops the episode after the last."""

    def __init__(self, responses: list[str]):
        self.responses = list(responses)

    async def __call__(self, messages: list[Any], tools: Any = None) -> str:
        if not self.responses:
            raise StopEpisode("no more responses")
        return self.responses.pop(0)


def _tool_steps(episode: EpisodeResult) -> list[dict[str, Any]]:
    steps = []
    for turn in episode.turns:
        if turn.tool_calls:
            kind = "calls"
        elif turn.action.startswith("<answer>"):
            kind = "answer"
        else:
            kind = "format_error"
        step: dict[str, Any] = {"response": turn.response, "kind": kind, "calls": [dict(c) for c in turn.tool_calls],
                                "observation": turn.observation, "reward": turn.reward,
                                "terminated": turn.terminated, "truncated": turn.truncated}
        if kind == "answer":
            step["answer"] = turn.action[len("<answer>"):-len("</answer>")]
        # a call that completed the request: its result ended with the next one (the notice)
        advanced = [c for c in turn.tool_calls if c.get("advanced")]
        if advanced and advanced[-1].get("instruction") is not None:
            step["next_instruction"] = advanced[-1]["instruction"]
        steps.append(step)
    return steps


def _tool_report(episode: EpisodeResult, env: Any, tools: list[dict[str, Any]], parser: Any) -> dict[str, Any]:
    first = next((m.content for m in episode.messages if m.role == "user"), None)
    terminated = episode.end_reason.value == "terminated"
    report = {"class_name": env.class_name, "tool_use": True, "parser": parser.name,
              "tools": [t["function"]["name"] for t in tools], "first_observation": first,
              "steps": _tool_steps(episode), "end_reason": episode.end_reason.value, "stop_detail": episode.stop_detail,
              "return": episode_return(episode.rewards, terminated), "error": None}
    if episode.error is not None:
        report["error"] = _error_fields(episode.error)
    return report


async def _run_tool(args: argparse.Namespace, source: str, responses: list[str], parser: Any) -> dict[str, Any]:
    report: dict[str, Any] = {"class_name": None, "tool_use": True, "parser": parser.name, "tools": [],
                              "first_observation": None, "steps": [], "end_reason": None, "return": 0.0,
                              "error": None}
    async with await SandboxService.start(sandbox_config(args)) as service:
        try:
            env = await service.open(source)
            report["class_name"] = env.class_name
            tools: list[dict[str, Any]] = []
            episode = await play_tool_episode(env, _RememberTools(_ScriptedResponses(responses), tools),
                                              parser=parser, seed=args.seed, max_turns=len(responses) + 1)
            report = _tool_report(episode, env, tools, parser)
            await env.close()
        except EnvFault as fault:
            report["error"] = _error_fields(fault.error)
    return report


class _RememberTools:
    """Wraps a policy; keeps the tool schemas the episode offered (for the report)."""

    def __init__(self, policy: Any, tools: list[dict[str, Any]]):
        self.policy, self.tools = policy, tools

    async def __call__(self, messages: list[Any], tools: Any = None) -> str:
        if tools is not None and not self.tools:
            self.tools.extend(tools)
        return await self.policy(messages, tools=tools)


def _print_tool_run(report: dict[str, Any]) -> None:
    if report["class_name"] is not None:
        print(f"{report['class_name']} (tool environment; {report['parser']} tool-call parser)")
        print(f"tools: {', '.join(report['tools'])}")
    if report["first_observation"] is not None:
        print(f"user: {report['first_observation']}")
    for number, step in enumerate(report["steps"], 1):
        print(f"\n[{number}] {step['kind'].replace('_', ' ')}")
        for call in step["calls"]:
            arguments = json.dumps(call["arguments"], ensure_ascii=False)
            # a result that completed a request ends with the next one (the notice): keep its lines indented
            output = "\n".join(("    " + line) if line else "" for line in call["output"].split("\n")).lstrip()
            print(f"  call {call['name']}({arguments}) -> returncode {call['returncode']}: {output}")
        if step["kind"] != "calls":
            if step["kind"] == "answer":
                print(f"  answer: {step['answer']}")
            print(f"  {step['observation']}")
        print(f"  [reward {step['reward']:g}{', terminated' if step['terminated'] else ''}"
              f"{', truncated' if step['truncated'] else ''}]")
    if report["error"] is not None:
        error = report["error"]
        print(f"\nerror at {error['stage']}: {error['kind']}: {error['message']}")
    if report["end_reason"] is not None:
        detail = report.get("stop_detail")
        print(f"\nended: {report['end_reason']}" + (f" ({detail})" if detail else ""))
    print(f"return: {report['return']:g}")


class _Typed:
    """A person as the policy: prints what the episode said since the last turn, reads one line."""

    def __init__(self, tool_names: list[str]):
        self.seen = 0
        self.turn = 0
        self.tool_names = tool_names

    async def __call__(self, messages: list[Any], tools: Any = None) -> str:
        if tools and not self.tool_names:
            self.tool_names.extend(t["function"]["name"] for t in tools)
            for tool in tools:
                function = tool["function"]
                parameters = function.get("parameters", {})
                required = set(parameters.get("required", []))
                fields = ", ".join(f"{k}{'' if k in required else '?'}: {_describe(v)}"
                                   for k, v in parameters.get("properties", {}).items())
                print(f"  {function['name']}({fields}) - {function.get('description', '')}")
            print()
        for message in messages[self.seen:]:
            if message.role in ("user", "tool"):
                print(f"{message.role}: {message.content}")
        self.seen = len(messages) + 1  # this reply is appended next
        self.turn += 1
        line = prompt(self.turn)  # blocks the loop: nothing else runs while a person types
        if line is None or line.strip().lower() in ("quit", "exit"):
            raise StopEpisode("the player quit")
        return typed_response(line, self.tool_names)


def _describe(schema: Any) -> str:
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list):
        return "|".join(map(str, schema["enum"]))
    return str(schema.get("type", "any")) if isinstance(schema, dict) else "any"


def typed_response(line: str, tool_names: list[str]) -> str:
    """What a person typed, as an agent response: raw text with ``<tool_call>`` or ``<answer>``
    passes with its escapes decoded (``\\n`` a new line, ``\\\\`` a backslash); ``TOOL {json}`` (or a
    bare ``TOOL``) becomes one ``<tool_call>`` block, the JSON as typed; ``answer TEXT`` becomes
    ``<answer>TEXT</answer>``; other text is a raw response too. The parser then reads it as in
    training."""
    text = line.strip()
    if OPEN in text or "<answer>" in text:
        return decode_escapes(text)
    head, _, rest = text.partition(" ")
    if head.lower() == "answer":
        return f"<answer>{rest.strip()}</answer>"
    if head in tool_names:
        arguments = rest.strip() or "{}"
        return f'{OPEN}\n{{"name": {json.dumps(head)}, "arguments": {arguments}}}\n{CLOSE}'
    return decode_escapes(text)


async def _play_in_sandbox(args: argparse.Namespace, source: str,
                           play: Callable[[SandboxedEnv], Awaitable[int]]) -> int:
    """Open ``source`` in a sandbox and return ``play(env)``'s exit status; an environment fault
    is printed and exits 1 (a fault of the sandbox itself propagates)."""
    async with await SandboxService.start(sandbox_config(args)) as service:
        try:
            return await play(await service.open(source, max_turns=args.max_turns))
        except InfrastructureFault:
            raise
        except EnvFault as fault:
            print(f"the environment failed: {fault}", file=sys.stderr)
            return 1


async def _play_tool(env: SandboxedEnv, args: argparse.Namespace, parser: Any) -> int:
    print(f"{env.class_name} (tool environment, {parser.name} tool-call parser). Type a response: "
          f"<tool_call>\\n{{\"name\": ..., \"arguments\": {{...}}}}\\n</tool_call> (\\n: a new line), "
          f"or TOOL {{json arguments}}; "
          f"answer TEXT (or <answer>TEXT</answer>) to finish; 'quit' or Ctrl-D ends.\ntools:")
    episode = await play_tool_episode(env, _Typed([]), parser=parser, seed=args.seed,
                                      max_turns=args.max_turns)
    report = _tool_report(episode, env, [], parser)
    if episode.turns and episode.end_reason.value in ("terminated", "truncated"):
        print(episode.turns[-1].observation)
    rewards = ", ".join(f"{step['reward']:g}" for step in report["steps"])
    print(f"rewards per turn: {rewards or 'none'}; ended: {report['end_reason']}")
    print(f"return: {report['return']:g}")
    await env.close()
    if episode.error is not None:
        print(f"the environment failed: {episode.error.kind.value}: {episode.error.message}", file=sys.stderr)
        return 1
    return 0


def run_play(args: argparse.Namespace) -> int:
    """Exit status 130 on Ctrl-C (at the prompt, or while the sandbox answers), after the sandbox is closed."""
    source = _read_source(args.path)
    if is_tool_source(source):
        parser = tool_parser(args)
        play: Callable[[SandboxedEnv], Awaitable[int]] = lambda env: _play_tool(env, args, parser)  # noqa: E731
    else:
        play = lambda env: _play(env, args)  # noqa: E731
    try:
        return asyncio.run(_play_in_sandbox(args, source, play))
    except (PlayInterrupted, KeyboardInterrupt):
        print("\ninterrupted (Ctrl-C): the episode ends unfinished, nothing is scored", file=sys.stderr)
        return 130


async def _play(env: SandboxedEnv, args: argparse.Namespace) -> int:
    print(f"{env.class_name} (type an action, with or without \\boxed{{}}; 'quit' or Ctrl-D ends)\n")
    print((await env.reset(seed=args.seed)).observation)
    rewards: list[float] = []
    terminated = False
    for turn in range(1, turn_budget(args.max_turns, env.max_turns) + 1):
        line = prompt(turn)
        if line is None or line.strip().lower() in ("quit", "exit"):
            break
        result = await env.step(parse_action(line))
        rewards.append(result.reward)
        print(f"{result.observation}\n[reward {result.reward:g}]")
        if result.terminated or result.truncated:
            terminated = result.terminated
            print("The episode is over (terminated)." if terminated else "The episode is over (truncated).")
            break
    print(f"return: {episode_return(rewards, terminated):g}")
    await env.close()
    return 0


def run_extract(args: argparse.Namespace) -> int:
    text = read_text(args.file) if args.file else sys.stdin.read()
    extraction = extract_code(text)
    sys.stdout.write(extraction.code + ("" if extraction.code.endswith("\n") else "\n"))
    if extraction.syntax_error is not None:
        print(f"warning: the code still does not parse: {extraction.syntax_error}", file=sys.stderr)
    if extraction.repairs:
        print(f"note: escaped {extraction.repairs} f-string brace(s)", file=sys.stderr)
    return 0

