"""The limits a sandboxed child runs under, as they travel (JSON) from the supervisor to the zygote."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Standard-library modules a generated environment may import. The import gate is a quality
# check that names the problem (import_blocked); the OS layers are what contain hostile code.
DEFAULT_ALLOWED_IMPORTS = (
    "abc", "array", "bisect", "calendar", "cmath", "collections", "contextlib", "copy", "dataclasses",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools", "graphlib", "hashlib", "heapq",
    "itertools", "json", "math", "numbers", "operator", "pprint", "random", "re", "statistics",
    "string", "struct", "sys", "textwrap", "time", "types", "typing", "unicodedata", "warnings",
    "__future__",
)


@dataclass(frozen=True)
class ChildLimits:
    memory_bytes: int = 1 << 30
    cpu_seconds: int = 60
    open_files: int = 64
    file_size_bytes: int = 0
    recursion_limit: int = 2000
    max_observation_chars: int = 65_536
    max_frame_bytes: int = 1 << 20
    max_captured_output_bytes: int = 16_384
    allowed_imports: tuple[str, ...] = DEFAULT_ALLOWED_IMPORTS
    readable_paths: tuple[str, ...] = field(default_factory=tuple)
    require_landlock: bool = True
    require_seccomp: bool = True

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["allowed_imports"] = list(self.allowed_imports)
        data["readable_paths"] = list(self.readable_paths)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ChildLimits":
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for key in ("allowed_imports", "readable_paths"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)
