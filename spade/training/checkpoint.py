"""Save and load training checkpoints in Megatron's distributed checkpoint format, with the HF files
beside them.

A checkpoint directory ``DIR`` holds:

* ``spade_checkpoint.json``: what the checkpoint is (``checkpoint_info.py``: step, architecture,
  HF config, parallel layout, contents); read it with ``read_checkpoint_info``;
* the files of ONE ``megatron.core.dist_checkpointing.save`` (torch_dist backend) of the combined
  sharded state dict ``{"model": ..., "optimizer": ..., "rng_state": ...}`` (several virtual
  pipeline chunks are stored as ``model0``, ``model1``, ...);
* ``hf/``: ``config.json`` (the ``hf_config`` given at save time) and the tokenizer files copied
  from the source HF directory, which export and scoring need;
* ``spade_manifest.json``, written last: every other file's size and CRC-32
  (``checkpoint_manifest.py``, with ``verify_checkpoint``).

Model tensors are stored under Megatron's global sharded keys, so a checkpoint saved at one
TP/EP/PP layout loads at another (the vocabulary padding may differ: embedding and output layer
allow it). Optimizer state of the plain Megatron optimizer follows the model's sharding, so it
reshards across layouts too. The distributed optimizer is saved as ``dp_reshardable`` (its
internal bucket layout: loads at the same TP/PP/EP with any data-parallel size);
``distrib_optim_sharding="fully_reshardable"`` also reshards across TP/PP but fails to load
without Apex/TE in megatron-core 0.16.1 (torch Adam's per-parameter ``step``). Loading reads the
format back from the checkpoint's content metadata. Two 0.16.1 distributed-optimizer bugs on the
torch-Adam path (a fresh optimizer cannot build the state dict it loads into; loading shares one
``step`` tensor among all parameters) are fixed by ``megatron_patches.distrib_optimizer_steps``.

RNG state (``rng_state.py``) is restored exactly at the layout and world it was saved with,
otherwise reseeded from the step.

Saving is atomic: everything is written into ``DIR.tmp-<nonce>`` and renamed to ``DIR`` only when
complete, so an interrupted save never leaves a directory that passes ``read_checkpoint_info``.
The files are written in this process (``in_process_writes.py``).

An optimizer that has not stepped yet has no state (torch Adam creates it lazily); megatron-core
0.16.1 cannot load such a checkpoint into an optimizer (``Different dict keys encountered in
apply_factory_merges``). The info file records ``"optimizer_state": false`` then, and loading leaves
the optimizer as a fresh one is, which is what the first step after the save expects.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ..collectives import barrier, broadcast_object, gather_object_to_0
from ..durable_files import fsync_dir, write_json
from ..models import ParallelLayout, read_model_spec
from .checkpoint_info import (FORMAT_VERSION, HF_SUBDIR, INFO_FILE, CheckpointError, CheckpointInfo, PathLike,
                              layout_to_json, read_checkpoint_info)
from .checkpoint_manifest import file_entry, write_manifest
from .hf_directory import copy_hf_side_files
from .in_process_writes import in_process_writes
from .rng_state import RNG_KEY, capture_rng, reseed, restore_rng, rng_grid, rng_object

log = logging.getLogger(__name__)

DISTRIB_OPTIM_SHARDINGS = ("fully_reshardable", "dp_reshardable")

ModelChunks = Union[torch.nn.Module, Sequence[torch.nn.Module]]


# ---------------------------------------------------------------------------- parallel state


def _chunks(model_chunks: ModelChunks) -> list[torch.nn.Module]:
    from megatron.core.utils import unwrap_model

    chunks = [model_chunks] if isinstance(model_chunks, torch.nn.Module) else list(model_chunks)
    if not chunks:
        raise ValueError("model_chunks is empty")
    return [unwrap_model(chunk) for chunk in chunks]


def _require_world() -> None:
    from megatron.core import parallel_state as ps

    if not dist.is_initialized() or not ps.model_parallel_is_initialized():
        raise RuntimeError("checkpoints need torch.distributed and Megatron's parallel state "
                           "(initialize_model_parallel) to be initialised first")


def current_layout(model_chunks: ModelChunks) -> ParallelLayout:
    """The layout this process runs under, from Megatron's parallel state and the model config."""
    from megatron.core import parallel_state as ps

    config = getattr(_chunks(model_chunks)[0], "config", None)
    tp, etp = ps.get_tensor_model_parallel_world_size(), ps.get_expert_tensor_parallel_world_size()
    return ParallelLayout(
        tp=tp,
        pp=ps.get_pipeline_model_parallel_world_size(),
        ep=ps.get_expert_model_parallel_world_size(),
        etp=None if etp == tp else etp,
        sequence_parallel=bool(getattr(config, "sequence_parallel", False)),
    )


