"""``spade analyze RUN_DIR... [--out DIR]``: the curriculum metrics of one or more runs (SPEC 6)
as JSON, CSV and PNG plots with the runs overlaid. See docs/analysis.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import UsageError, require_config_file, sandbox_config


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("analyze", help="curriculum metrics of runs: JSON, CSV and plots")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--out", metavar="DIR", help="where to write (default: RUN_DIR/analysis for one run, "
                        "./analysis for several)")
    parser.add_argument("--window", type=int, default=None, metavar="STEPS",
                        help="steps per window of the windowed numbers (default 40)")
    parser.add_argument("--embedding", choices=("minilm", "hashing"), default="minilm",
                        help="all-MiniLM-L6-v2 (default, as the paper) or a model-free hashing stand-in")
    parser.add_argument("--no-gating", action="store_true",
                        help="skip the state-gating replays (no sandbox needed)")
    parser.add_argument("--probe", action="store_true",
                        help="play the degenerate-policy probes in the sandbox on the saved environments of runs "
                        "whose admission did not (probes off, or runs older than them); a few hundred ms per "
                        "environment. The summary gives the share of environments each probe family wins")
    parser.add_argument("--probe-all", action="store_true",
                        help="with --probe: play today's probes on every saved environment, those a run's own "
                        "admission probed too (what today's families win among games older probes admitted)")
    parser.add_argument("--no-plots", action="store_true", help="JSON and CSV only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Vendi draws and the t-SNE layout")
    parser.add_argument("--config", metavar="FILE", help="YAML file whose 'sandbox:' section sets the limits")
    parser.add_argument("--isolation", choices=("bubblewrap", "unsafe-local"),
                        help="override sandbox.isolation (also: SPADE_SANDBOX_ISOLATION)")
    parser.set_defaults(handler=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    require_config_file(args.config)  # before the runs are read and the embeddings computed
    from ..analysis.embeddings import make_embedder
    from ..analysis.plots import plot_all
    from ..analysis.report import DEFAULT_WINDOW, analyze, run_line
    from ..analysis.run_reader import read_runs
    from ..analysis.state_gating import run_gating
    from ..analysis.writers import write_all

    for path in args.run_dirs:
        if not Path(path).is_dir():
            raise UsageError(f"no such run directory: {path}")
    window = args.window or DEFAULT_WINDOW
    if window < 1:
        raise UsageError("--window must be at least 1")
    out = Path(args.out) if args.out else (Path(args.run_dirs[0]) / "analysis" if len(args.run_dirs) == 1
                                           else Path("analysis"))

    def say(message: str) -> None:
        print(f"spade analyze: {message}", file=sys.stderr, flush=True)

    runs = read_runs(args.run_dirs)
    for run in runs:
        kept = sum(len(e.episodes) for e in run.envs)
        say(f"{run.name}: {len(run.envs)} environments over {len(run.regeneration_steps)} regeneration steps, "
            f"{len(run.rejections)} rejected candidates, {kept} kept episodes, {len(run.metrics)} metric rows")
    gating = None
    if not args.no_gating:
        envs = [env for run in runs for env in run.envs]
        say("state gating: replaying winning actions in the sandbox")
        gating = run_gating(envs, sandbox_config(args))
    probed = None
    if args.probe:
        from ..analysis.degenerate_share import recorded_verdicts, run_probes_after_the_fact

        say("degenerate-policy probes: playing the saved environments whose admission did not")
        probed = run_probes_after_the_fact(runs, sandbox_config(args),
                                           only_unknown=None if args.probe_all else recorded_verdicts(runs))
    analysis = analyze(runs, make_embedder(args.embedding), gating, window=window, seed=args.seed, progress=say,
                       probed=probed)
    written = write_all(analysis.data, out)
    if not args.no_plots:
        say("plots")
        written += plot_all(analysis.data, analysis.embeddings, out)
    for run in analysis.data["runs"]:
        print(run_line(run))
    print(f"wrote {len(written)} files to {out}")
    return 0

