"""The fixed frontier designer ("Fixed ED"): designer, hint and screen calls over a real HTTP endpoint.

:class:`CannedEndpoint` is a real OpenAI-compatible HTTP server (``http.server`` on a thread, on a
free 127.0.0.1 port) that the real ``openai`` client talks to. It stands in for the frontier
model's intelligence only: a designer request gets a fixed environment from ``examples/envs``, a
hint request a fixed hint. It checks the bearer key like a real API (401 otherwise) and can be
told what the next chat requests get (500, 429, or no answer at all) to exercise the retries.
Admission runs in the real sandbox; the agent of the orchestrator test is a tiny random Qwen3 on
the in-process engine.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import prewarmed
import pytest

from chat_templates import bpe_tokenizer
from spade.config import ConfigError, from_mapping
from spade.designer.corpus import Corpus, CorpusSettings, attempt_rng
from spade.designer.memory import Memory, memory_path
from spade.designer.prompts import DESIGNER_SYSTEM, HINT_SYSTEM, clean_hint
from spade.designer.skills import SkillSettings
from spade.envs.protocol import ErrorKind, Stage
from spade.rollout.conversation import ChatFormat
from spade.rollout.engine import GenerationResult, RolloutEngine
from spade.selfplay.sources.text_generators import (EndpointError, ExternalGenerator, LocalGenerator, TextSampling,
                                                check_endpoint)
from spade.selfplay.sources.designer_source import DesignerRound
from spade.selfplay.sources.endpoint import EndpointSettings
from spade.selfplay.seeds import derive_seed
from spade.selfplay.settings import SamplingSettings, SelfPlaySettings
from spade.selfplay.step import Step
from support.http import JsonHandler, LocalServer, chat_completion

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
ENV_SOURCE = (ROOT / "examples" / "envs" / "remainder_oracle.py").read_text()
SEED_DIR = ROOT / "examples" / "seed_envs"
HINT = "Ask about  the remainder first;\n answer with \\boxed{}."
MODEL = "frontier-test"
KEY_ENV = "SPADE_TEST_DESIGNER_KEY"
KEY = "sk-test-123"


class CannedEndpoint:
    """``GET /v1/models`` and ``POST /v1/chat/completions`` of the OpenAI API, with canned replies.

    ``faults``: what the next chat requests get, first to last ("500", "429", "context": OpenAI's
    400 for a prompt over the context, or "hang": no answer until the server closes); once it is
    empty, requests are answered. ``chat`` records every chat
    request body, ``auth`` every Authorization header.
    """

    def __init__(self, key: str | None = KEY):
        self.key = key
        self.faults: list[str] = []
        self.chat: list[dict] = []
        self.auth: list[str | None] = []
        self.closing = threading.Event()
        self._lock = threading.Lock()
        endpoint = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"
            _send = JsonHandler.send_json

            def _authorised(self) -> bool:
                header = self.headers.get("Authorization")
                endpoint.auth.append(header)
                if endpoint.key is not None and header != f"Bearer {endpoint.key}":
                    self._send(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                               "code": "invalid_api_key"}})
                    return False
                return True

            def do_GET(self):
                if self.path.rstrip("/") != "/v1/models":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if self._authorised():
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                                                 "owned_by": "test"}]})

            def do_POST(self):
                body = self.read_json(default={})
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if not self._authorised():
                    return
                with endpoint._lock:
                    endpoint.chat.append(body)
                    fault = endpoint.faults.pop(0) if endpoint.faults else None
                if fault == "hang":
                    endpoint.closing.wait(60)
                    return
                if fault == "context":
                    return self._send(400, {"error": {"message": "This model's maximum context length is 1000 tokens",
                                                      "type": "invalid_request_error",
                                                      "code": "context_length_exceeded"}})
                if fault in ("500", "429"):
                    return self._send(int(fault), {"error": {"message": f"injected {fault}"}})
                self._send(200, chat_completion(body["model"], reply(body["messages"]), "chatcmpl-1"))

        self.server = LocalServer(Handler)

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1"

    def requests_with(self, system: str) -> list[dict]:
        return [body for body in self.chat if body["messages"][0]["content"] == system]

    def close(self) -> None:
        self.closing.set()
        self.server.close(join_timeout_s=10)


def reply(messages: list[dict]) -> str:
    system = messages[0]["content"]
    if system == DESIGNER_SYSTEM:
        return f"Here is the environment.\n```python\n{ENV_SOURCE}\n```"
    if system == HINT_SYSTEM:
        return HINT
    return "I cannot help with that."


@pytest.fixture
def endpoint(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    server = CannedEndpoint()
    yield server
    server.close()


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer()


class NoEngine(RolloutEngine):
    """Fails the test if the designer round asks our engine for anything."""

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request):
        raise AssertionError("the external designer must not use the rollout engine")

    async def update_weights(self, named_tensors, version):
        pass

    def close(self):
        pass


def endpoint_settings(url: str, **overrides) -> EndpointSettings:
    values = dict(url=url, model=MODEL, api_key_env=KEY_ENV, backoff_s=0.0, max_retries=2)
    values.update(overrides)
    return EndpointSettings(**values)


def designer_settings(url: str, endpoint_overrides=None, **overrides) -> SelfPlaySettings:
    values = dict(envs_per_set=2, max_attempts=2,
                  sampling=SamplingSettings().replace(designer=dict(max_tokens=900), hint=dict(max_tokens=90)),
                  max_context_tokens=8192, skills=SkillSettings(window=1), train_designer=False,
                  designer_endpoint=endpoint_settings(url, **(endpoint_overrides or {})))
    values.update(overrides)
    return SelfPlaySettings(**values)


def make_round(settings, tokenizer, run_dir, *, corpus=None, memory=None, sandbox=None, engine=None):
    return DesignerRound(settings, sandbox=sandbox, engine=engine or NoEngine(), tokenizer=tokenizer,
                         chat_format=ChatFormat(tokenizer), corpus=corpus, memory=memory, run_dir=run_dir, seed=1)


# --------------------------------------------------------------------------- settings


def test_endpoint_settings_are_validated_and_name_their_keys():
    loaded = from_mapping(SelfPlaySettings, {"train_designer": False, "designer_endpoint": {
        "url": "http://h:1/v1", "model": "m", "api_key_env": None, "top_k": 5}}, where="selfplay")
    assert loaded.designer_endpoint == EndpointSettings(url="http://h:1/v1", model="m", api_key_env=None, top_k=5)
    assert SelfPlaySettings().designer_endpoint is None
    with pytest.raises(ConfigError, match=r"selfplay\.train_designer: .*selfplay\.designer_endpoint"):
        SelfPlaySettings(designer_endpoint=EndpointSettings(url="http://h:1/v1", model="m"))
    for bad, key in (({"url": "h:1/v1", "model": "m"}, "url"), ({"url": "http://h/v1"}, "model"),
                     ({"url": "http://h/v1", "model": "m", "max_retries": -1}, "max_retries"),
                     ({"url": "http://h/v1", "model": "m", "max_tokens_key": "tokens"}, "max_tokens_key"),
                     ({"url": "http://h/v1", "model": "m", "wat": 1}, "wat")):
        with pytest.raises(ConfigError, match=rf"selfplay\.designer_endpoint\.{key}"):
            from_mapping(SelfPlaySettings, {"train_designer": False, "designer_endpoint": bad}, where="selfplay")


def test_recipe_varies_only_the_designer_of_the_30b_8gpu_run():
    from spade.train_config import load_train_config

    recipe = load_train_config(ROOT / "examples" / "recipes" / "ablation_fixed_designer.yaml")
    base = load_train_config(ROOT / "examples" / "recipes" / "qwen3_30b_a3b_games_8gpu.yaml")
    endpoint = recipe.selfplay.designer_endpoint
    assert endpoint is not None and endpoint.url.startswith("http") and endpoint.api_key_env == "OPENAI_API_KEY"
    assert recipe.selfplay.train_designer is False and base.selfplay.train_designer is True
    import dataclasses

    assert dataclasses.replace(recipe.selfplay, train_designer=True, designer_endpoint=None) == base.selfplay
    assert dataclasses.replace(recipe, selfplay=base.selfplay) == base  # same engine, layout, model, batches


def test_missing_key_variable_is_a_config_error_naming_it(monkeypatch, tokenizer, tmp_path):
    monkeypatch.delenv(KEY_ENV, raising=False)
    settings = designer_settings("http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match=rf"selfplay\.designer_endpoint\.api_key_env: .*{KEY_ENV} is not set"):
        make_round(settings, tokenizer, tmp_path)
    # an endpoint without a key needs no variable
    make_round(designer_settings("http://127.0.0.1:9/v1", {"api_key_env": None}), tokenizer, tmp_path)


# --------------------------------------------------------------------------- the designer round


def test_designer_round_admits_environments_from_the_endpoint(endpoint, sandbox, tokenizer, tmp_path):
    """Corpus document and memory block reach the endpoint; the admitted set holds its environment
    and its hints; no designer trajectory; the role's sampling settings are sent."""
    settings = designer_settings(endpoint.url, {"top_k": 7}, memory_seed_dir=str(SEED_DIR))
    corpus = Corpus(CorpusSettings(paths=("examples/corpus/demo.jsonl.gz",)), root=ROOT)
    with Memory(memory_path(tmp_path)) as memory:
        round_ = make_round(settings, tokenizer, tmp_path, corpus=corpus, memory=memory, sandbox=sandbox.service)
        result = sandbox.run(round_.regenerate(0), timeout=90)
    assert [env.env_id for env in result.envs] == ["s000000-e00", "s000000-e01"]
    assert result.attempts == 2 and result.rejections == [] and result.designer_fields == {}
    for env in result.envs:
        assert env.source.strip() == ENV_SOURCE.strip() and env.class_name == "RemainderOracleEnv"
        assert env.hint == clean_hint(HINT) == "Ask about the remainder first; answer with \\boxed{}."
        assert (tmp_path / "envs" / "step_000000" / f"{env.env_id}.py").read_text() == env.source
    designs = endpoint.requests_with(DESIGNER_SYSTEM)
    hints = endpoint.requests_with(HINT_SYSTEM)
    assert len(designs) == 2 and len(hints) == 2 and len(endpoint.chat) == 4
    assert set(endpoint.auth) == {f"Bearer {KEY}"}
    seeds = sorted(derive_seed(1, "designer", 0, slot, 0) for slot in range(2))
    assert sorted(body["seed"] for body in designs) == seeds
    for slot in range(2):  # the same documents the local designer would have drawn
        document = corpus.sample(attempt_rng(1, 0, slot, 0))
        assert sum(document.text in body["messages"][-1]["content"] for body in designs) >= 1
    for body in designs:
        assert body["model"] == MODEL
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["top_k"]) == (0.6, 0.95, 900, 7)
        assert "## Environments from your memory" in body["messages"][-1]["content"]
    for body in hints:
        assert (body["temperature"], body["max_tokens"]) == (0.3, 90)
        assert ENV_SOURCE.strip() in body["messages"][-1]["content"]


