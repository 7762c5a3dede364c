"""Training checkpoints in Megatron's distributed checkpoint format, plus the HF files beside them.

A checkpoint directory ``DIR`` holds:

* ``spade_checkpoint.json``: ``{"format_version": 1, "step", "architecture", "hf_config",
  "layout": {"tp", "pp", "ep", "etp", "sequence_parallel"}, "contents": ["model", "optimizer"?,
  "rng"?], "megatron_core"}``; read it with ``read_checkpoint_info``;
* the files of ONE ``megatron.core.dist_checkpointing.save`` (torch_dist backend) of the combined
  sharded state dict ``{"model": ..., "optimizer": ..., "rng_state": ...}`` (several virtual
  pipeline chunks are stored as ``model0``, ``model1``, ...);
* ``hf/``: ``config.json`` (the ``hf_config`` given at save time) and the tokenizer files copied
  from the source HF directory, which export and scoring need.

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

RNG state (python, numpy, torch CPU, CUDA when present, and Megatron's named tracker streams) is
one ShardedObject per rank, keyed by its (pipeline, tensor, data-parallel) coordinates. Loaded at
the layout and world it was saved with, it is restored exactly; otherwise it is reseeded from the
step (``RESEED_BASE + step``) and a note is logged.

Saving is atomic: everything is written into ``DIR.tmp-<nonce>`` and renamed to ``DIR`` only when
complete, so an interrupted save never leaves a directory that passes ``read_checkpoint_info``.
The last file written is ``spade_manifest.json``: every other file's relative path, size and CRC-32
(each rank checksums the files it wrote; rank 0 the rest). ``verify_checkpoint`` checks a directory
against it and names what is wrong (a file missing, truncated, changed, the manifest missing);
``add_to_manifest`` records files a caller adds afterwards (the trainer's ``trainer_state.json``), so
the manifest stays the last word on the directory. CRC-32 ran at about 2 GB/s on a busy 2-core CPU
machine (sha256: 0.5 GB/s); the files were just written, so reading them back mostly hits the page
cache.

The files are written in this process: megatron-core's filesystem writer would otherwise start a
``multiprocessing`` Manager (a spawned server process plus a resource tracker, which outlive a
killed trainer) and fork one writer per file. ``_in_process_writes`` swaps in a sequential writer
for the duration of a save.

An optimizer that has not stepped yet has no state (torch Adam creates it lazily); megatron-core
0.16.1 cannot load such a checkpoint into an optimizer (``Different dict keys encountered in
apply_factory_merges``). The info file records ``"optimizer_state": false`` then, and loading leaves
the optimizer as a fresh one is, which is what the first step after the save expects.

The module also reads HF safetensors directories (``read_hf_tensors``) and copies their non-weight
files (``copy_hf_side_files``), which the converters and ``spade score`` share.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import re
import shutil
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..collectives import barrier, broadcast_object, gather_object_to_0
from ..models import ModelSpec, ParallelLayout, read_model_spec

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
INFO_FILE = "spade_checkpoint.json"
MANIFEST_FILE = "spade_manifest.json"
MANIFEST_VERSION = 1
HF_SUBDIR = "hf"
RNG_KEY = "spade.rng_state"
RESEED_BASE = 1234  # reseed value when RNG state cannot be restored: RESEED_BASE + step
DISTRIB_OPTIM_SHARDINGS = ("fully_reshardable", "dp_reshardable")
_REQUIRED_KEYS = ("format_version", "step", "architecture", "hf_config", "layout", "contents",
                  "megatron_core")
_LAYOUT_KEYS = ("tp", "pp", "ep", "etp", "sequence_parallel")
_KNOWN_CONTENTS = ("model", "optimizer", "rng")

ModelChunks = Union[torch.nn.Module, Sequence[torch.nn.Module]]
PathLike = Union[str, "os.PathLike[str]"]


class CheckpointError(Exception):
    """A checkpoint directory is missing, incomplete, corrupt or does not fit the model."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """No checkpoint at the given path."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``spade_checkpoint.json`` says about one checkpoint directory."""

    directory: Path
    step: int
    architecture: str
    hf_config: Mapping[str, Any]
    layout: ParallelLayout
    contents: tuple[str, ...]
    megatron_core: str
    format_version: int = FORMAT_VERSION
    # False: saved before the optimizer's first step (no state to load); None: not recorded
    optimizer_state: Optional[bool] = None

    @property
    def hf_dir(self) -> Path:
        """``DIR/hf``: config.json and tokenizer files."""
        return self.directory / HF_SUBDIR

    def model_spec(self) -> ModelSpec:
        return read_model_spec(dict(self.hf_config))

    def to_json(self) -> dict[str, Any]:
        data = {
            "format_version": self.format_version,
            "step": self.step,
            "architecture": self.architecture,
            "hf_config": dict(self.hf_config),
            "layout": _layout_to_json(self.layout),
            "contents": list(self.contents),
            "megatron_core": self.megatron_core,
        }
        if self.optimizer_state is not None:
            data["optimizer_state"] = self.optimizer_state
        return data