def _same_sizes(a: ParallelLayout, b: ParallelLayout) -> bool:
    return (a.tp, a.pp, a.ep, a.expert_tp) == (b.tp, b.pp, b.ep, b.expert_tp)


# ---------------------------------------------------------------------------- state dicts


def _model_sharded_state(chunks: list[torch.nn.Module]) -> dict[str, Any]:
    if len(chunks) == 1:
        return {"model": chunks[0].sharded_state_dict()}
    return {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}


def _uses_distributed_optimizer(optimizer: Any) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    return any(isinstance(o, DistributedOptimizer) for o in inner)


def _optimizer_metadata(optimizer: Any, sharding: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"chained_optim_avoid_prefix": True}
    if _uses_distributed_optimizer(optimizer):
        metadata["distrib_optim_sharding_type"] = sharding
    return metadata


def _optimizer_has_state(optimizer: Any) -> bool:
    """False when no inner torch optimizer holds any per-parameter state yet (before the first
    step); optimizers of an unknown kind are taken to have state."""
    inner = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for each in inner:
        state = getattr(getattr(each, "optimizer", None), "state", None)
        if not isinstance(state, Mapping):
            return True
        if any(len(per_param) for per_param in state.values()):
            return True
    return False


def _is_optional_key(key: str) -> bool:
    """Checkpoint keys a model-only load may leave unread: optimizer and RNG state."""
    return key == RNG_KEY or key.startswith("optimizer.") or key.startswith("chained_")


# ---------------------------------------------------------------------------- save