def test_500_then_success_is_retried(endpoint, sandbox, tokenizer, tmp_path):
    endpoint.faults = ["500", "429"]
    round_ = make_round(designer_settings(endpoint.url, envs_per_set=1), tokenizer, tmp_path,
                        sandbox=sandbox.service)
    result = sandbox.run(round_.regenerate(0), timeout=60)
    assert len(result.envs) == 1 and result.attempts == 1 and result.rejections == []
    assert round_.generator.retries == 2 and round_.generator.requests == 4  # 3 designer tries + 1 hint
    assert len(endpoint.requests_with(DESIGNER_SYSTEM)) == 3


def test_timeout_after_retries_is_a_rejected_attempt(endpoint, sandbox, tokenizer, tmp_path):
    endpoint.faults = ["hang", "hang", "500"]
    settings = designer_settings(endpoint.url, {"timeout_s": 0.5, "max_retries": 1}, envs_per_set=1)
    round_ = make_round(settings, tokenizer, tmp_path, sandbox=sandbox.service)
    result = sandbox.run(round_.regenerate(0), timeout=60)
    # attempt 0: two tries, both unanswered -> timeout; attempt 1: 500, then answered -> admitted
    assert result.attempts == 2 and len(result.envs) == 1 and result.envs[0].attempts == 2
    [rejection] = result.rejections
    assert (rejection.kind, rejection.stage, rejection.attempt) == (ErrorKind.TIMEOUT, Stage.GENERATE, 0)
    saved = json.loads((tmp_path / "rejected" / "step_000000" / "slot0_attempt0.json").read_text())
    assert saved["reason"]["kind"] == "timeout" and "after 2 tries" in saved["reason"]["message"]
    assert endpoint.url in saved["reason"]["message"]


