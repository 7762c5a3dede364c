"""``spade train``: self-play training from a config, or the continuation of a run directory.

    spade train --config examples/smoke_cpu.yaml [--run-dir DIR] [key.sub=value ...]
    spade train --resume DIR [run.steps=N] [a later phase: selfplay.max_context_tokens=N selfplay.rewards.plateau_*=X]
    spade train --config FILE --check [key.sub=value ...]     # the checks of a start, the resolved config, OK

Exit status: 0 trained (or ``--check``), 2 a usage or config error, 3 the sandbox cannot run, 4
nothing to do: ``--resume`` of a run whose checkpoint to resume from is at or past ``run.steps``
(the line on stderr says which step it finished and the ``run.steps=M`` that continues it; told
before the model is loaded), 130 / 143 interrupted (SIGINT / SIGTERM).

Ctrl-C (a single process): the first prints at once what will happen ("stopping after step N's
checkpoint ..., about X s; Ctrl-C again to stop now") and the run ends after that step's
checkpoint; a second stops now. Either way the last line names the step ``--resume`` starts at,
or says there is no checkpoint yet (``spade.run.stop``). Under torchrun Ctrl-C stops at once.

Known harmless warnings (Megatron-core without Transformer Engine / Apex on CPU) and model-loading
progress bars are hidden unless ``--show-warnings`` (``spade.run.console``); after the run rank 0
prints a summary with the next commands.

Under ``torchrun`` every rank runs the same command (``--run-dir`` is then required so all ranks
agree on it); rank 0 creates the run directory. Each rank dies with torchrun, however torchrun dies
(``_die_with_torchrun``); the rank's own children (sandbox supervisor, rollout servers, checkpoint
writers) die with the rank the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .common import UsageError

# What ``--resume`` may change: the length of the run, and the keys of a later training phase of
# the same run (the paper's 4B runs moved to a 49,152-token context and a plateau band of
# [0.2, 0.4] with ramp 0.2: examples/recipes/qwen3_4b_games_8gpu_phase2.yaml). The resumed delay
# buffer scores the designer samples still pending with the new band. Everything else is refused.
PHASE_OVERRIDABLE = ("selfplay.max_context_tokens", "selfplay.rewards.plateau_lo", "selfplay.rewards.plateau_hi",
                     "selfplay.rewards.plateau_ramp")
RESUME_OVERRIDABLE = ("run.steps", *PHASE_OVERRIDABLE)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# ``--resume`` of a run with no step left: not a usage error (2) nor a failure (1), so that a
# script retrying a resume until it succeeds can tell "already finished" apart.
EXIT_NOTHING_TO_DO = 4


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
                        help="run the checks a start runs (config, model directory and chat template, corpus, "
                             "pool, seed folder, sandbox), print the resolved config and one OK line, and exit "
                             "without training")
    parser.add_argument("--allow-defaults", action="store_true",
                        help="accept a config file that sets nothing (a paper-scale run with every default)")
    parser.add_argument("--show-warnings", action="store_true",
                        help="show the known harmless Megatron/Apex/Transformer Engine warnings and the progress "
                             "bars of model loading, hidden by default (also SPADE_SHOW_WARNINGS=1)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    parser.set_defaults(handler=run_train)


@contextlib.contextmanager
def _interrupts_say_how_to_resume(root: Path):
    """SIGINT and SIGTERM stop the run (exit 130 / 143) naming the step a resume starts from: after
    a first Ctrl-C the run checkpoints the step in progress (``spade.run.stop``); after a second
    one, or SIGTERM, the newest intact checkpoint counts, or there is none yet."""
    from ..run.stop import StopRequested

    try:
        yield
    except StopRequested as stopped:
        if _rank() == 0:
            from ..selfplay.step import Step

            print(f"\nspade train: stopped after step {Step(stopped.done).last_run} and its checkpoint "
                  f"(checkpoints/step_{stopped.done}). Continue at step {stopped.done} with:\n"
                  f"  spade train --resume {root}", file=sys.stderr)
        raise SystemExit(130) from None
    except (KeyboardInterrupt, _Terminated) as exc:
        if _rank() == 0:
            print(f"\nspade train: stopped. {_resume_point(root)}", file=sys.stderr)
        raise SystemExit(143 if isinstance(exc, _Terminated) else 130) from None


def _resume_point(root: Path) -> str:
    """Where ``spade train --resume root`` starts: the newest intact checkpoint, or step 0."""
    from ..run.run_dir import RunDir

    with contextlib.suppress(Exception):  # a half-written directory: say nothing wrong
        done, _ = RunDir(root).newest_intact_checkpoint()
        if done is not None:
            return (f"Continue at step {done} (checkpoints/step_{done}, the newest complete checkpoint) with:\n"
                    f"  spade train --resume {root}")
    return (f"No checkpoint yet: nothing to continue from; spade train --resume {root} starts again at step 0, "
            "or start a new run")


def _terminate_by_exception():
    """SIGTERM raises ``_Terminated`` in the main thread, so the run unwinds (servers, sandbox and
    writers closed by their ``finally`` blocks) like after Ctrl-C."""
    def on_term(signum, frame):  # noqa: ARG001
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the unwinding short
        raise _Terminated()

    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, on_term)  # the previous handler, restored afterwards
    return None


class _Terminated(BaseException):
    """A BaseException, as KeyboardInterrupt is: the ``except Exception`` blocks of libraries (an
    import fallback, a retry loop) would otherwise swallow it and the run would go on."""


def _checked(check, config, error: type) -> None:
    try:
        check(config)
    except error as exc:
        raise UsageError(str(exc)) from None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _snapshot(data: dict) -> dict:
    """A run's config snapshot in today's key names (a run started before issue 15 wrote the old
    names of the per-environment designer reward: :func:`~spade.selfplay.rewards.reward_settings.upgrade_reward_settings`)."""
    from ..selfplay.rewards.reward_settings import upgrade_reward_settings

    rewards = data.get("selfplay", {}).get("rewards") if isinstance(data.get("selfplay"), dict) else None
    if isinstance(rewards, dict):
        data["selfplay"]["rewards"] = upgrade_reward_settings(rewards)
    return data


def _nothing_left(run_dir, steps: int, checkpoint_every: int) -> str | None:
    """The "nothing to do" line when the checkpoint a resume starts from (the trainer's choice:
    the newest intact one, CRC-32s checked as it does) has ``steps`` or more updates done; None
    when there is a step to train. Nothing is loaded; no file is read unless a checkpoint that far exists."""
    if max(run_dir.checkpoint_steps(), default=-1) < steps:
        return None
    done, _ = run_dir.newest_intact_checkpoint()
    if done is None or done < steps:
        return None
    more = f"run.steps={done + checkpoint_every}"
    if done == steps:
        return (f"nothing to do: {run_dir.root} has run all {steps} steps (checkpoints/step_{done}); raise {more} "
                f"to continue (spade train --resume {run_dir.root} {more})")
    return (f"nothing to do: {run_dir.root} is at step {done}, past run.steps={steps}; raise {more} to continue "
            f"(spade train --resume {run_dir.root} {more})")


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _die_with_torchrun() -> None:
    """Under torchrun, have the kernel SIGKILL this rank when torchrun dies (its parent-death signal).

    torchrun starts every rank in a session of its own and stops them itself when it can; killed
    with SIGKILL it cannot, and the ranks would go on (holding the sandbox, servers and memory).
    A plain ``spade train`` arms nothing: its parent is a shell, which may leave on purpose."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != parent:  # torchrun died before the signal was armed
        os._exit(1)


