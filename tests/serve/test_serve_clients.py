"""``spade serve`` with the real clients people point at it (issue 28): the OpenAI Agents SDK
(a function-tool agent, ``Runner.run`` and ``Runner.run_streamed``, with the Responses API, its
default, and with chat completions) and an inspect-ai evaluation through its OpenAI-compatible
provider (``openai-api/spade/<model>``, chat completions and ``responses_api=True``).

The clients run in their own venv (``.venv-serve-clients``, ``make serve-clients``: their pins
differ from .venv's) as a subprocess, ``tests/serve_clients_probe.py``, against a server in this
process (``BackgroundServer``: the HTTP server and service of ``spade serve``) whose handler
records every request and every answer it sent, so each run is checked against what the server
really returned, and every SDK parsed every response and event (an unparsable one raises).

Two servers:
- the real model: ``spade serve --model DIR`` (``build_service``, hf engine) on the tiny Qwen3 of
  ``test_serve`` with its tool template, except that the ``<|im_end|>`` row of ``lm_head`` reads a
  residual direction every embedding carries (so each step ends with a few percent probability):
  a random model otherwise runs to ``max_output_tokens``, which the Responses API reports as
  ``incomplete`` and the Agents SDK treats as a failed turn, as it does with OpenAI's API. Replies
  are then 1-14 tokens of real sampling, seeded. The model never calls the tool.
- the tool path: a random model does not call tools on demand, so a scripted engine replies with a
  native Qwen3 tool call to the first turn and with a fixed answer once the prompt holds the tool's
  result (``<tool_response>``), as ``test_serve`` scripts replies; the template, the tool-call
  parser and both wire formats are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scripted_engine import ScriptedEngine
from test_serve import MODEL_NAME, TOOLS_TEMPLATE

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("SPADE_SERVE_CLIENTS_PYTHON", ROOT / ".venv-serve-clients" / "bin" / "python"))
PROBE = ROOT / "tests" / "serve_clients_probe.py"

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is sunny in Paris."


def _python() -> str:
    if not PYTHON.is_file():
        pytest.fail(f"{PYTHON} is absent: the client venv is built by `make serve-clients` "
                    "(make test and .ci/run do)")
    return str(PYTHON)


class TurnEngine(ScriptedEngine):
    """Replies ``CALL`` to a prompt without a tool result and ``ANSWER`` to one with it."""

    def reply_ids(self, prompt: str) -> list[int]:
        return self.text_ids(ANSWER if "<tool_response>" in prompt else CALL)


class Recorder:
    """Wraps the server's handler: ``log`` holds (path, request body, answer) per request, the
    answer as JSON or, for a stream, the list of its events' JSON."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.log: list[tuple[str, Any, Any]] = []

    async def __call__(self, request):
        from spade.serve.http import StreamResponse

        answer = await self.handler(request)
        body = json.loads(request.body) if request.body else None
        if isinstance(answer, StreamResponse):
            events: list[Any] = []
            self.log.append((request.path, body, events))
            inner = answer.chunks

            async def chunks():
                async for chunk in inner:
                    for block in chunk.decode().split("\n\n"):
                        for line in block.splitlines():
                            if line.startswith("data: {"):
                                events.append(json.loads(line[6:]))
                    yield chunk
            answer.chunks = chunks()
        else:
            self.log.append((request.path, body, json.loads(answer.body)))
        return answer


def _start(service):
    from spade.serve.server import BackgroundServer

    server = BackgroundServer(service)
    recorder = Recorder(server.http.handler)
    server.http.handler = recorder
    server.start()
    return server, recorder


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    import torch
    from chat_templates import bpe_tokenizer
    from spade.cli.serve import ServeOptions, build_service
    from support.models import tiny_qwen3

    directory = tmp_path_factory.mktemp("clients_model")
    tokenizer = bpe_tokenizer(TOOLS_TEMPLATE)
    model = tiny_qwen3(tokenizer, max_position_embeddings=1024, randomize=True)
    with torch.no_grad():  # <|im_end|> reads residual dimension 0, which every embedding carries
        model.model.embed_tokens.weight[:, 0] = 50.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tokenizer.eos_token_id, 0] = 0.3
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    server, recorder = _start(build_service(ServeOptions(model=str(directory), served_model_name=MODEL_NAME)))
    yield server, recorder
    server.close()


@pytest.fixture(scope="module")
def scripted():
    from chat_templates import bpe_tokenizer
    from spade.serve.service import ModelService

    tokenizer = bpe_tokenizer(TOOLS_TEMPLATE)
    engine = TurnEngine(tokenizer)
    server, recorder = _start(ModelService(engine, tokenizer, MODEL_NAME, max_context_tokens=1024,
                                           eos_token_ids=[tokenizer.eos_token_id]))
    yield server, recorder, engine
    server.close()