def test_a_prompt_over_the_endpoints_context_rejects_that_attempt_only(endpoint, sandbox, tokenizer, tmp_path):
    endpoint.faults = ["context"]
    round_ = make_round(designer_settings(endpoint.url, envs_per_set=1), tokenizer, tmp_path, sandbox=sandbox.service)
    result = sandbox.run(round_.regenerate(0), timeout=60)
    assert len(result.envs) == 1 and result.envs[0].attempts == 2
    [rejection] = result.rejections
    assert rejection.kind is ErrorKind.PROMPT_TOO_LONG and "maximum context length" in rejection.message
    assert round_.generator.retries == 0  # not retried: the same prompt would not fit again


def test_a_failing_hint_call_leaves_the_hint_empty(endpoint, sandbox, tokenizer, tmp_path):
    endpoint.faults = [None, "500", "500"]  # designer answered, hint fails on both tries
    round_ = make_round(designer_settings(endpoint.url, {"max_retries": 1}, envs_per_set=1), tokenizer, tmp_path,
                        sandbox=sandbox.service)
    result = sandbox.run(round_.regenerate(0), timeout=60)
    assert len(result.envs) == 1 and result.envs[0].hint == ""


def test_wrong_key_stops_the_run_clearly(endpoint, sandbox, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    round_ = make_round(designer_settings(endpoint.url, envs_per_set=1), tokenizer, tmp_path,
                        sandbox=sandbox.service)
    with pytest.raises(EndpointError) as caught:
        sandbox.run(round_.regenerate(0), timeout=60)
    message = str(caught.value)
    assert endpoint.url in message and MODEL in message and "401" in message and "Incorrect API key" in message
    assert endpoint.chat == [] and len(endpoint.auth) == 1  # refused once, not retried


# --------------------------------------------------------------------------- preflight


def test_preflight_checks_the_endpoint_answers(endpoint, monkeypatch):
    check_endpoint(endpoint_settings(endpoint.url))
    assert endpoint.auth == [f"Bearer {KEY}"]
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    with pytest.raises(ConfigError, match=r"selfplay\.designer_endpoint\.url: .*models answered HTTP 401"):
        check_endpoint(endpoint_settings(endpoint.url))
    with pytest.raises(ConfigError, match=r"HTTP 404.*ending in /v1"):
        check_endpoint(endpoint_settings(endpoint.url[: -len("/v1")], api_key_env=None))


def test_spade_train_preflight_refuses_an_unreachable_endpoint(monkeypatch):
    import socket

    from spade.run.preflight import preflight
    from spade.train_config import from_dict

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    monkeypatch.setenv(KEY_ENV, KEY)
    config = from_dict({"selfplay": {"use_corpus": False, "train_designer": False, "designer_endpoint": {
        "url": url, "model": MODEL, "api_key_env": KEY_ENV, "max_retries": 0}}})
    with pytest.raises(ConfigError, match=rf"selfplay\.designer_endpoint\.url: {url} is not reachable"):
        preflight(config)


def test_spade_train_stops_before_writing_the_run_directory(monkeypatch, tmp_path, capsys):
    import socket

    from spade.cli import EXIT_USAGE, main

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    monkeypatch.setenv(KEY_ENV, KEY)
    config = tmp_path / "fixed_ed.yaml"
    config.write_text(json.dumps({"selfplay": {"use_corpus": False, "train_designer": False, "designer_endpoint": {
        "url": url, "model": MODEL, "api_key_env": KEY_ENV}}}))
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run_dir)]) == EXIT_USAGE
    assert f"selfplay.designer_endpoint.url: {url} is not reachable" in capsys.readouterr().err
    assert not run_dir.exists()