def run_train(args: argparse.Namespace) -> int:
    _die_with_torchrun()
    from ..run.console import quiet_known_noise

    quiet_known_noise(show=getattr(args, "show_warnings", False))
    previous = _terminate_by_exception()
    try:
        return _run_train(args)
    except _Terminated:  # before the run directory was known: nothing to resume
        raise SystemExit(143) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _print_bf16_note(config) -> None:
    """What ``model.dtype: auto`` became (bf16 on CUDA or a CPU with native bf16, else fp32), or a
    note when an explicit bf16 will be slow on this CPU."""
    import torch

    from ..run.engines import resolve_dtype
    from ..run.preflight import cpu_bf16_note, cpu_has_native_bf16

    cuda = torch.cuda.is_available()
    line = resolve_dtype(config.model.dtype, "cuda" if cuda else "cpu").line()
    if line:
        print(f"spade train: {line}", file=sys.stderr)
    note = cpu_bf16_note(config, cuda=cuda, native_bf16=cpu_has_native_bf16())
    if note:
        print(f"spade train: note: {note}", file=sys.stderr)


def _check_ok(config, what: str) -> int:
    """``--check``: the resolved config on stdout, then one line saying the run can start."""
    sys.stdout.write(config.to_yaml())
    sys.stdout.flush()
    print(f"spade train: check OK: {what} (model {config.model.hf_dir}, {config.run.steps} steps, engine "
          f"{config.engine.kind})", file=sys.stderr)
    return 0


