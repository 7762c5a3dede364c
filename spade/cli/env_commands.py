"""``spade env``: admit, run, play and extract generated environments from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..agent.actions import parse_action
from ..designer.extract import extract_code
from ..envs.admission import admit, not_text_error
from ..envs.protocol import EnvFault, InfrastructureFault, episode_return
from ..envs.runner import DEFAULT_MAX_TURNS, turn_budget
from ..envs.sandbox.client import SandboxService
from .common import UsageError, read_text, sandbox_config


def add_parser(subparsers: Any) -> None:
    env = subparsers.add_parser("env", help="check, run, play or extract generated environments")
    commands = env.add_subparsers(dest="env_command", metavar="COMMAND", required=True)

    check = commands.add_parser("check", help="run the admission pipeline on files (exit 1 if any is rejected)")
    check.add_argument("paths", nargs="+", metavar="PATH", help="environment source or raw designer response")
    check.add_argument("--json", action="store_true", help="one JSON object per file, one per line")
    check.add_argument("--seed", type=int, default=42, help="seed of the smoke test and determinism check")
    _add_sandbox_options(check)
    check.set_defaults(handler=run_check)

    run = commands.add_parser("run", help="play a fixed list of actions in the sandbox")
    run.add_argument("path", metavar="PATH")
    actions = run.add_mutually_exclusive_group(required=True)
    actions.add_argument("--actions", nargs="+", metavar="A", help="actions, in order")
    actions.add_argument("--actions-file", metavar="F", help="a file with one action per line")
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--json", action="store_true", help="print one JSON object")
    _add_sandbox_options(run)
    run.set_defaults(handler=run_actions)

    play = commands.add_parser("play", help="play an environment yourself in the terminal")
    play.add_argument("path", metavar="PATH")
    play.add_argument("--seed", type=int, default=None)
    play.add_argument("--max-turns", type=int, default=DEFAULT_MAX_TURNS)
    _add_sandbox_options(play)
    play.set_defaults(handler=run_play)

    extract = commands.add_parser("extract", help="print the repaired code of a raw designer response")
    extract.add_argument("file", nargs="?", metavar="FILE", help="the response (default: standard input)")
    extract.set_defaults(handler=run_extract)


def _add_sandbox_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML file whose 'sandbox:' section sets the limits")
    parser.add_argument("--isolation", choices=("bubblewrap", "unsafe-local"),
                        help="override sandbox.isolation (also: SPADE_SANDBOX_ISOLATION)")


def run_check(args: argparse.Namespace) -> int:
    sources = {path: read_text(path) for path in args.paths}
    return asyncio.run(_check(args, sources))


async def _check(args: argparse.Namespace, sources: dict[str, str]) -> int:
    rejected = 0
    async with await SandboxService.start(sandbox_config(args)) as service:
        for path, source in sources.items():
            verdict = await admit(service, source, seed=args.seed)
            rejected += not verdict.admitted
            if args.json:
                print(json.dumps(verdict.to_json(path)), flush=True)
            elif verdict.admitted:
                print(f"{path}: admitted ({verdict.class_name})", flush=True)
            else:
                error = verdict.error
                assert error is not None
                print(f"{path}: rejected at {error.stage.value}: {error.kind.value}: {error.message}", flush=True)
    return 1 if rejected else 0


def _read_actions(args: argparse.Namespace) -> list[str]:
    if args.actions is not None:
        return list(args.actions)
    return [line for line in read_text(args.actions_file).splitlines() if line.strip()]


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
    actions = _read_actions(args)
    report = asyncio.run(_run(args, source, actions))
    if args.json:
        print(json.dumps(report))
    else:
        _print_run(report)
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
            error = fault.error
            report["error"] = {"kind": error.kind.value, "stage": error.stage.value, "message": error.message}
    return report


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


def run_play(args: argparse.Namespace) -> int:
    source = _read_source(args.path)
    return asyncio.run(_play(args, source))


async def _play(args: argparse.Namespace, source: str) -> int:
    async with await SandboxService.start(sandbox_config(args)) as service:
        try:
            env = await service.open(source, max_turns=args.max_turns)
            print(f"{env.class_name} (type an action, with or without \\boxed{{}}; 'quit' or Ctrl-D ends)\n")
            print((await env.reset(seed=args.seed)).observation)
            rewards: list[float] = []
            terminated = False
            for turn in range(1, turn_budget(args.max_turns, env.max_turns) + 1):
                line = await asyncio.to_thread(_prompt, turn)
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
        except InfrastructureFault:
            raise
        except EnvFault as fault:
            print(f"the environment failed: {fault}", file=sys.stderr)
            return 1
    return 0


def _prompt(turn: int) -> str | None:
    try:
        return input(f"\n[{turn}] > ")
    except EOFError:
        return None


def run_extract(args: argparse.Namespace) -> int:
    text = read_text(args.file) if args.file else sys.stdin.read()
    extraction = extract_code(text)
    sys.stdout.write(extraction.code + ("" if extraction.code.endswith("\n") else "\n"))
    if extraction.syntax_error is not None:
        print(f"warning: the code still does not parse: {extraction.syntax_error}", file=sys.stderr)
    if extraction.repairs:
        print(f"note: escaped {extraction.repairs} f-string brace(s)", file=sys.stderr)
    return 0