def save_checkpoint(
    directory: PathLike,
    model_chunks: ModelChunks,
    *,
    hf_config: Mapping[str, Any],
    layout: ParallelLayout,
    step: int = 0,
    optimizer: Any = None,
    save_rng: bool = True,
    tokenizer_dir: Optional[PathLike] = None,
    distrib_optim_sharding: str = "dp_reshardable",
) -> None:
    """Save model (and optimizer, RNG) state to ``directory``; every rank calls it.

    ``directory`` is replaced if it already holds a spade checkpoint (or is empty); any other
    existing path is refused. ``tokenizer_dir`` (usually the source HF directory) provides the
    tokenizer files copied into ``DIR/hf``.
    """
    from megatron.core import dist_checkpointing
    from megatron.core import package_info

    import megatron_patches

    _require_world()
    if distrib_optim_sharding not in DISTRIB_OPTIM_SHARDINGS:
        raise ValueError(f"distrib_optim_sharding must be one of {DISTRIB_OPTIM_SHARDINGS}")
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    chunks = _chunks(model_chunks)
    running = current_layout(chunks)
    if not _same_sizes(layout, running) or layout.sequence_parallel != running.sequence_parallel:
        raise ValueError(f"layout {layout} does not match the running parallel state {running}")
    architecture = read_model_spec(dict(hf_config)).architecture
    target = Path(directory).absolute()
    contents = ["model"] + (["optimizer"] if optimizer is not None else []) + (["rng"] if save_rng else [])

    problem, staging = None, None
    if dist.get_rank() == 0:
        problem = _replace_problem(target)
        staging = f"{target}.tmp-{uuid.uuid4().hex[:12]}"
    problem, staging = broadcast_object((problem, staging))
    if problem:
        raise CheckpointError(problem)
    staging_dir = Path(staging)
    if dist.get_rank() == 0:
        staging_dir.mkdir(parents=True)
    barrier()
    try:
        content_metadata: dict[str, Any] = {"spade_format_version": FORMAT_VERSION,
                                            "rng_grid": list(rng_grid()[0])}
        rng_state = capture_rng() if save_rng else None  # before anything else draws numbers
        # before sharded_state_dict, which fills a distributed optimizer's state with placeholders
        optimizer_state = None if optimizer is None else _optimizer_has_state(optimizer)
        with megatron_patches.cpu_device_mode():
            state = _model_sharded_state(chunks)
            if optimizer is not None:
                metadata = _optimizer_metadata(optimizer, distrib_optim_sharding)
                content_metadata["optimizer_metadata"] = metadata
                state["optimizer"] = optimizer.sharded_state_dict(
                    dict(state), is_loading=False, metadata=metadata)
            if save_rng:
                state["rng_state"] = rng_object(rng_state)
            with in_process_writes() as written:
                dist_checkpointing.save(state, str(staging_dir), content_metadata=content_metadata)
        # each rank checksums the files it wrote; rank 0 the rest, and writes the manifest last
        mine = {str(Path(f).relative_to(staging_dir)): file_entry(Path(f)) for f in written}
        gathered = gather_object_to_0(mine)
        failure: Optional[BaseException] = None
        if dist.get_rank() == 0:
            info = CheckpointInfo(
                directory=target, step=step, architecture=architecture, hf_config=dict(hf_config),
                layout=running, contents=tuple(contents), megatron_core=package_info.__version__,
                optimizer_state=optimizer_state)
            try:
                _write_hf_dir(staging_dir / HF_SUBDIR, hf_config, tokenizer_dir)
                write_json(staging_dir / INFO_FILE, info.to_json())
                known = {name: entry for part in gathered or [] for name, entry in part.items()}
                write_manifest(staging_dir, known)  # last: what a complete checkpoint holds
                _install(staging_dir, target)
            except Exception as exc:  # noqa: BLE001  (told to every rank, then re-raised)
                failure = exc
        message = broadcast_object(None if failure is None else f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
        if message is not None:
            raise CheckpointError(f"rank 0 could not finish the checkpoint {target}: {message}")
    except BaseException:
        if dist.get_rank() == 0:
            shutil.rmtree(staging_dir, ignore_errors=True)
        raise


def _replace_problem(target: Path) -> Optional[str]:
    if not target.exists():
        return None
    if not target.is_dir():
        return f"cannot save a checkpoint to {target}: it exists and is not a directory"
    if (target / INFO_FILE).is_file() or next(target.iterdir(), None) is None:
        return None
    return (f"cannot save a checkpoint to {target}: it is a non-empty directory that is not a "
            f"spade checkpoint")



def _write_hf_dir(hf_dir: Path, hf_config: Mapping[str, Any], tokenizer_dir: Optional[PathLike]) -> None:
    hf_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        copy_hf_side_files(tokenizer_dir, hf_dir, skip=("config.json",))
    write_json(hf_dir / "config.json", dict(hf_config))


def _install(staging: Path, target: Path) -> None:
    """Rename the complete staging directory to ``target``, replacing an old checkpoint there."""
    fsync_dir(staging)
    old = None
    if target.exists():
        old = target.with_name(f"{target.name}.old-{uuid.uuid4().hex[:12]}")
        os.rename(target, old)
    os.rename(staging, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)



# ---------------------------------------------------------------------------- load


def load_checkpoint(
    directory: PathLike,
    model_chunks: ModelChunks,
    *,
    optimizer: Any = None,
    load_rng: bool = True,
    strict: bool = True,
) -> CheckpointInfo:
    """Load a checkpoint into this rank's model chunks (and optimizer, RNG); every rank calls it.

    The running layout may differ from the saved one. ``strict``: a checkpoint that lacks model
    tensors (or requested optimizer state), or holds model tensors this model does not have,
    is an error; otherwise these are logged and skipped.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    import megatron_patches

    info = read_checkpoint_info(directory)
    _require_world()
    chunks = _chunks(model_chunks)
    path = str(info.directory)
    content_metadata = dist_checkpointing.load_content_metadata(path) or {}

    load_optimizer = optimizer is not None
    if load_optimizer and "optimizer" not in info.contents:
        if strict:
            raise CheckpointError(f"checkpoint {path} holds no optimizer state (contents: "
                                  f"{list(info.contents)}); pass optimizer=None or strict=False")
        log.warning("checkpoint %s holds no optimizer state; the optimizer starts fresh", path)
        load_optimizer = False
    if load_optimizer and (info.optimizer_state is False
                           or (info.optimizer_state is None and not _has_optimizer_tensors(path))):
        # saved before the optimizer's first step: nothing to load, and megatron-core 0.16.1 cannot
        # load an empty state into an optimizer; a fresh optimizer is what the next step expects
        log.info("checkpoint %s was saved before the optimizer's first step: the optimizer starts fresh",
                 path)
        load_optimizer = False
    with torch.no_grad(), megatron_patches.cpu_device_mode():
        state = _model_sharded_state(chunks)
        if load_optimizer:
            megatron_patches.distrib_optimizer_steps.apply()  # idempotent; apply_all() does it too
            state["optimizer"] = optimizer.sharded_state_dict(
                dict(state), is_loading=True, metadata=content_metadata.get("optimizer_metadata", {}))

    use_saved_rng, why = False, ""
    if load_rng:
        running = current_layout(chunks)
        if "rng" not in info.contents:
            why = "the checkpoint holds no RNG state"
        elif not _same_sizes(info.layout, running) or content_metadata.get("rng_grid") != list(rng_grid()[0]):
            why = (f"saved at {layout_to_json(info.layout)} on rank grid "
                   f"{content_metadata.get('rng_grid')}, loading at {layout_to_json(running)} on "
                   f"{list(rng_grid()[0])}")
        else:
            use_saved_rng = True
            state["rng_state"] = rng_object(None)

    with torch.no_grad(), megatron_patches.cpu_device_mode():
        loaded, checkpoint_only, request_only = dist_checkpointing.load(
            state, path, strict=StrictHandling.RETURN_ALL)
    _check_mismatch(path, checkpoint_only, request_only, strict)

    for key, chunk in zip(_model_keys(len(chunks)), chunks):
        result = chunk.load_state_dict(loaded[key], strict=strict)
        if not strict and (result.missing_keys or result.unexpected_keys):
            log.warning("checkpoint %s: model keys not loaded %s, unexpected %s", path,
                        result.missing_keys[:5], result.unexpected_keys[:5])
    if load_optimizer:
        with torch.no_grad(), megatron_patches.cpu_device_mode():
            optimizer.load_state_dict(loaded["optimizer"])
    elif optimizer is not None and hasattr(optimizer, "reload_model_params"):
        optimizer.reload_model_params()  # main (fp32) params follow the loaded model
    if use_saved_rng:
        restore_rng(loaded["rng_state"])
    elif load_rng:
        reseed(info.step, why)
    return info


def _has_optimizer_tensors(path: str) -> bool:
    """For checkpoints that predate ``optimizer_state`` in the info file: whether any optimizer
    tensor was saved (none are before the first step of the plain optimizer)."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        keys = FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception:  # noqa: BLE001  (unreadable: let the load report it)
        return True
    return any(key.startswith("optimizer.") for key in keys)


def _model_keys(count: int) -> list[str]:
    return ["model"] if count == 1 else [f"model{i}" for i in range(count)]


def _check_mismatch(path: str, checkpoint_only: set, request_only: set, strict: bool) -> None:
    """``request_only``: wanted but absent from the checkpoint; ``checkpoint_only``: never read."""
    absent = sorted(request_only)
    extra = sorted(k for k in checkpoint_only if not _is_optional_key(k))
    if not absent and not extra:
        return
    message = (f"checkpoint {path} does not fit this model: missing from the checkpoint "
               f"{absent[:5]}{' ...' if len(absent) > 5 else ''}, in the checkpoint but not in the "
               f"model {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    if strict:
        raise CheckpointError(message)
    log.warning(message)
