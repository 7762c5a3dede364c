"""The composition root of ``spade train``: builds every part from the config, runs Algorithm 1
step by step (``trainer``), and owns the run directory, checkpoints' bookkeeping and resume."""
