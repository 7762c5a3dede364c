"""Wrappers around a real engine for tests that count what the code under test asks of it."""

from __future__ import annotations


class CountingEngine:
    """The hf engine, counting the generations it is asked for."""

    def __init__(self, engine) -> None:
        self.inner = engine
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request):
        self.calls += 1
        return await self.inner.generate(request)