def _probe(kind: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    out = subprocess.run([_python(), str(PROBE), kind, json.dumps(spec)], capture_output=True,
                         text=True, timeout=240, check=False, cwd=spec.get("cwd"))
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _answer_text(answer: Any, *, completed: bool = True) -> str:
    """The reply text the server sent: a response, a chat completion, or their streams
    (``completed``: the response must not have been cut at ``max_output_tokens``)."""
    if isinstance(answer, list):  # a stream's events
        if answer and "sequence_number" in answer[0]:
            answer = answer[-1]["response"]
        else:
            return "".join(c["choices"][0]["delta"].get("content") or "" for c in answer if c.get("choices"))
    if answer.get("object") == "response":
        assert answer["status"] == "completed" or not completed, answer["status"]
        return "".join(p["text"] for item in answer["output"] if item["type"] == "message"
                       for p in item["content"])
    return answer["choices"][0]["message"]["content"] or ""


def _path(api: str) -> str:
    return "/v1/responses" if api == "responses" else "/v1/chat/completions"


def test_agents_sdk_on_the_real_model(real):
    server, recorder = real
    recorder.log.clear()
    runs = _probe("agents", {"base_url": server.url, "model": MODEL_NAME, "input": "hello",
                             "max_tokens": 64, "seed": 11})
    assert [(r["api"], r["streamed"]) for r in runs] == [
        ("responses", False), ("responses", True), ("chat_completions", False), ("chat_completions", True)]
    assert len(recorder.log) == 4  # one model call per run: the model answers without calling
    assert all(r["final_output"] for r in runs), runs  # seed 11 gives a non-empty reply
    for run, (path, body, answer) in zip(runs, recorder.log):
        assert path == _path(run["api"])
        assert bool(body.get("stream")) is run["streamed"]
        if run["api"] == "responses":
            assert body["instructions"] == "Answer briefly." and body["input"][0]["content"] == "hello"
            assert body["tools"][0]["type"] == "function" and body["tools"][0]["name"] == "get_weather"
        assert run["final_output"] == _answer_text(answer)
        assert run["tool_calls"] == [] and run["items"] == ["message_output_item"]
        if run["streamed"]:
            assert "raw_response_event" in run["events"]


def test_agents_sdk_calls_the_tool(scripted):
    server, recorder, engine = scripted
    recorder.log.clear()
    runs = _probe("agents", {"base_url": server.url, "model": MODEL_NAME, "input": "weather in Paris?",
                             "max_tokens": 64, "seed": 1})
    assert len(runs) == 4 and len(recorder.log) == 8  # two model calls per run
    for k, run in enumerate(runs):
        assert run["final_output"] == ANSWER and run["tool_calls"] == ["Paris"]
        assert run["items"] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
        (path1, first, answer1), (path2, second, answer2) = recorder.log[2 * k: 2 * k + 2]
        assert path1 == path2 == _path(run["api"])
        assert _answer_text(answer2) == ANSWER
        if run["api"] == "responses":
            call = [i for i in second["input"] if i.get("type") == "function_call"]
            output = [i for i in second["input"] if i.get("type") == "function_call_output"]
            assert [c["name"] for c in call] == ["get_weather"] and json.loads(call[0]["arguments"]) == {"city": "Paris"}
            assert output[0]["output"] == "sunny in Paris" and output[0]["call_id"] == call[0]["call_id"]
        else:
            tool = [m for m in second["messages"] if m["role"] == "tool"]
            assert tool[0]["content"] == "sunny in Paris"
    # the second prompt of each run holds the call and its result, rendered by the template
    assert sum("<tool_response>\nsunny in Paris\n</tool_response>" in p for p in engine.prompts) == 4


def test_inspect_eval(real, tmp_path):
    server, recorder = real
    recorder.log.clear()
    samples = [["hello", "x"], ["What is 2+2?", "4"]]
    runs = _probe("inspect", {"base_url": server.url, "model": MODEL_NAME, "samples": samples,
                              "max_tokens": 64, "log_dir": str(tmp_path / "logs"), "cwd": str(tmp_path)})
    assert [r["responses_api"] for r in runs] == [False, True]
    # inspect sends no seed to the Responses API, so a reply may run to max_tokens (incomplete);
    # inspect takes it as a reply cut at the limit, and so do these checks
    for run in runs:
        assert run["status"] == "success", run["error"]
        assert len(run["outputs"]) == 2
    chat = [(p, b, a) for p, b, a in recorder.log if p == "/v1/chat/completions"]
    responses = [(p, b, a) for p, b, a in recorder.log if p == "/v1/responses"]
    assert len(chat) == 2 and len(responses) == 2
    for run, calls in zip(runs, (chat, responses)):
        returned = {}
        for _, body, answer in calls:
            turns = body.get("messages") or body.get("input")
            returned[turns[-1]["content"] if isinstance(turns[-1]["content"], str)
                     else "".join(p["text"] for p in turns[-1]["content"])] = _answer_text(answer, completed=False)
        assert sorted(run["outputs"]) == sorted(returned[text] for text, _ in samples)