# --------------------------------------------------------------------------- the two generators


def test_external_request_body_applies_the_overrides():
    generator = ExternalGenerator(EndpointSettings(url="http://h/v1", model="m", api_key_env=None, temperature=1.0,
                                                   top_p=1.0, max_tokens_key="max_completion_tokens", send_seed=False,
                                                   extra_body={"reasoning_effort": "low"}))
    body = generator.request_body([{"role": "user", "content": "x"}],
                                  TextSampling(temperature=0.6, top_p=0.95, top_k=20, max_tokens=100, timeout_s=1, seed=3))
    assert body == {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1.0, "top_p": 1.0,
                    "max_completion_tokens": 100, "extra_body": {"reasoning_effort": "low"}}


def test_local_generator_is_token_exact(tokenizer):
    """The local seam keeps today's designer sample: the template's prompt ids then the sampled
    ids verbatim, loss on the sampled ids only, log-probs as the engine gave them."""
    completion = tokenizer("a game<|im_end|>", add_special_tokens=False)["input_ids"]
    seen = []

    class Scripted(NoEngine):
        async def generate(self, request):
            seen.append(request)
            return GenerationResult(tuple(completion), tuple([-0.5] * len(completion)), "stop", 3)

    chat_format = ChatFormat(tokenizer)
    messages = [{"role": "system", "content": "design"}, {"role": "user", "content": "a skill"}]
    generator = LocalGenerator(Scripted(), tokenizer, chat_format, max_context_tokens=4096, stop_token_ids=(7,))
    out = asyncio.run(generator.generate(messages, TextSampling(temperature=0.6, top_p=0.95, top_k=20, max_tokens=64,
                                                                timeout_s=5, seed=11)))
    prompt = chat_format.render_ids(messages, add_generation_prompt=True)
    [request] = seen
    assert list(request.prompt_ids) == prompt
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens, sampling.seed,
            sampling.stop_token_ids) == (0.6, 0.95, 20, 64, 11, (7,))
    assert out.text == "a game" and out.finish_reason == "stop"
    trajectory = out.trajectory
    assert list(trajectory.token_ids) == prompt + completion and trajectory.weight_version == 3
    assert list(trajectory.loss_mask) == [0] * (len(prompt) - 1) + [1] * len(completion)
    assert list(trajectory.rollout_logprobs) == [0.0] * (len(prompt) - 1) + [-0.5] * len(completion)


