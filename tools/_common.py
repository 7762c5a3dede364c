"""What the two checkpoint converters share: dtype names, safetensors dtype sniffing, shard writing,
a failure type that exits 2 with a one-line message.

Megatron world setup comes from ``spade.training.parallel.parallel_session`` (one process, or the
world torchrun describes).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Mapping, Optional

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as `python tools/x.py` from a checkout without installing
    sys.path.insert(0, str(REPO))

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
}
_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


class ToolError(Exception):
    """A problem with the tool's inputs: reported on one line, exit status 2."""


def run(main, argv: Optional[list[str]] = None) -> int:
    """Call ``main(argv)``, turning ToolError into a message and exit status 2."""
    try:
        return main(argv)
    except ToolError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        return 2


def safetensors_dtype(hf_dir: Path) -> torch.dtype:
    """The one floating dtype of all tensors in an HF directory; float32 when they are mixed."""
    from safetensors import safe_open

    found: set[torch.dtype] = set()
    for file in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                code = handle.get_slice(name).get_dtype()
                found.add(_SAFETENSORS_DTYPES.get(code, torch.float32))
    return found.pop() if len(found) == 1 else torch.float32


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' or a number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ToolError(f"cannot read size {text!r} (examples: 5GB, 500MB, 1048576)")
    number, unit = float(match[1]), (match[2] or "B").upper()
    base = 1024 if "I" in unit else 1000
    power = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[0]]
    return int(number * base**power)


def write_safetensors_shards(tensors: Mapping[str, torch.Tensor], out_dir: Path, max_shard_bytes: int
                             ) -> list[str]:
    """Write ``tensors`` in order into shards of at most ``max_shard_bytes`` (a bigger tensor gets
    a shard of its own); one file ``model.safetensors``, or ``model-0000i-of-0000n.safetensors``
    plus ``model.safetensors.index.json`` as transformers writes them. Returns the file names."""
    from safetensors.torch import save_file

    groups: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    count = len(groups)
    files = (["model.safetensors"] if count == 1
             else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)])
    weight_map = {}
    for file, names in zip(files, groups):
        # own, contiguous storage per tensor: safetensors refuses tensors that share memory
        save_file({n: tensors[n].detach().cpu().contiguous().clone() for n in names},
                  str(out_dir / file), metadata={"format": "pt"})
        readable_as_umask_allows(out_dir / file)  # safetensors writes its files readable by the owner only
        weight_map.update((n, file) for n in names)
    if count > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def readable_as_umask_allows(path: Path) -> None:
    """Give ``path`` the mode a plain new file gets (0666 less the umask), so that other users and
    serving containers can read the weights as they read the config beside them."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def set_config_dtype(config_file: Path, dtype: torch.dtype) -> None:
    """Make ``config.json`` name the dtype the weights were written in (``dtype``, and the older
    ``torch_dtype`` where the file has it), as transformers, vLLM and SGLang read it for ``auto``."""
    data = json.loads(config_file.read_text())
    name = str(dtype).removeprefix("torch.")
    for key in [k for k in ("dtype", "torch_dtype") if k in data] or ["dtype"]:
        data[key] = name
    config_file.write_text(json.dumps(data, indent=2) + "\n")
