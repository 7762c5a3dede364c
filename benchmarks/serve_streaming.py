"""Time to first token against total time for one streamed completion through ``spade serve``.

Serves a model with spade serve's application on a thread of this process (hf engine, or
``--sglang-url`` for running SGLang servers), asks the ``openai`` client for one streamed
completion of ``--tokens`` tokens (``ignore_eos``, greedy) and prints, side by side, when the
first content arrived and when the stream ended. Without real streaming the two are equal.

    python benchmarks/serve_streaming.py --model embedded
    python benchmarks/serve_streaming.py --model /models/Qwen3-4B --device cuda --tokens 128
"""

from __future__ import annotations

import argparse
import statistics
import time

from spade.cli.serve import ServeOptions, build_service

from spade.serve.server import BackgroundServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="HF model directory, or 'embedded'")
    parser.add_argument("--engine", default="hf", choices=("hf", "sglang"))
    parser.add_argument("--sglang-url", nargs="*", default=[])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import openai

    service = build_service(ServeOptions(model=args.model, engine=args.engine,
                                         sglang_urls=args.sglang_url, device=args.device))
    with BackgroundServer(service) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600)
        request = dict(model=service.name, prompt="Once upon a time", max_tokens=args.tokens,
                       temperature=0, extra_body={"ignore_eos": True})
        client.completions.create(**request)  # warm-up
        firsts, totals = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            first = None
            for chunk in client.completions.create(stream=True, **request):
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter() - started
            totals.append(time.perf_counter() - started)
            firsts.append(first if first is not None else totals[-1])
    first, total = statistics.median(firsts), statistics.median(totals)
    print(f"{'model':<28} {'tokens':>6} {'first token (s)':>16} {'total (s)':>10} {'first/total':>12}")
    print(f"{service.name[:28]:<28} {args.tokens:>6} {first:>16.3f} {total:>10.3f} {first / total:>12.3f}")


if __name__ == "__main__":
    main()