# ---------------------------------------------------------------------------- info file


def _layout_to_json(layout: ParallelLayout) -> dict[str, Any]:
    return {"tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "etp": layout.expert_tp,
            "sequence_parallel": layout.sequence_parallel}


def _layout_from_json(data: Any) -> ParallelLayout:
    if not isinstance(data, Mapping) or set(_LAYOUT_KEYS) - data.keys():
        raise ValueError(f"layout must be an object with keys {list(_LAYOUT_KEYS)}, got {data!r}")
    sizes = {k: data[k] for k in ("tp", "pp", "ep", "etp")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes.values()):
        raise ValueError(f"layout sizes must be positive integers, got {sizes}")
    if not isinstance(data["sequence_parallel"], bool):
        raise ValueError(f"layout.sequence_parallel must be a boolean, got {data['sequence_parallel']!r}")
    if sizes["etp"] == sizes["tp"]:
        sizes["etp"] = None  # ParallelLayout's default (expert TP = TP), so layouts compare equal
    return ParallelLayout(**sizes, sequence_parallel=data["sequence_parallel"])


def read_checkpoint_info(directory: PathLike) -> CheckpointInfo:
    """Read and validate ``DIR/spade_checkpoint.json``; CheckpointError (naming DIR) if unusable."""
    path = Path(directory).absolute()
    if not path.exists():
        raise CheckpointNotFound(f"no checkpoint at {path}: the directory does not exist"
                                 f"{_leftovers_hint(path)}")
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}: not a directory")
    info_path = path / INFO_FILE
    if not info_path.is_file():
        raise CheckpointError(
            f"{path} is not a spade checkpoint: {INFO_FILE} is missing{_leftovers_hint(path)}")
    try:
        data = json.loads(info_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"corrupt checkpoint {path}: cannot read {INFO_FILE}: {exc}") from None
    try:
        info = _info_from_json(path, data)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"corrupt checkpoint {path}: {INFO_FILE}: {exc}") from None
    if not (path / "metadata.json").is_file():
        raise CheckpointError(
            f"corrupt checkpoint {path}: the distributed checkpoint files are missing (no metadata.json)")
    return info


def _leftovers_hint(path: Path) -> str:
    """Name what interrupted saves next to ``path`` left: DIR.tmp-* (unfinished), DIR.old-*
    (the previous checkpoint, when a replacing save stopped between its two renames)."""
    found = sorted(p.name for pattern in (".tmp-*", ".old-*") for p in path.parent.glob(path.name + pattern))
    return f" (left by interrupted saves: {', '.join(found)})" if found else ""


