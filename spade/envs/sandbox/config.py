"""Settings of the sandbox service (the ``sandbox:`` section of a config file)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from ...config import from_mapping, require
from .runtime.limits import DEFAULT_ALLOWED_IMPORTS, ChildLimits

Isolation = Literal["bubblewrap", "unsafe-local"]
NUMPY_MIN_MEMORY_MB = 256


@dataclass(frozen=True)
class SandboxConfig:
    """Every limit of the sandbox, with the defaults documented in the README.

    ``isolation: unsafe-local`` runs the zygote without bubblewrap (no namespaces, no uid change),
    keeping the layers the kernel offers (rlimits, Landlock, seccomp); every start warns.

    ``offer_numpy`` (default false; a reproduction of the released loader turns it on): generated
    code may import numpy, as the released loader's games could. The trainer's numpy is mounted
    read-only, made readable to each child, imported once in the zygote with one BLAS thread, and
    added to the import allow-list (:mod:`.launcher`, :mod:`.runtime.zygote`).
    """

    # bubblewrap (namespaces, non-root uid) or unsafe-local (no bubblewrap; rlimits, Landlock, seccomp only)
    isolation: Isolation = "bubblewrap"
    pool_size: int = 2  # sandboxes (each a bubblewrap container with its own zygote) the supervisor keeps
    max_envs_per_sandbox: int = 256  # environments one sandbox holds at once (pool capacity: pool_size x this)
    warm_children: int = 2  # pre-forked children each zygote keeps ready
    memory_limit_mb: int = 1024  # address-space limit of one environment's process
    cpu_limit_s: int = 60  # CPU seconds one environment's process may use in all
    open_files: int = 64  # file descriptors one environment's process may hold
    recursion_limit: int = 2000  # Python recursion limit inside the environment
    max_source_bytes: int = 512 * 1024  # largest generated program accepted
    # longest action sent to step(); a longer one is refused (the play stops, the policy's fault)
    max_action_chars: int = 262_144
    # longest observation (or tool schema list) accepted; a longer one is an output_too_large error
    max_observation_chars: int = 65_536
    max_frame_bytes: int = 1 << 20  # largest message on the supervisor socket
    max_captured_output_bytes: int = 16_384  # printed output kept for an error report
    load_timeout_s: float = 30.0  # seconds to import the program and build the class
    reset_timeout_s: float = 30.0  # seconds one reset() may take
    step_timeout_s: float = 30.0  # seconds one step() (or tool call) may take
    start_timeout_s: float = 60.0  # seconds the supervisor and its sandboxes may take to start
    # modules generated code may import (everything else fails at load with the import named)
    allowed_imports: tuple[str, ...] = DEFAULT_ALLOWED_IMPORTS
    offer_numpy: bool = False
    bwrap_path: str = "bwrap"  # the bubblewrap executable

    def __post_init__(self) -> None:
        for key in ("pool_size", "max_envs_per_sandbox", "memory_limit_mb", "cpu_limit_s", "open_files",
                    "recursion_limit", "max_source_bytes", "max_action_chars", "max_observation_chars",
                    "max_frame_bytes"):
            require(getattr(self, key) > 0, f"sandbox.{key}", "must be positive")
        require(self.warm_children >= 0, "sandbox.warm_children", "must be zero or more")
        require(self.max_captured_output_bytes >= 0, "sandbox.max_captured_output_bytes", "must be zero or more")
        require(self.recursion_limit >= 100, "sandbox.recursion_limit", "must be at least 100")
        require(self.open_files >= 16, "sandbox.open_files", "must be at least 16")
        require(self.memory_limit_mb >= 64, "sandbox.memory_limit_mb", "must be at least 64")
        require(isinstance(self.offer_numpy, bool), "sandbox.offer_numpy",
                f"must be true or false, got {self.offer_numpy!r}")
        require(not self.offer_numpy or self.memory_limit_mb >= NUMPY_MIN_MEMORY_MB, "sandbox.memory_limit_mb",
                f"must be at least {NUMPY_MIN_MEMORY_MB} with sandbox.offer_numpy (numpy and its OpenBLAS take "
                "about 85 MiB of each environment's address space)")
        for key in ("load_timeout_s", "reset_timeout_s", "step_timeout_s", "start_timeout_s"):
            require(getattr(self, key) > 0, f"sandbox.{key}", "must be positive")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, where: str = "sandbox") -> "SandboxConfig":
        return from_mapping(cls, data, where=where)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        data = asdict(self)
        data["allowed_imports"] = list(self.allowed_imports)
        return data

    @property
    def request_frame_bytes(self) -> int:
        """The largest client request: JSON may spend 12 bytes on one character (an escaped
        astral character), so a source or action at its limit always fits."""
        return 12 * max(self.max_source_bytes, self.max_action_chars) + 64 * 1024

    @property
    def imports_offered(self) -> tuple[str, ...]:
        """The import allow-list a child gets: ``allowed_imports``, and numpy with ``offer_numpy``."""
        extra = ("numpy",) if self.offer_numpy and "numpy" not in self.allowed_imports else ()
        return (*self.allowed_imports, *extra)

    def child_limits(self, readable_paths: tuple[str, ...]) -> ChildLimits:
        strict = self.isolation == "bubblewrap"
        return ChildLimits(
            memory_bytes=self.memory_limit_mb << 20,
            cpu_seconds=self.cpu_limit_s,
            open_files=self.open_files,
            recursion_limit=self.recursion_limit,
            max_observation_chars=self.max_observation_chars,
            max_frame_bytes=self.max_frame_bytes,
            max_captured_output_bytes=self.max_captured_output_bytes,
            allowed_imports=self.imports_offered,
            readable_paths=readable_paths,
            require_landlock=strict,
            require_seccomp=strict,
        )
