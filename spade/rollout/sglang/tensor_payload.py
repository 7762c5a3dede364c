"""What a ``serialized_named_tensors`` entry of ``/update_weights_from_tensor`` may name: the
allow-list SGLang 0.5.23 unpickles it with, and ``payload_globals``, which lists the globals an
entry names without resolving any (the serialization itself is ``weight_transport``'s).
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from typing import Any, Union

# The globals a serialized_named_tensors entry may name. SGLang 0.5.23 decodes each entry with
# base64 (standard alphabet, strict: no newlines) and then ``SafeUnpickler``
# (srt/utils/common.py), a pickle.Unpickler whose find_class only resolves an exact allow-list of
# (module, name) pairs and raises for anything else. This is the part of that list a
# ``ForkingPickler`` dump of ``[(name, tensor), ...]`` made with torch's reducers can reach (torch's
# rebuild functions, tensor and storage classes, torch.Size, dtypes); SGLang allows more (plain
# builtins and collections, SGLang's own bucket classes, NPU variants), which our payloads do not
# need. A payload naming anything outside this set must not be sent.
_ALLOWED_DTYPES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2",
)
_ALLOWED_REBUILDS = (
    "rebuild_tensor", "rebuild_cuda_tensor", "rebuild_meta_tensor", "rebuild_nested_tensor",
    "rebuild_sparse_coo_tensor", "rebuild_sparse_compressed_tensor", "rebuild_storage_fd",
    "rebuild_storage_filename", "rebuild_storage_empty", "rebuild_typed_storage",
    "rebuild_typed_storage_child",
)
SGLANG_TENSOR_PAYLOAD_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [("torch", d) for d in _ALLOWED_DTYPES]
    + [("torch.multiprocessing.reductions", f) for f in _ALLOWED_REBUILDS]
    + [
        ("torch", "Tensor"), ("torch", "Size"), ("torch", "device"), ("torch", "dtype"),
        ("torch.nn.parameter", "Parameter"),
        ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
        ("torch", "UntypedStorage"),
        ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
        ("torch._tensor", "_rebuild_from_type_v2"),
        ("multiprocessing.resource_sharer", "DupFd"),  # the file_descriptor sharing strategy
        ("copyreg", "__newobj__"), ("collections", "OrderedDict"),
    ]
)


class _Placeholder:
    """Stands in for every global while listing a pickle's globals: nothing real is called."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> "_Placeholder":
        return _Placeholder()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _GlobalLister(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.names: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.names.add((module, name))
        return _Placeholder

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed in a tensor payload")


def payload_globals(entry: Union[str, bytes]) -> set[tuple[str, str]]:
    """The ``(module, name)`` globals a ``serialized_named_tensors`` entry names, found without
    resolving any of them. ``str`` is base64 text (decoded strictly, as SGLang does), ``bytes``
    the raw pickle. Every result must be in ``SGLANG_TENSOR_PAYLOAD_GLOBALS``."""
    if isinstance(entry, str):
        try:
            data = base64.b64decode(entry, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"not valid base64 ({exc})") from None
    else:
        data = bytes(entry)
    lister = _GlobalLister(data)
    lister.load()
    return lister.names
