"""Constrained decoding for the hf engine with xgrammar (the grammar library SGLang uses).

``GrammarCompilerCache`` compiles a ``Constraint`` (JSON schema, regex, EBNF, structural tag) once
per engine against the tokenizer's vocabulary (``xgrammar.TokenizerInfo.from_huggingface`` with
the model's logits width and the engine's end-of-sequence ids as the grammar's end tokens) and
keeps compiled grammars by constraint; ``start`` gives one row its own ``GrammarState``: a
matcher whose token bitmask (on CPU) masks the row's logits before the softmax, advanced with
each sampled token. A row ends when its grammar accepts an end token. xgrammar is imported here
only, on the first constrained request (requirements/constrained.txt).

SGLang's xgrammar backend (``srt/constrained/xgrammar_backend.py``, 0.5.23) is followed: JSON
schemas compiled with ``any_whitespace`` (its default), regexes with ``compile_regex``, EBNF
with root rule ``root``, structural tags from their JSON.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch
from torch import Tensor

from ..engine import Constraint


class GrammarCompilerCache:
    """One tokenizer's grammar compiler and its compiled grammars (thread-safe)."""

    def __init__(self, tokenizer: Any, vocab_size: int, end_token_ids: Sequence[int]) -> None:
        import xgrammar

        if tokenizer is None:
            raise ValueError("constrained decoding needs the engine's tokenizer")
        self._xgr = xgrammar
        self.vocab_size = int(vocab_size)
        self.info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(end_token_ids) or None)
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=1)
        self._compiled: dict[Constraint, Any] = {}
        self._lock = threading.Lock()

    def compile(self, constraint: Constraint) -> Any:
        with self._lock:
            compiled = self._compiled.get(constraint)
            if compiled is None:
                compiled = self._compiled[constraint] = self._compile(constraint)
            return compiled

    def _compile(self, constraint: Constraint) -> Any:
        if constraint.kind == "json_schema":
            return self.compiler.compile_json_schema(constraint.spec, any_whitespace=True)
        if constraint.kind == "ebnf":
            return self.compiler.compile_grammar(constraint.spec)
        if constraint.kind == "regex":
            return self.compiler.compile_regex(constraint.spec)
        return self.compiler.compile_structural_tag(constraint.spec)

    def start(self, constraint: Constraint) -> "GrammarState":
        return GrammarState(self._xgr, self.compile(constraint), self.vocab_size)


class GrammarState:
    """One row's matcher: ``mask`` the next logits, ``accept`` the sampled token."""

    def __init__(self, xgr: Any, compiled: Any, vocab_size: int) -> None:
        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: Tensor) -> Tensor:
        """``logits`` (one row, on any device) with every token the grammar forbids at -inf."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = logits.detach().to("cpu", torch.float32).unsqueeze(0).clone()
        self._xgr.apply_token_bitmask_inplace(row, self.bitmask)
        return row[0].to(logits.device)

    def accept(self, token: int) -> bool:
        """Advance with the sampled token; True when the grammar is complete (an end token)."""
        if not self.matcher.accept_token(int(token)):
            raise RuntimeError(f"the grammar rejected token {token}, which its mask allowed")
        return self.matcher.is_terminated()
