"""``spade eval``: held-out benchmarks on a model or checkpoint; ``spade eval report``: the tables."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from .common import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "eval", help="held-out benchmarks (AIME, GPQA-D, LCB, Reasoning-Gym hard, BFCL); 'eval report' for tables",
        description="Evaluate a model on the paper's held-out benchmarks, resumably. 'spade eval report DIR...' "
                    "builds Table 1 / Table 2 from result directories. See docs/evaluation.md.")
    parser.add_argument("--model", metavar="PATH",
                        help="HF directory, 'embedded', a checkpoint (RUN/checkpoints/step_N) or a run directory")
    parser.add_argument("--suite", default="games", help="games, tool, reasoning_gym, all (default games)")
    parser.add_argument("--benchmarks", default=None, help="comma-separated benchmark names (overrides --suite)")
    parser.add_argument("--out", default=None, metavar="DIR", help="results directory (resumed when it exists)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="first N items per benchmark (Reasoning-Gym: N episodes per task)")
    parser.add_argument("--engine", choices=("hf", "sglang"), default=None,
                        help="engine.kind: hf (in process, default) or sglang (running servers)")
    parser.add_argument("--sglang-url", nargs="+", default=[], metavar="URL", help="engine.sglang.urls")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, metavar="DIR", help="benchmark data directory "
                        "(default $SPADE_EVAL_DATA or ~/.cache/spade/eval_data)")
    parser.add_argument("--concurrency", type=int, default=64, help="generations in flight (default 64)")
    parser.add_argument("--max-batch-size", type=int, default=None,
                        help="engine.max_batch_size (hf engine): requests per batch (default 8)")
    parser.add_argument("--device", default=None, help="engine.device (hf engine): auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default=None, choices=("auto", "float32", "bfloat16", "float16"),
                        help="model.dtype (hf engine; auto: bf16 on a GPU or a CPU with AMX/AVX512-BF16, else fp32)")
    parser.add_argument("--samples", type=int, default=None, help="override samples per item")
    parser.add_argument("--temperature", type=float, default=None, help="override the sampling temperature")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override the completion budget")
    parser.add_argument("--protocol", default="spade", metavar="NAME",
                        help="evaluation protocol: spade (default, spade's own settings), in_loop or offline "
                             "(the released in-loop / offline evaluation configurations; docs/evaluation.md)")
    parser.add_argument("--rg-episodes", type=int, default=None,
                        help="Reasoning-Gym episodes per task (default: the protocol's, 4; offline 8)")
    parser.add_argument("--isolation", default=None, help="sandbox isolation for LCB (bubblewrap, unsafe-local)")
    parser.add_argument("--config", default=None,
                        help="a YAML config: its sandbox: section for the LCB judge, its engine: section and "
                             "model.dtype for the engine (the flags above override them)")
    parser.add_argument("--tau2", action="append", default=[], metavar="KEY=VALUE",
                        help="a tau2 setting, repeatable (domains, user_url, user_model, user_api_key_env, "
                             "max_steps, ...; docs/evaluation.md)")
    parser.add_argument("--acebench", action="append", default=[], metavar="KEY=VALUE",
                        help="an ACEBench setting, repeatable (repo, categories, user_url, user_model, "
                             "max_dialog_turns, ...; docs/evaluation.md)")
    parser.set_defaults(handler=run_eval)
    sub = parser.add_subparsers(dest="eval_command", metavar="report", required=False)
    add_report_parser(sub.add_parser("report", help="Tables 1-3 from result directories",
                                     description="The paper's Tables 1-3 row by row (--row KEY=DIR, --paper) and "
                                                 "Table 1 / Table 2 of any spade eval result directories."))


def add_report_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("dirs", nargs="*", metavar="DIR", help="result directories (or parents of several)")
    parser.add_argument("--row", action="append", default=[], metavar="KEY=DIR",
                        help="results for a paper row, repeatable: t1/{4b,8b,30b}/{base,grpo,rlve,spade}, "
                             "t2/{4b,8b,30b}/{base,spade}, t3/{spade,grpo,no_corpus,no_memory,"
                             "frozen_designer_no_memory,two_skill,learning_potential,solve_rate}; DIR may hold "
                             "a run's checkpoints (the best on the table's average is taken)")
    parser.add_argument("--base", default=None, metavar="DIR", help="the base model's results (deltas)")
    parser.add_argument("--format", choices=("md", "csv", "json"), default="md")
    parser.add_argument("--paper", action="store_true", help="render the paper's Tables 1-3 row by row")
    parser.add_argument("--plot", default=None, metavar="PNG", help="gain-vs-size figure (default DIR0/scaling.png)")
    parser.add_argument("--size", action="append", default=[], metavar="LABEL=B",
                        help="model size in billions for a run label (the figure's x axis), repeatable")
    parser.set_defaults(handler=run_report)
    return parser


def run_eval(args: argparse.Namespace) -> int:
    if not args.model:
        raise UsageError("spade eval needs --model PATH (or 'spade eval report DIR...')")
    from ..eval.protocol import check_protocol
    from ..eval.suites import BenchmarkOptions, benchmark_names

    try:
        check_protocol(args.protocol, "--protocol")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        names = benchmark_names(args.suite, args.benchmarks.split(",") if args.benchmarks else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be >= 1")
    from ..run.engines import ModelRefError, engine_settings, resolve_model
    from .common import require_config_file

    require_config_file(args.config)
    if args.max_batch_size is not None and args.max_batch_size < 1:
        raise UsageError("--max-batch-size must be >= 1")
    try:
        args.engine_settings = engine_settings(args.config, engine=args.engine, device=args.device, dtype=args.dtype,
                                               max_batch_size=args.max_batch_size, sglang_urls=args.sglang_url)
        args.model_ref = resolve_model(args.model)  # before the sandbox, the data and --out: a wrong --model fails first
    except ModelRefError as exc:
        raise UsageError(str(exc)) from None
    if args.engine_settings.kind == "sglang" and not args.engine_settings.section.sglang.urls:
        raise UsageError("--engine sglang needs --sglang-url URL (servers already serving the model)")
    if args.out:
        _make_out_dir(Path(args.out))
    sandbox = None
    if "lcb_v6" in names:
        from .common import sandbox_config

        sandbox = sandbox_config(args)
    tau2 = acebench = None
    if args.tau2 or args.acebench:
        from ..eval.acebench import AceBenchSettings
        from ..eval.tau2_bench import Tau2Settings

        tau2 = _harness_settings(args.tau2, Tau2Settings)
        acebench = _harness_settings(args.acebench, AceBenchSettings)
    if args.rg_episodes is not None and args.rg_episodes < 1:
        raise UsageError("--rg-episodes must be >= 1")
    options = BenchmarkOptions(protocol=args.protocol, data_dir=Path(args.data) if args.data else None, n=args.samples,
                               temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                               rg_episodes=args.rg_episodes, sandbox=sandbox, tau2=tau2, acebench=acebench)
    try:
        return asyncio.run(_evaluate(args, names, options))
    except KeyboardInterrupt:
        print(f"\nspade eval: stopped. {_resume_note(args.out, names)}", file=sys.stderr)
        raise SystemExit(130) from None


def _resume_note(out: str | None, names: list[str]) -> str:
    """What a Ctrl-C leaves: the finished items kept under ``--out`` and the command that runs the
    rest (the same one: ``--out`` is resumed), or that nothing was kept without ``--out``."""
    if not out:
        return "Nothing was kept (no --out): give --out DIR to make an evaluation resumable."
    from ..eval.runner import read_records, results_path

    kept = {name: len(read_records(results_path(out, name))) for name in names
            if results_path(out, name).is_file()}
    items = ", ".join(f"{name} {count}" for name, count in kept.items() if count) or "none yet"
    again = f"spade {shlex.join(sys.argv[1:])}" if sys.argv[1:2] == ["eval"] else "the same spade eval command"
    return (f"Finished items kept in {out} ({items}); run the same command again to resume with only the rest:\n"
            f"  {again}")


def _make_out_dir(out: Path) -> None:
    """``--out`` with any missing parents, before the model loads (a skipped benchmark writes only the
    summary, which found no directory to go in)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot be made a directory ({exc.strerror})") from None


