"""Curriculum analysis of self-play runs (SPEC section 6) and the environment explorer.

``run_reader`` reads run directories; one module per metric family computes numbers from the
environments it returns (``diversity``, ``learnability``, ``reward_levels``, ``formula``,
``state_gating``, ``program_size``, ``collapse``, ``hint_leakage``, ``tsne_map``, and for RLVE runs
``rlve_levels``); ``sources`` says which of them apply to a run's ``selfplay.env_source``;
``report`` puts them together per environment, per regeneration step, per window of steps and per
run; ``writers`` and ``plots`` write JSON, CSV and PNG; ``explorer`` builds and serves the web page.

Layer: above ``spade.selfplay`` and ``spade.envs``, beside ``spade.eval``; nothing below imports it.
See docs/analysis.md.
"""