# --------------------------------------------------------------------------- the step


def test_orchestrator_steps_train_the_agent_only(endpoint, sandbox, tokenizer, tmp_path):
    """Three steps with k=2 (regenerations at 0 and 2): the agent plays on our engine and gets its
    samples, the memory records every environment, and no designer sample is ever made (the
    delay buffer holds nothing to release)."""
    from spade.rollout import HFEngine
    from spade.selfplay.orchestrator import Orchestrator
    from support.models import tiny_qwen3

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = HFEngine((tiny_qwen3(tokenizer, size="1x32", max_position_embeddings=8192), tokenizer),
                      eos_token_ids=(eos,))
    sampling = SamplingSettings().replace(designer=dict(max_tokens=900), hint=dict(max_tokens=90), agent=dict(max_tokens=8))
    settings = designer_settings(endpoint.url, envs_per_set=1, k=2, g_nohint=2, g_hint=1, sampling=sampling,
                                 max_turns=2)
    try:
        with Memory(memory_path(tmp_path)) as memory:
            orchestrator = Orchestrator(settings, sandbox=sandbox.service, engine=engine, tokenizer=tokenizer,
                                        corpus=None, memory=memory, run_dir=tmp_path, seed=1)
            outs = [sandbox.run(orchestrator.run_step(Step(step)), timeout=120) for step in range(3)]
            remembered = sorted(record.env_id for record in memory.list())
    finally:
        engine.close()
    assert [out.metrics["env/set_size"] for out in outs] == [1.0, 1.0, 1.0]
    assert [out.metrics["agent/episodes"] for out in outs] == [2.0, 2.0, 2.0]  # g_nohint
    assert [out.metrics.get("agent/hint_episodes") for out in outs] == [1.0, None, 1.0]
    # the external designer's environments are scored like any designer's (the window closes at
    # step 2), but nothing of them is trained
    assert [out.metrics["designer/released"] for out in outs] == [0.0, 0.0, 1.0]
    assert [out.metrics["designer/pending"] for out in outs] == [1.0, 1.0, 1.0]
    assert 0.0 <= outs[2].metrics["designer/reward_mean"] <= 1.0 and "designer/samples" in outs[2].metrics
    assert outs[2].metrics["designer/samples"] == 0
    for out in outs:
        assert out.designer_samples == []
        assert len(out.agent_samples) == out.metrics["agent/samples"] >= 1
        assert all(sample.token_ids and sum(sample.loss_mask) >= 1 for sample in out.agent_samples)
    assert remembered == ["s000000-e00", "s000002-e00"]
    # the endpoint served the designer and the hint of two regenerations, nothing of the agent's
    assert len(endpoint.requests_with(DESIGNER_SYSTEM)) == 2 and len(endpoint.requests_with(HINT_SYSTEM)) == 2
    assert len(endpoint.chat) == 4