def _info_from_json(path: Path, data: Any) -> CheckpointInfo:
    if not isinstance(data, Mapping):
        raise ValueError("expected a JSON object")
    missing = [key for key in _REQUIRED_KEYS if key not in data]
    if missing:
        raise ValueError(f"missing keys {missing}")
    if data["format_version"] != FORMAT_VERSION:
        raise ValueError(f"format_version {data['format_version']!r} is not supported "
                         f"(this spade reads version {FORMAT_VERSION})")
    step = data["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    contents = data["contents"]
    if (not isinstance(contents, list) or "model" not in contents
            or any(c not in _KNOWN_CONTENTS for c in contents)):
        raise ValueError(f"contents must list 'model' and optionally 'optimizer', 'rng'; got {contents!r}")
    if not isinstance(data["hf_config"], Mapping):
        raise ValueError("hf_config must be an object")
    optimizer_state = data.get("optimizer_state")
    if optimizer_state is not None and not isinstance(optimizer_state, bool):
        raise ValueError(f"optimizer_state must be a boolean, got {optimizer_state!r}")
    return CheckpointInfo(
        directory=path,
        step=step,
        architecture=str(data["architecture"]),
        hf_config=dict(data["hf_config"]),
        layout=_layout_from_json(data["layout"]),
        contents=tuple(contents),
        megatron_core=str(data["megatron_core"]),
        format_version=data["format_version"],
        optimizer_state=optimizer_state,
    )


# ---------------------------------------------------------------------------- HF directory files

_WEIGHT_FILE = re.compile(
    r"\.(safetensors|bin|pt|pth|ckpt|gguf|h5|msgpack|onnx|npz)$|\.index\.json$")


def copy_hf_side_files(source: PathLike, destination: PathLike, *, skip: Iterable[str] = ()) -> list[str]:
    """Copy the top-level non-weight files (tokenizer, generation config, ...) of an HF directory."""
    source, destination = Path(source), Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    skipped = set(skip)
    copied = []
    for item in sorted(source.iterdir()):
        if (not item.is_file() or item.name.startswith(".") or item.name in skipped
                or _WEIGHT_FILE.search(item.name)):
            continue
        shutil.copyfile(item, destination / item.name)
        copied.append(item.name)
    return copied


def _safetensors_files(hf_dir: Path) -> dict[str, Path]:
    """Tensor name -> file, from the index when there is one."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: hf_dir / file for name, file in weight_map.items()}
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{hf_dir} holds no *.safetensors weights")
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            found.update((name, file) for name in handle.keys())
    return found


def read_hf_tensors(hf_dir: PathLike, spec: ModelSpec, names: Optional[Iterable[str]] = None
                    ) -> dict[str, Tensor]:
    """Checkpoint-named tensors from an HF safetensors directory (all, or only ``names``).

    Fused transformers-5 expert tensors, if a directory has them, are split into per-expert names.
    """
    from safetensors import safe_open

    from ..models.transformers_state import from_transformers_state

    hf_dir = Path(hf_dir)
    files = _safetensors_files(hf_dir)
    wanted = set(files) if names is None else set(names)
    if not wanted <= files.keys():
        wanted = set(files)  # e.g. fused expert tensors on disk: read all, translate below
    by_file: dict[Path, list[str]] = {}
    for name in sorted(wanted):
        by_file.setdefault(files[name], []).append(name)
    tensors: dict[str, Tensor] = {}
    for file, file_names in by_file.items():
        with safe_open(str(file), framework="pt") as handle:
            for name in file_names:
                tensors[name] = handle.get_tensor(name)
    return from_transformers_state(tensors, spec)


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


def _rng_grid() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global shape, this rank's offset) over (pipeline, tensor, data-parallel incl. context)."""
    from megatron.core import parallel_state as ps

    shape = (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size(),
             ps.get_data_parallel_world_size(with_context_parallel=True))
    offset = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(),
              ps.get_data_parallel_rank(with_context_parallel=True))
    return shape, offset


# ---------------------------------------------------------------------------- RNG state


def _capture_rng() -> dict[str, Any]:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        state["numpy"] = None
    return state


