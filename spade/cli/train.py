"""``spade train``: self-play training from a config, or the continuation of a run directory.

    spade train --config examples/smoke_cpu.yaml [--run-dir DIR] [key.sub=value ...]
    spade train --resume DIR [run.steps=N]
    spade train --config FILE --check [key.sub=value ...]     # validate and print the resolved config

Known harmless warnings (Megatron-core without Transformer Engine / Apex on CPU) and model-loading
progress bars are hidden unless ``--show-warnings`` (``spade.run.console``); after the run rank 0
prints a summary with the next commands.

Under ``torchrun`` every rank runs the same command (``--run-dir`` is then required so all ranks
agree on it); rank 0 creates the run directory.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .common import UsageError

RESUME_OVERRIDABLE = ("run.steps",)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "train", help="self-play GRPO training (new run from --config, or --resume a run directory)",
        description="Self-play GRPO training. Overrides are key.sub=value with YAML values, e.g. run.steps=10.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE", help="YAML config (may 'include:' a base file)")
    source.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its newest checkpoint")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where the run lives (default: runs/<config name>-<date>-<time>)")
    parser.add_argument("--check", action="store_true",
                        help="validate the config, print it resolved, and exit without training")
    parser.add_argument("--show-warnings", action="store_true",
                        help="show the known harmless Megatron/Apex/Transformer Engine warnings and the progress "
                             "bars of model loading, hidden by default (also SPADE_SHOW_WARNINGS=1)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    parser.set_defaults(handler=run_train)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_train(args: argparse.Namespace) -> int:
    from ..run.console import quiet_known_noise

    quiet_known_noise(show=getattr(args, "show_warnings", False))
    started = time.perf_counter()
    from ..train_config import apply_overrides, from_dict, load_train_config, override_keys, read_config_file
    from ..run.run_dir import CONFIG_FILE, RunDir, RunDirError

    if args.resume:
        if args.run_dir:
            raise UsageError("--run-dir cannot be combined with --resume (the run directory is DIR)")
        run_dir = RunDir(args.resume)
        try:
            run_dir.require_existing()
        except RunDirError as exc:
            raise UsageError(str(exc)) from None
        refused = [key for key in override_keys(args.overrides) if key not in RESUME_OVERRIDABLE]
        if refused:
            raise UsageError(f"cannot override {', '.join(refused)} when resuming: a resumed run keeps the config "
                             f"it started with ({run_dir.config_path}); only {', '.join(RESUME_OVERRIDABLE)} "
                             "may change. Start a new run with --config to change anything else.")
        config = from_dict(apply_overrides(read_config_file(run_dir.config_path), args.overrides))
        if args.check:
            sys.stdout.write(config.to_yaml())
            return 0
        if args.overrides and _rank() == 0:
            run_dir.write_config(config.to_yaml())
        resume = True
    else:
        config = load_train_config(args.config, args.overrides)
        if args.check:
            sys.stdout.write(config.to_yaml())
            return 0
        if args.run_dir is None:
            if _world() > 1:
                raise UsageError("under torchrun, give --run-dir so that every rank uses the same directory")
            args.run_dir = str(Path("runs") / f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir = RunDir(args.run_dir)
        if _rank() == 0:
            try:
                run_dir.create(config.to_yaml())
            except RunDirError as exc:
                raise UsageError(str(exc)) from None
            print(f"spade train: run directory {run_dir.root} ({CONFIG_FILE} written)", file=sys.stderr)
        resume = False

    from ..run.trainer import train

    try:
        train(config, run_dir.root, resume=resume)
    except RunDirError as exc:
        raise UsageError(str(exc)) from None
    if _rank() == 0:
        from ..run.console import run_summary

        print(run_summary(run_dir.root, wall_s=time.perf_counter() - started), file=sys.stderr)
    return 0
