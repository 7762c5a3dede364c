"""``spade serve``: an OpenAI-compatible HTTP server over the rollout engines (see docs/serving.md).

``http`` is a small asyncio HTTP/1.1 server, ``protocol`` the OpenAI request and response format,
``service`` the application over one model and engine, ``server`` the builder and runner. This
package may import spade.rollout, spade.agent and spade.models; nothing below it imports it.
"""