def _restore_rng(state: Mapping[str, Any]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if state.get("numpy") is not None:
        import numpy

        numpy.random.set_state(state["numpy"])
    get_cuda_rng_tracker().set_states(dict(state["tracker"]))


def _reseed(step: int, why: str) -> None:
    import megatron_patches

    seed = RESEED_BASE + step
    log.warning("RNG state not restored (%s); reseeded with seed %d (= %d + step)", why, seed,
                RESEED_BASE)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    megatron_patches.seed_model_parallel_rng(seed)


def _rng_object(data: Any):
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    shape, offset = _rng_grid()
    return ShardedObject(RNG_KEY, data, shape, offset, replica_id=0)


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


# ---------------------------------------------------------------------------- in-process writes


def _write_buckets_in_process(written: list[str], transform_list: list, use_msc: bool, rank: int,
                              write_buckets: list, global_results_queue: Any) -> None:
    """megatron-core's ``write_preloaded_data_multiproc`` without processes: the buckets (one file
    each) are written one after another here; the results go to the same queue in the same form."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    results: dict[int, Any] = {}
    for index, bucket in enumerate(write_buckets):
        local_results: queue.Queue = queue.Queue()
        count: queue.Queue = queue.Queue()
        count.put(index)
        FileSystemWriterAsync.write_preloaded_data(transform_list, index, bucket, local_results, count,
                                                   True, use_msc=use_msc)
        _, outcome = local_results.get_nowait()
        if isinstance(outcome, Exception):
            global_results_queue.put(outcome)
            return
        results[index] = outcome
        written.append(str(bucket[0]))
    global_results_queue.put(results)


@contextlib.contextmanager
def _in_process_writes():
    """During a ``dist_checkpointing.save``: write this rank's files in this process (no Manager,
    no resource tracker, no forked writers); yields the list of the files written."""
    import functools

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    writer = filesystem_async.FileSystemWriterAsync
    saved_queue = filesystem_async._get_write_results_queue
    saved_write = writer.__dict__["write_preloaded_data_multiproc"]
    written: list[str] = []
    filesystem_async._get_write_results_queue = queue.Queue
    writer.write_preloaded_data_multiproc = staticmethod(functools.partial(_write_buckets_in_process, written))
    try:
        yield written
    finally:
        filesystem_async._get_write_results_queue = saved_queue
        writer.write_preloaded_data_multiproc = saved_write


# ---------------------------------------------------------------------------- manifest


def _file_entry(path: Path) -> dict[str, Any]:
    crc = 0
    size = 0
    with open(path, "rb") as handle:
        while True:
            block = handle.read(1 << 24)
            if not block:
                break
            crc = zlib.crc32(block, crc)
            size += len(block)
    return {"size": size, "crc32": f"{crc:08x}"}


def _listed_files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() and p.name != MANIFEST_FILE)


def _write_manifest(directory: Path, entries: Mapping[str, Mapping[str, Any]]) -> None:
    """Write ``DIR/spade_manifest.json`` atomically (temp file, fsync, rename)."""
    tmp = directory / f".{MANIFEST_FILE}.tmp-{uuid.uuid4().hex[:8]}"
    _write_json(tmp, {"manifest_version": MANIFEST_VERSION, "checksum": "crc32",
                      "files": {name: dict(entries[name]) for name in sorted(entries)}})
    os.replace(tmp, directory / MANIFEST_FILE)
    fsync_dir(directory)


def write_manifest(directory: PathLike, known: Optional[Mapping[str, Mapping[str, Any]]] = None) -> dict:
    """Record every file under ``directory`` (size, CRC-32) in its manifest; ``known`` entries
    (relative path -> entry, e.g. computed by the rank that wrote the file) are not recomputed."""
    directory = Path(directory)
    known = dict(known or {})
    entries = {name: known.get(name) or _file_entry(directory / name) for name in _listed_files(directory)}
    _write_manifest(directory, entries)
    return entries


def read_manifest(directory: PathLike) -> dict[str, dict[str, Any]]:
    """The manifest's files (relative path -> {"size", "crc32"}); CheckpointError if unreadable."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory}: {MANIFEST_FILE} is missing (the save did not finish, or "
                              f"the checkpoint predates manifests)")
    try:
        data = json.loads(path.read_text())
        files = data["files"]
        if data.get("manifest_version") != MANIFEST_VERSION or not isinstance(files, dict):
            raise ValueError(f"unsupported manifest {data.get('manifest_version')!r}")
        return {str(k): {"size": int(v["size"]), "crc32": str(v["crc32"])} for k, v in files.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{directory}: {MANIFEST_FILE} is unreadable: {exc}") from None


def add_to_manifest(directory: PathLike, names: Iterable[str]) -> None:
    """Record files added to a saved checkpoint (relative paths), rewriting the manifest last."""
    directory = Path(directory)
    entries = read_manifest(directory)
    for name in names:
        entries[name] = _file_entry(directory / name)
    _write_manifest(directory, entries)


def verify_checkpoint(directory: PathLike, *, checksums: bool = True,
                      require: Iterable[str] = ()) -> list[str]:
    """What is wrong with a checkpoint directory against its manifest: [] when intact.

    Each problem names the file: missing, of another size (truncated), changed (CRC-32, only with
    ``checksums``), or not listed though ``require``d; or the manifest itself is missing or
    unreadable. Files that are present but not listed are ignored (nothing reads them).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return [f"{directory} does not exist"]
    try:
        entries = read_manifest(directory)
    except CheckpointError as exc:
        return [str(exc)]
    problems = [f"{directory}: {name} is not in {MANIFEST_FILE}" for name in require if name not in entries]
    for name, entry in entries.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{directory}: {name} is missing")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"{directory}: {name} has {size} bytes, the manifest says {entry['size']} "
                            f"(truncated or rewritten)")
        elif checksums and _file_entry(path)["crc32"] != entry["crc32"]:
            problems.append(f"{directory}: {name} does not match its CRC-32 in {MANIFEST_FILE} (corrupt)")
    return problems


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
                                            "rng_grid": list(_rng_grid()[0])}
        rng_state = _capture_rng() if save_rng else None  # before anything else draws numbers
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
                state["rng_state"] = _rng_object(rng_state)
            with _in_process_writes() as written:
                dist_checkpointing.save(state, str(staging_dir), content_metadata=content_metadata)
        # each rank checksums the files it wrote; rank 0 the rest, and writes the manifest last
        mine = {str(Path(f).relative_to(staging_dir)): _file_entry(Path(f)) for f in written}
        gathered = gather_object_to_0(mine)
        failure: Optional[BaseException] = None
        if dist.get_rank() == 0:
            info = CheckpointInfo(
                directory=target, step=step, architecture=architecture, hf_config=dict(hf_config),
                layout=running, contents=tuple(contents), megatron_core=package_info.__version__,
                optimizer_state=optimizer_state)
            try:
                _write_hf_dir(staging_dir / HF_SUBDIR, hf_config, tokenizer_dir)
                _write_json(staging_dir / INFO_FILE, info.to_json())
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


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def _write_hf_dir(hf_dir: Path, hf_config: Mapping[str, Any], tokenizer_dir: Optional[PathLike]) -> None:
    hf_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        copy_hf_side_files(tokenizer_dir, hf_dir, skip=("config.json",))
    _write_json(hf_dir / "config.json", dict(hf_config))


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


def fsync_dir(path: Path) -> None:
    """Make a rename or new file in ``path`` durable (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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

    restore_rng, why = False, ""
    if load_rng:
        running = current_layout(chunks)
        if "rng" not in info.contents:
            why = "the checkpoint holds no RNG state"
        elif not _same_sizes(info.layout, running) or content_metadata.get("rng_grid") != list(_rng_grid()[0]):
            why = (f"saved at {_layout_to_json(info.layout)} on rank grid "
                   f"{content_metadata.get('rng_grid')}, loading at {_layout_to_json(running)} on "
                   f"{list(_rng_grid()[0])}")
        else:
            restore_rng = True
            state["rng_state"] = _rng_object(None)

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
    if restore_rng:
        _restore_rng(loaded["rng_state"])
    elif load_rng:
        _reseed(info.step, why)
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