# --------------------------------------------------------------------------- against `spade serve`


@pytest.fixture(scope="module")
def spade_serve(tmp_path_factory):
    """``python -m spade serve`` on a tiny random Qwen3, a subprocess on a free port, killed at the end."""
    import os
    import socket
    import subprocess
    import time
    import urllib.error
    import urllib.request

    from support.models import save_tiny_qwen3

    directory = tmp_path_factory.mktemp("frontier_model")
    save_tiny_qwen3(directory, bpe_tokenizer(), size="1x32", max_position_embeddings=2048, randomize=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([prewarmed.python(), "-m", "spade", "serve", "--model", str(directory), "--port", str(port),
                                "--served-model-name", MODEL], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while True:  # bounded poll of /health; fail at once if the server died
            if process.poll() is not None:
                pytest.fail(f"spade serve exited with {process.returncode}: {process.stderr.read()}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("spade serve did not answer /health within 90 s")
            time.sleep(0.2)  # poll interval, not an ordering device
        yield base + "/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_spade_serve_as_the_designer_endpoint(spade_serve):
    """Our own OpenAI-compatible server passes the preflight and answers the designer's calls with
    the seed and top_k it was sent; a model it does not serve stops the run with its 404."""
    check_endpoint(EndpointSettings(url=spade_serve, model=MODEL, api_key_env=None))
    generator = ExternalGenerator(EndpointSettings(url=spade_serve, model=MODEL, api_key_env=None, top_k=50))
    messages = [{"role": "system", "content": HINT_SYSTEM}, {"role": "user", "content": "a game"}]

    def ask(seed: int):
        return asyncio.run(generator.generate(messages, TextSampling(temperature=1.0, top_p=1.0, top_k=None,
                                                                     max_tokens=12, timeout_s=30, seed=seed)))
    first, again, other = ask(5), ask(5), ask(6)
    assert first.text and first.trajectory is None and first.finish_reason in ("stop", "length")
    assert first.text == again.text != other.text  # the seed reaches the server
    assert generator.requests == 3 and generator.retries == 0
    wrong = ExternalGenerator(EndpointSettings(url=spade_serve, model="no-such-model", api_key_env=None))
    with pytest.raises(EndpointError, match=rf"{spade_serve} refused a request for model 'no-such-model' with HTTP 404"):
        asyncio.run(wrong.generate(messages, TextSampling(temperature=1.0, top_p=1.0, top_k=None, max_tokens=4,
                                                          timeout_s=30)))
    assert wrong.requests == 1
