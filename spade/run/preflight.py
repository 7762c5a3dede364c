"""What ``spade train`` checks before it writes anything: a bad model directory, corpus or fixed
pool fails here, in seconds, leaving no run directory behind (and before the sandbox and the model
load). Each problem names the config key. ``sandbox_self_test`` then proves the sandbox's isolation
(rank 0, a new run), also before the run directory is written."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Optional

from ..train_config import EMBEDDED, TrainConfig
from .run_dir import RunDirError

# overrides sandbox.isolation (e.g. unsafe-local in tests); the trainer reads the same variable
ISOLATION_VARIABLE = "SPADE_SANDBOX_ISOLATION"


def paper_recipe(path: str | Path | None) -> bool:
    """A reproduction recipe: a config file under a ``recipes/paper`` directory."""
    if path is None:
        return False
    parts = Path(path).resolve().parts
    return any(parts[i:i + 2] == ("recipes", "paper") for i in range(len(parts) - 1))


def check_real_corpus(config: TrainConfig, recipe: str | Path | None = None) -> None:
    """Refuse the demo corpus where a real one is required: ``corpus.require_real`` (set by the
    reproduction recipes), or any recipe under ``recipes/paper/``. Cheap (no record is read), so
    ``spade train --check`` runs it too. Nothing to refuse when the designer reads no corpus."""
    sp = config.selfplay
    if not (config.corpus.require_real or paper_recipe(recipe)) or not (sp.designer_enabled and sp.use_corpus):
        return
    from ..designer.corpus import demo_corpus_refusal

    refusal = demo_corpus_refusal(config.corpus.paths, sp.domain)
    if refusal is not None:
        raise RunDirError(refusal)


def preflight(config: TrainConfig) -> None:
    """Raise ``RunDirError`` for the first input of ``config`` that cannot be used."""
    if config.model.hf_dir != EMBEDDED:
        path = Path(config.model.hf_dir)
        if not (path / "config.json").is_file():
            raise RunDirError(f"model.hf_dir: {path} is not a Hugging Face model directory (no config.json)")
        from ..rollout.conversation import TemplateError, thinking_template_kwargs

        for key, thinking in (("model.thinking", config.model.thinking),
                              ("selfplay.sampling.hint.thinking", config.selfplay.sampling.hint.thinking),
                              ("selfplay.sampling.screen.thinking", config.selfplay.sampling.screen.thinking),
                              ("selfplay.sampling.designer.thinking", config.selfplay.sampling.designer.thinking),
                              ("selfplay.sampling.agent.hinted_thinking",
                               config.selfplay.sampling.agent.hinted_thinking)):
            try:
                thinking_template_kwargs(_chat_template(path), thinking, key)
            except TemplateError as exc:
                raise RunDirError(str(exc)) from None
    sp = config.selfplay
    if sp.domain == "tool_use":
        _check_tool_template(config)
    check_real_corpus(config)
    if sp.designer_enabled and sp.use_corpus:
        if not config.corpus.paths:
            raise RunDirError("corpus.paths is empty but selfplay.use_corpus is true: give a corpus "
                              "(e.g. examples/corpus/demo.jsonl.gz) or set selfplay.use_corpus: false")
        from ..designer.corpus import Corpus

        try:
            corpus = Corpus(config.corpus)  # opens every file and reads its records
        except (OSError, ValueError) as exc:
            raise RunDirError(f"corpus.paths: {exc}") from None
        if len(corpus) == 0:
            raise RunDirError(f"corpus.paths: no usable document in {', '.join(map(str, corpus.files))}")
    if sp.env_source == "fixed_pool":
        pool = Path(sp.fixed_env_dir or "")
        if not pool.is_dir() or not any(pool.glob("*.py")):
            from ..selfplay.sources.fixed_pool import missing_pool_message

            raise RunDirError(missing_pool_message(pool))
    if sp.env_source == "rlve":
        import importlib.util

        if importlib.util.find_spec("Gym") is None:  # rlve-gym's module; its workers run this Python
            raise RunDirError("selfplay.env_source: rlve needs the rlve-gym package, which this Python lacks: "
                              "pip install rlve-gym==0.0.1 (make setup installs it)")
    if sp.memory_seed_dir is not None and not Path(sp.memory_seed_dir).is_dir():
        raise RunDirError(f"selfplay.memory_seed_dir: {sp.memory_seed_dir} is not a directory")
    from ..selfplay.sources.text_generators import check_designer_endpoint

    check_designer_endpoint(sp)  # selfplay.designer_endpoint answers GET {url}/models (ConfigError if not)


def cpu_bf16_note(config: TrainConfig, *, cuda: bool, native_bf16: bool) -> Optional[str]:
    """A note when ``model.dtype: bfloat16`` will run on a CPU without native bf16 arithmetic (AMX or
    AVX512-BF16): PyTorch then converts to fp32 inside each matrix product, which can be slower than
    fp32 throughout. Not an error: the run is correct, only slower."""
    if config.model.dtype != "bfloat16" or cuda or native_bf16:
        return None
    return ("model.dtype: bfloat16 on a CPU without AMX or AVX512-BF16 instructions: each matrix product "
            "converts to fp32, which may be slower than model.dtype=float32 (the same run in fp32: "
            "add model.dtype=float32)")


def cpu_has_native_bf16() -> bool:
    from .engines import cpu_has_native_bf16 as native

    return native()


def _check_tool_template(config: TrainConfig) -> None:
    """Tool use reads the policy's tool calls with the parser its chat template names: a template that
    renders no tool calls cannot train it (refused here, before the run directory is written)."""
    from ..agent.tool_calls import UnknownToolFormat, parser_for_template

    if config.model.hf_dir == EMBEDDED:
        from ..models.embedded import embedded_model_dir

        path = Path(embedded_model_dir())
    else:
        path = Path(config.model.hf_dir)
    template = _chat_template(path)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    try:
        parser_for_template(template if isinstance(template, str) else None)
    except UnknownToolFormat as exc:
        raise RunDirError(f"selfplay.domain: tool_use with model.hf_dir {config.model.hf_dir}: {exc}") from None


def _chat_template(model_dir: Path) -> object:
    """The chat template as the tokenizer will load it: ``chat_template.jinja``, else the
    ``chat_template`` of ``tokenizer_config.json`` (text, or a list of named templates); None if absent."""
    if (model_dir / "chat_template.jinja").is_file():
        return (model_dir / "chat_template.jinja").read_text()
    config = model_dir / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        return {str(t.get("name")): t.get("template") for t in template if isinstance(t, dict)}
    return template


def sandbox_settings(config: TrainConfig):
    """``config.sandbox``, with ``isolation`` taken from ``SPADE_SANDBOX_ISOLATION`` when set."""
    isolation = os.environ.get(ISOLATION_VARIABLE)
    return dataclasses.replace(config.sandbox, isolation=isolation) if isolation else config.sandbox


def sandbox_self_test(config: TrainConfig) -> None:
    """Start the sandbox service once and stop it: its start-up self-test proves every isolation
    layer (``spade.envs.sandbox.selftest``). Raises ``SandboxUnavailable`` naming what is missing,
    which ``spade`` reports with exit status 3. About a third of a second."""
    from ..envs.sandbox.client import SandboxService

    async def start_and_stop() -> None:
        service = await SandboxService.start(dataclasses.replace(sandbox_settings(config), pool_size=1))
        await service.close()

    asyncio.run(start_and_stop())