def _harness_settings(pairs: list[str] | None, settings: Any) -> Any:
    """``--tau2`` / ``--acebench`` ``KEY=VALUE`` pairs as ``settings.from_pairs`` reads them; None
    without pairs."""
    if not pairs:
        return None
    try:
        return settings.from_pairs(pairs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def _evaluate(args: argparse.Namespace, names: list[str], options) -> int:
    from ..eval.runner import ChatModel, EvalError, format_table, run_suite, stderr_progress
    from ..eval.suites import build_benchmarks

    benchmarks = build_benchmarks(names, options)
    for benchmark in benchmarks:  # the sandbox starts before the model is loaded
        if benchmark.needs_sandbox and hasattr(benchmark, "start"):
            try:
                benchmark.load(args.seed, args.limit)
            except Exception:  # noqa: BLE001  (no data: the runner reports it skipped)
                continue
            await benchmark.start()
    from ..run.engines import ModelRefError, open_engine, report

    ref, settings = args.model_ref, args.engine_settings
    report("eval", ref, settings)
    try:
        loaded = await open_engine(ref, settings)
    except ModelRefError as exc:
        raise UsageError(str(exc)) from None
    chat = ChatModel(loaded.engine, loaded.tokenizer, concurrency=args.concurrency,
                     max_context_tokens=loaded.max_context_tokens)
    out = Path(args.out) if args.out else None
    resolved = str(ref.checkpoint or ref.hf_dir) if ref.kind != "embedded" else args.model
    info = {"model": args.model, "resolved_model": resolved, "label": ref.label, "step": ref.step,
            "engine": settings.kind, "suite": args.suite, "protocol": options.protocol, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        scores = await run_suite(benchmarks, chat, seed=args.seed, limit=args.limit, out_dir=out,
                                 progress=stderr_progress, info=info)
    except EvalError as exc:
        raise UsageError(str(exc)) from None
    finally:
        loaded.engine.close()
    from ..eval.protocol import describe

    print(f"eval protocol: {describe(options.protocol)}")
    print(format_table(scores))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from ..eval.report import ReportError, build_report, parse_assignments

    sizes = {}
    for item in args.size:
        label, _, value = item.partition("=")
        try:
            sizes[label] = float(value)
        except ValueError:
            raise UsageError(f"--size {item}: expected LABEL=BILLIONS") from None
    try:
        text = build_report([Path(d) for d in args.dirs], base=Path(args.base) if args.base else None,
                            fmt=args.format, paper=args.paper, plot=Path(args.plot) if args.plot else None,
                            sizes=sizes, rows=parse_assignments(args.row))
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    print(text)
    return 0
