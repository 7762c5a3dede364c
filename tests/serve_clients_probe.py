"""Run by tests/serve/test_serve_clients.py with .venv-serve-clients' python (the OpenAI Agents SDK and
inspect-ai are not in .venv). ``python serve_clients_probe.py agents|inspect SPEC_JSON`` drives the
real client against a running ``spade serve`` and prints one JSON line per run."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any


def agents_runs(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                        function_tool, set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no trace export (it would go to OpenAI's servers)
    client = AsyncOpenAI(base_url=spec["base_url"], api_key="unused", max_retries=0, timeout=60)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    async def one(api: str, streamed: bool) -> dict[str, Any]:
        model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                      model=model_class(model=spec["model"], openai_client=client),
                      model_settings=ModelSettings(max_tokens=spec["max_tokens"],
                                                   extra_body={"seed": spec["seed"]}))
        calls.clear()
        events: list[str] = []
        if streamed:
            result = Runner.run_streamed(agent, spec["input"])
            async for event in result.stream_events():
                events.append(event.type)
        else:
            result = await Runner.run(agent, spec["input"])
        return {"api": api, "streamed": streamed, "final_output": result.final_output,
                "tool_calls": list(calls), "events": events,
                "items": [item.type for item in result.new_items]}

    async def main() -> list[dict[str, Any]]:
        return [await one(api, streamed) for api in ("responses", "chat_completions")
                for streamed in (False, True)]

    return asyncio.run(main())


def inspect_runs(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    # the provider reads <SERVICE>_BASE_URL and <SERVICE>_API_KEY for openai-api/<service>/<model>
    os.environ["SPADE_BASE_URL"] = spec["base_url"]
    os.environ["SPADE_API_KEY"] = "unused"
    out = []
    for responses_api in (False, True):
        task = Task(dataset=[Sample(input=text, target=target) for text, target in spec["samples"]],
                    solver=generate(), scorer=includes(), name=f"spade_serve_{int(responses_api)}")
        (log,) = eval(task, model=f"openai-api/spade/{spec['model']}",
                      model_args={"responses_api": responses_api}, log_dir=spec["log_dir"],
                      max_tokens=spec["max_tokens"], display="none", log_level="warning")
        out.append({"responses_api": responses_api, "status": log.status,
                    "error": str(log.error) if log.error else None,
                    "outputs": [s.output.completion for s in log.samples or []],
                    "inputs": [s.input for s in log.samples or []],
                    "scores": [{k: v.value for k, v in (s.scores or {}).items()} for s in log.samples or []]})
    return out


if __name__ == "__main__":
    kind, spec = sys.argv[1], json.loads(sys.argv[2])
    for run in (agents_runs if kind == "agents" else inspect_runs)(spec):
        print(json.dumps(run))