def _refuse_file_run_dir(path: str | None) -> None:
    """A ``--run-dir`` that is a file, or lies under one, cannot be made a directory."""
    if path is None:
        return
    existing = next((p for p in (Path(path), *Path(path).absolute().parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == Path(path) else f"lies under the file {existing}"
        raise UsageError(f"--run-dir {path}: {where}, not a directory; choose another --run-dir")


def _run_train(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from ..train_config import apply_overrides, from_dict, load_train_config, override_keys, read_config_file
    from ..run.preflight import check_real_corpus, preflight, sandbox_self_test
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
        config = from_dict(apply_overrides(_snapshot(read_config_file(run_dir.config_path)), args.overrides))
        finished = _nothing_left(run_dir, config.run.steps, config.run.checkpoint_every)
        if finished is not None and not args.check:  # before preflight and the model: no step to train
            if _rank() == 0:
                print(f"spade train: {finished}", file=sys.stderr)
            return EXIT_NOTHING_TO_DO
        _checked(preflight, config, RunDirError)
        if args.check:
            return _check_ok(config, f"{run_dir.root} can resume" if finished is None else finished)
        resume = True
    else:
        if not read_config_file(args.config) and not getattr(args, "allow_defaults", False):
            raise UsageError(f"{args.config} sets nothing: that would start a paper-scale run (400 steps, 24 "
                             "environments, Qwen3 settings) with every default. Give a config with at least the "
                             "model, or pass --allow-defaults to mean it")
        _refuse_file_run_dir(args.run_dir)
        config = load_train_config(args.config, args.overrides)
        _checked(lambda c: check_real_corpus(c, args.config), config, RunDirError)
        # --check runs the same checks as a start: before the run directory exists, nothing is left behind
        _checked(preflight, config, RunDirError)
        if _rank() == 0:  # the sandbox lives on rank 0; exit 3 naming the missing layer, nothing written
            sandbox_self_test(config)
        # rank 0 alone: it writes the directory, and another rank that starts later would find its config
        if _rank() == 0 and args.run_dir is not None and RunDir(args.run_dir).config_path.exists():
            raise UsageError(f"{args.run_dir} already holds a run ({CONFIG_FILE} exists): continue it with "
                             f"'spade train --resume {args.run_dir}' or choose another --run-dir")
        if args.check:
            return _check_ok(config, f"{args.config} can start")
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
        resume = False

    from ..run.stop import GracefulStop
    from ..run.trainer import train

    # one process: a first Ctrl-C finishes the step and its checkpoint (under torchrun: stops now)
    stop = GracefulStop() if _world() == 1 else None
    with _interrupts_say_how_to_resume(run_dir.root):
        if stop is not None:
            stop.install()
        if not resume and _rank() == 0:
            print(f"spade train: run directory {run_dir.root} ({CONFIG_FILE} written)", file=sys.stderr)
        if _rank() == 0:
            _print_bf16_note(config)
        try:
            train(config, run_dir.root, resume=resume, stop=stop)
        except RunDirError as exc:
            raise UsageError(str(exc)) from None
        finally:
            if stop is not None:
                stop.uninstall()
    if resume and args.overrides and _rank() == 0:  # a failed resume leaves the run's config as it was
        run_dir.write_config(config.to_yaml())
    if _rank() == 0:
        from ..run.console import run_summary

        print(run_summary(run_dir.root, wall_s=time.perf_counter() - started), file=sys.stderr)
    return 0
