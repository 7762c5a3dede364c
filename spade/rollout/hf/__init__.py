"""The hf engine: in-process transformers generation on CPU or one GPU, the embedded default and the
test engine (ARCHITECTURE principle 2).

``engine.HFEngine`` (the public calls, model loading, weight updates) is built on
``scheduler.BatchScheduler`` (requests batched on the event loop, decoded on one worker thread,
with continuous joins and a shared prompt prefix computed once); ``sampling`` draws each token;
``kv_cache`` is the cache that grows in chunks and takes rows mid-batch; ``prefix_attention``
attends to a batch's shared prefix once beside every row's own cache.
"""
