"""``spade pool``: make the static environment pool of the Fixed-env GRPO baseline.

    spade pool generate --designer (MODEL | URL) --n N --out DIR [--skills A,B] [--config YAML]
                        [--model NAME] [--concurrency C] [--max-attempts M] [key.sub=value ...]
    spade pool assemble --from RUN_DIR [RUN_DIR ...] --out DIR [--steps a:b]
    spade pool import --from (RELEASED_DIR | EXPORT_DIR) --out DIR [--expect N]
    spade pool export (RUN_DIR | POOL_DIR) --out DIR [--format jsonl|parquet]

``generate`` writes ``N`` admitted environments through the training's designer prompts, admission
and hint calls (:mod:`spade.pool.build`). The settings are those of ``--config`` (a train
config: ``selfplay`` for the prompts, corpus and memory switches, budgets and timeouts; ``corpus``;
``sandbox``; ``engine`` and ``model`` for a local designer; ``run.seed``), with overrides. The
designer is a local Hugging Face directory, served by the in-process hf engine as ``spade train``
builds it (``embedded`` names the CPU demo model), or the base URL of an OpenAI-compatible endpoint
(``--model`` names the served model; the key is read from ``selfplay.designer_endpoint.api_key_env``,
by default ``OPENAI_API_KEY``; the other endpoint settings come from the config). One progress line
per admitted environment; rerunning with the same ``--out`` continues where it stopped. Exit 0 when
the pool holds ``N`` environments, 1 when ``--max-attempts`` (default ``10 * N``) ran out first.

``assemble`` builds (or extends) a pool from the admitted environments of earlier runs.

``export`` writes the admitted environments of a run or a pool, with their metadata and play
statistics, as a JSONL or Parquet dataset (:mod:`spade.pool.export`, docs/export.md);
``import`` reads such an export back into a pool directory as well as the paper's released pool.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from .common import UsageError

ISOLATION_VARIABLE = "SPADE_SANDBOX_ISOLATION"


def add_parser(subparsers: Any) -> None:
    pool = subparsers.add_parser("pool", help="generate, assemble, import or export a static environment pool "
                                              "(Fixed-env GRPO)")
    commands = pool.add_subparsers(dest="pool_command", metavar="COMMAND", required=True)

    generate = commands.add_parser(
        "generate", help="write N admitted environments with a designer model (resumable)",
        description="Generate a static pool through the training's designer prompts, admission and hint calls.")
    generate.add_argument("--designer", required=True, metavar="MODEL|URL",
                          help="a local model: a Hugging Face directory, 'embedded' (the demo model), a spade "
                               "checkpoint or a run directory (its newest intact checkpoint); or the base URL "
                               "of an OpenAI-compatible endpoint (http:// or https://, usually ending in /v1)")
    generate.add_argument("--n", type=int, required=True, metavar="N", help="environments the pool should hold")
    generate.add_argument("--out", required=True, metavar="DIR", help="the pool directory (created; reruns continue)")
    generate.add_argument("--skills", metavar="A,B", help="comma-separated skill names (default: the config's "
                          "skills of its domain)")
    generate.add_argument("--config", metavar="YAML", help="a train config for the settings (default: the defaults)")
    generate.add_argument("--model", metavar="NAME", help="with a URL: the model the endpoint serves")
    generate.add_argument("--concurrency", type=int, metavar="C",
                          help="designer attempts in flight at once (default: selfplay.envs_per_set)")
    generate.add_argument("--max-attempts", type=int, metavar="M",
                          help="stop after M attempts in this invocation (default: 10 * N)")
    generate.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    generate.set_defaults(handler=run_generate)

    assemble = commands.add_parser("assemble", help="build a pool from the admitted environments of runs")
    assemble.add_argument("--from", dest="runs", nargs="+", required=True, metavar="RUN_DIR")
    assemble.add_argument("--out", required=True, metavar="DIR")
    assemble.add_argument("--steps", metavar="a:b", help="only environments generated at steps a <= step < b")
    assemble.set_defaults(handler=run_assemble)

    imported = commands.add_parser(
        "import", help="copy the released pool (a local copy of its files) or a spade export into a new pool "
                       "directory",
        description="Import the paper's released pool (spare-rl/spare-gpt55-static-corpus: games/game_*.py, "
                    "manifest.jsonl, checksums.sha256) into a new pool directory; checksums and manifest "
                    "hashes are verified, and nothing is left behind when a file is missing or malformed. "
                    "A directory written by 'spade pool export' (it holds spade_export.json) is read back "
                    "with its metadata and play statistics.")
    imported.add_argument("--from", dest="source", required=True, metavar="RELEASED_DIR|EXPORT_DIR",
                          help="the directory the data set was downloaded to, or its games/ directory; or a "
                               "'spade pool export' directory")
    imported.add_argument("--out", required=True, metavar="DIR", help="the pool directory to create (must not exist)")
    imported.add_argument("--expect", type=int, metavar="N",
                          help="refuse unless the copy holds exactly N games (the paper's pool: 7872)")
    imported.set_defaults(handler=run_import)

    exported = commands.add_parser(
        "export", help="write the admitted environments of a run or a pool as a JSONL/Parquet dataset",
        description="Write the admitted environments of a run directory (envs/step_N/) or a pool directory, "
                    "with hint, skill, step, seed document and play statistics, as a dataset that "
                    "datasets.load_dataset('json' or 'parquet', data_files=...) and 'spade pool import' read "
                    "(docs/export.md).")
    exported.add_argument("source", metavar="RUN_OR_POOL", help="a run directory or a pool directory")
    exported.add_argument("--out", required=True, metavar="DIR",
                          help="the dataset directory to create (must not exist)")
    exported.add_argument("--format", dest="fmt", choices=("jsonl", "parquet"), default="jsonl",
                          help="the data file's format (default jsonl)")
    exported.set_defaults(handler=run_export)


# ---------------------------------------------------------------------------- generate


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def _config(args: argparse.Namespace):
    from ..train_config import from_dict, load_train_config

    if args.config:
        return load_train_config(args.config, args.overrides)
    from ..train_config import apply_overrides
    return from_dict(apply_overrides({}, args.overrides))


def _skills(names: str | None, settings) -> list:
    from ..designer.skills import skill_by_name

    if names is None:
        return list(settings.skills.skill_list(settings.domain))
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    if not chosen:
        raise UsageError("--skills: give at least one skill name")
    try:
        return [skill_by_name(name) for name in chosen]
    except ValueError as exc:
        raise UsageError(f"--skills: {exc}") from None


def run_generate(args: argparse.Namespace) -> int:
    from ..config import ConfigError

    if args.n < 1:
        raise UsageError(f"--n: must be >= 1, got {args.n}")
    for flag in ("concurrency", "max_attempts"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')}: must be >= 1, got {value}")
    config = _config(args)
    settings = config.selfplay
    url = _is_url(args.designer)
    if url:
        from ..selfplay.sources.endpoint import EndpointSettings

        if not args.model:
            raise UsageError("--model: name the model the endpoint at --designer serves")
        base = settings.designer_endpoint
        values = {} if base is None else dataclasses.asdict(base)
        values.update(url=args.designer, model=args.model)
        settings = dataclasses.replace(settings, designer_endpoint=EndpointSettings(**values), train_designer=False)
    elif args.model:
        raise UsageError("--model: only with an endpoint URL as --designer (a model directory names itself)")
    if url:
        from ..selfplay.sources.text_generators import check_endpoint

        check_endpoint(settings.designer_endpoint)  # answers GET {url}/models with the key, before anything is written
    if settings.use_corpus and not config.corpus.paths:
        raise UsageError("corpus.paths is empty but selfplay.use_corpus is true: give a corpus in --config "
                         "(e.g. corpus.paths=[examples/corpus/demo.jsonl.gz]) or set selfplay.use_corpus=false")
    skills = _skills(args.skills, settings)
    origin: dict[str, Any] = {"designer": args.designer}
    if url:
        origin["model"] = args.model
    try:
        summary = asyncio.run(_generate(args, config, settings, skills, origin, url))
    except ConfigError as exc:  # e.g. the endpoint refused the request
        raise UsageError(str(exc)) from None
    if summary.complete:
        print(f"spade pool generate: {args.out} holds {summary.admitted} environments "
              f"({summary.admitted_now} new, {summary.attempts_now} attempts now, {summary.attempts} in all)",
              file=sys.stderr)
        return 0
    print(f"spade pool generate: stopped after {summary.attempts_now} attempts with {summary.admitted} of "
          f"{summary.requested} environments in {args.out}; rerun the same command to continue", file=sys.stderr)
    return 1


async def _generate(args, config, settings, skills, origin, url: bool):
    from ..designer.corpus import Corpus
    from ..designer.memory import Memory
    from ..envs.sandbox.client import SandboxService
    from ..pool.build import PoolGenerator

    out = Path(args.out)
    sandbox_config = config.sandbox
    isolation = os.environ.get(ISOLATION_VARIABLE)
    if isolation:
        sandbox_config = dataclasses.replace(sandbox_config, isolation=isolation)
    corpus = Corpus(config.corpus) if settings.use_corpus else None
    (out / "generation").mkdir(parents=True, exist_ok=True)
    memory = Memory(out / "generation" / "memory.sqlite", capacity=settings.memory_capacity) \
        if settings.use_memory else None
    engine = None
    designer: dict[str, Any] = dict(engine=None, tokenizer=None, chat_format=None, stop_token_ids=())
    try:
        if not url:
            engine, designer = await _local_designer(args.designer, config)
        async with await SandboxService.start(sandbox_config) as sandbox:
            generator = PoolGenerator(settings, out, n=args.n, skills=skills,
                                      concurrency=args.concurrency or settings.envs_per_set, origin=origin,
                                      report=lambda line: print(line, flush=True), sandbox=sandbox, corpus=corpus,
                                      memory=memory, seed=config.run.seed, **designer)
            return await generator.run(max_attempts=args.max_attempts or 10 * args.n)
    finally:
        if engine is not None:
            engine.close()
        if memory is not None:
            memory.close()


async def _local_designer(model: str, config) -> tuple[Any, dict[str, Any]]:
    """The engine on ``model`` as ``spade train`` opens it (``spade.run.engines``, from the config's
    ``engine:`` section and ``model.dtype``), with the tokenizer, chat format and stop tokens the
    orchestrator would use."""
    from ..rollout.conversation import ChatFormat, thinking_template_kwargs
    from ..run.engines import EngineSettings, ModelRefError, load_tokenizer, open_engine, report, resolve_model

    try:
        ref = resolve_model(model, key="--designer")
    except ModelRefError as exc:
        raise UsageError(f"{exc} (or an http(s) URL of an endpoint)") from None
    tokenizer = load_tokenizer(ref)
    try:
        kwargs = thinking_template_kwargs(tokenizer.chat_template, config.model.thinking)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    chat_format = ChatFormat(tokenizer, kwargs)
    first = chat_format.closing[0]
    stop = (first,) if first in set(getattr(tokenizer, "all_special_ids", ())) else ()
    settings = EngineSettings(config.engine, config.model.dtype)
    report("pool generate", ref, settings)
    try:
        opened = await open_engine(ref, settings, tokenizer=tokenizer)
    except ModelRefError as exc:
        raise UsageError(str(exc)) from None
    return opened.engine, dict(engine=opened.engine, tokenizer=tokenizer, chat_format=chat_format, stop_token_ids=stop)


# ---------------------------------------------------------------------------- assemble


def run_assemble(args: argparse.Namespace) -> int:
    from ..pool.build import assemble_pool, parse_steps

    try:
        steps = parse_steps(args.steps)
        summary = assemble_pool([Path(run) for run in args.runs], Path(args.out), steps=steps,
                                report=lambda line: print(line, flush=True))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"spade pool assemble: {summary.added} environments added to {args.out} from {summary.runs} run(s) "
          f"({summary.skipped_duplicates} duplicate sources skipped)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------- import


def run_import(args: argparse.Namespace) -> int:
    from ..pool.export import is_export
    from ..pool.released import PAPER_POOL_SIZE, PoolImportError, import_released_pool

    if args.expect is not None and args.expect < 1:
        raise UsageError(f"--expect: must be >= 1, got {args.expect}")
    if is_export(args.source):
        return _import_export(args)
    try:
        summary = import_released_pool(Path(args.source), Path(args.out), expect=args.expect,
                                       report=lambda line: print(line, file=sys.stderr, flush=True))
    except (PoolImportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    skills = ", ".join(f"{skill} {count}" for skill, count in sorted(summary.per_skill.items()))
    print(f"spade pool import: {summary.total} environments into {summary.out} ({skills}); "
          f"{summary.checksums_verified} checksums verified, {summary.manifest_records} manifest records",
          file=sys.stderr)
    if summary.total != PAPER_POOL_SIZE:
        print(f"spade pool import: note: the paper's pool holds {PAPER_POOL_SIZE} environments", file=sys.stderr)
    return 0


def _import_export(args: argparse.Namespace) -> int:
    from ..pool.export import PoolExportError, import_export

    try:
        summary = import_export(Path(args.source), Path(args.out), expect=args.expect)
    except (PoolExportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    skills = ", ".join(f"{skill} {count}" for skill, count in sorted(summary.per_skill.items()))
    print(f"spade pool import: {summary.total} environments into {summary.out} ({skills}) from the export "
          f"{args.source}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------- export


def run_export(args: argparse.Namespace) -> int:
    from ..pool.export import PoolExportError, export_dataset

    try:
        summary = export_dataset(Path(args.source), Path(args.out), fmt=args.fmt)
    except (PoolExportError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(f"spade pool export: {summary.rows} environments of the {summary.kind} {args.source} into "
          f"{summary.data_file} ({summary.with_plays} with play statistics)", file=sys.stderr)
    return 0
