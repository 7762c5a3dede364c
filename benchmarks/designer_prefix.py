"""One regeneration's designer batch on the hf engine, three ways, side by side.

Builds the smoke run's designer prompts (examples/smoke_cpu.yaml: the embedded model, 16 slots,
the two seed examples in the memory block, 20-word corpus documents), then generates them as one
batch: as the engine does by default (the common prefix computed once and attended to once by
every row), with the prefix computed once but its cache copied into every row (what the engine
does for models without shared-prefix attention), and with no sharing at all. Prints prompt time,
whole-batch time and the mean decode step for each, and the ratios to the default.

    python benchmarks/designer_prefix.py [--slots 16] [--max-new-tokens 450]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from spade.designer.corpus import Corpus, CorpusSettings, attempt_rng
from spade.designer.memory import MemorySelection, format_memory_block, load_seed_records
from spade.designer.prompts import DesignerRequest, designer_messages
from spade.designer.skills import SkillSettings
from spade.models.embedded import embedded_model_dir
from spade.rollout import GenerationRequest, HFEngine, SamplingParams
from spade.rollout.hf import scheduler
from spade.rollout.conversation import ChatFormat, Conversation
from spade.selfplay.sources.designer_source import resolve_seed_dir


def prompts(tokenizer, slots: int) -> list[tuple[int, ...]]:
    skill = SkillSettings().skill_list("games")[0]
    seeds = load_seed_records(resolve_seed_dir("examples/seed_envs"), [skill.name])
    block = format_memory_block(MemorySelection(skill=skill.name, positives=tuple(seeds)))
    corpus = Corpus(CorpusSettings.for_domain("games", ["examples/corpus/demo.jsonl.gz"], max_words=20))
    out = []
    for slot in range(slots):
        document = corpus.sample(attempt_rng(1234, 0, slot, 0))
        request = DesignerRequest(skill=skill, document=document.text, memory_block=block, difficulty="medium",
                                  max_turns=2)
        conversation = Conversation(tokenizer, designer_messages(request, order="shared_prefix"), max_context_tokens=3072,
                                    chat_format=ChatFormat(tokenizer))
        out.append(tuple(conversation.token_ids))
    return out


def run(engine: HFEngine, batch: list[tuple[int, ...]], max_new: int) -> tuple[float, int]:
    async def go():
        requests = [GenerationRequest(p, SamplingParams(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=max_new,
                                                        seed=i, ignore_eos=True)) for i, p in enumerate(batch)]
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    started = time.perf_counter()
    results = asyncio.run(go())
    return time.perf_counter() - started, sum(len(r.token_ids) for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=450)
    args = parser.parse_args()
    directory = embedded_model_dir()
    engine = HFEngine(directory, max_batch_size=args.slots, batch_wait_ms=500.0)
    batch = prompts(engine.tokenizer, args.slots)
    shared = scheduler.shared_prefix_length(batch)
    print(f"{args.slots} prompts of {min(map(len, batch))}-{max(map(len, batch))} tokens, "
          f"{shared} shared; {args.max_new_tokens} new tokens each")
    figures = {}
    available = engine.prefix_attention
    for label, minimum, attended in (("prefix attended once", scheduler.MIN_SHARED_PREFIX, True),
                                     ("prefix copied per row", scheduler.MIN_SHARED_PREFIX, False),
                                     ("no sharing", 10**9, False)):
        scheduler.MIN_SHARED_PREFIX = minimum
        engine.prefix_attention = attended and available
        prefill, _ = run(engine, batch, 1)
        total, tokens = run(engine, batch, args.max_new_tokens)
        step = (total - prefill) / max(1, args.max_new_tokens - 1)
        figures[label] = (prefill, total, step)
        print(f"{label:>22}: prompts {prefill:6.1f} s, whole batch {total:6.1f} s ({tokens / total:5.1f} tok/s), "
              f"decode step {step * 1000:5.0f} ms")
    base = figures["prefix attended once"]
    for label in ("prefix copied per row", "no sharing"):
        other = figures[label]
        print(f"{label} / attended once: prompts {other[0] / base[0]:.2f}, whole batch {other[1] / base[1]:.2f}, "
              f"decode step {other[2] / base[2]:.2f}")
    engine.close()


if __name__ == "__main__":
    random.seed(0)
    main()
