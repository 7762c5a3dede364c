"""The ACEBench driver: runs in the ACEBench venv, never in the trainer's (``spade.eval.acebench``).

``python acebench_driver.py CONFIG.json``, started by ``spade.eval.external_harness.run_driver`` with
the work directory (``DIR/acebench``) as its current directory and no ``PYTHONPATH``: it imports
ACEBench from the checkout named in the config and nothing of spade. Per trial and category it runs
ACEBench's own dialogue loop with the agent and user endpoints of the config, scores with ACEBench's
``agent_eval`` and rewrites ``CONFIG["output"]`` with the report so far. Exit status 3 (with
``import_error`` in the output) when ACEBench does not import.
"""

import hashlib, importlib.util, json, os, sys, threading, traceback, types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

cfg = json.loads(Path(sys.argv[1]).read_text())
out_path = Path(cfg["output"])
sys.path.insert(0, cfg["repo"])


def placeholder(name, attrs):
    # ACEBench's model_infer imports vLLM and google-generativeai at module level for its local and
    # Gemini backends; the evaluated model is reached over HTTP here, so they are never called.
    module = types.ModuleType(name)
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{name} is not installed: the ACEBench driver talks to models over HTTP")
    for attr in attrs:
        setattr(module, attr, unavailable)
    return module


if importlib.util.find_spec("vllm") is None:
    sys.modules["vllm"] = placeholder("vllm", ("LLM", "SamplingParams"))
try:
    import google.generativeai  # noqa: F401
except ImportError:
    google = sys.modules.get("google") or sys.modules.setdefault("google", types.ModuleType("google"))
    google.generativeai = sys.modules["google.generativeai"] = placeholder("google.generativeai",
                                                                           ("configure", "GenerativeModel"))
try:
    from openai import OpenAI
    import eval_main
    from generate import sort_json
    from model_eval.evaluation_helper import load_file
    from model_inference import common_inference
    from model_inference.base_inference import BaseHandler
    from model_inference.common_inference import CommonInference
    from model_inference.multi_turn.APIModel_user import APIUSER
except Exception as exc:
    out_path.write_text(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(3)

lang = cfg["language"]
agent, user = cfg["agent"], cfg["user"]


class EndpointModel:
    """The evaluated model in the place of ACEBench's local model object: the same
    inference(system_prompt, user_prompt) -> text, answered by the agent endpoint."""

    def __init__(self, seed):
        self.client = OpenAI(base_url=agent["url"], api_key=agent["api_key"], max_retries=agent["max_retries"])
        self.seed, self.calls, self.finish = seed, 0, []

    def inference(self, system_prompt, user_prompt):
        request = {"model": agent["model"], "temperature": agent["temperature"], "top_p": agent["top_p"],
                   "max_tokens": agent["max_tokens"], "seed": (self.seed + self.calls) % (1 << 31),
                   "messages": [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_prompt}]}
        if agent["extra_body"]:
            request["extra_body"] = agent["extra_body"]
        self.calls += 1
        response = self.client.chat.completions.create(**request)
        self.finish.append(response.choices[0].finish_reason)
        return response.choices[0].message.content or ""


class EndpointUser(APIUSER):
    """ACEBench's user simulator (its prompts, step and respond) with its client on the configured
    endpoint: ACEBench picks an endpoint from a substring of the model name (gpt, qwen, ...)."""

    def __init__(self, model_name, involved_class, temperature=0.001, top_p=1, max_tokens=1000, language="zh"):
        key = os.environ.get(user["api_key_env"]) if user["api_key_env"] else user["api_key"]
        self.client = OpenAI(base_url=user["url"], api_key=key or "none", max_retries=user["max_retries"])
        self.model_name = user["model"]
        self.temperature, self.top_p, self.max_tokens = user["temperature"], user["top_p"], user["max_tokens"]
        self.involved_class, self.messages, self.language = involved_class, [], language


common_inference.APIUSER = EndpointUser


def new_inference(run_name, seed):
    # CommonInference's __init__ loads a tokenizer and a vLLM engine; its agent loops need only these.
    inference = CommonInference.__new__(CommonInference)
    BaseHandler.__init__(inference, run_name, None, agent["temperature"], agent["top_p"], agent["max_tokens"], lang)
    inference.model_path, inference.user_model = None, user["model"]
    inference.max_message_index = cfg["max_dialog_turns"]
    inference.model = EndpointModel(seed)
    return inference


def item_seed(trial, item_id):
    digest = hashlib.sha256(f"{cfg['seed']}:{trial}:{item_id}".encode()).hexdigest()
    return int(digest[:8], 16)


def kept_lines(path):
    """Finished items of an earlier run: parsable lines without a run error, first per id."""
    if not path.is_file():
        return []
    kept, seen = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "run_error" not in entry and entry.get("id") not in seen:
            seen.add(entry["id"])
            kept.append(line)
    return kept


def run_category(trial, category):
    name = f"agent_{category}"
    run_name = f"spade_trial{trial}"
    data_dir = f"./data_all/data_{lang}/"
    result_dir = f"./result_all/result_{lang}/"
    cases = load_file(f"{data_dir}data_{name}.json")[: cfg["limit"]]
    answers = load_file(f"{data_dir}possible_answer/data_{name}.json")[: cfg["limit"]]
    if [c["id"] for c in cases] != [a["id"] for a in answers]:
        raise RuntimeError(f"data_{name}.json and its possible_answer list different ids")
    result_file = Path(f"{result_dir}{run_name}/data_{name}_result.json")
    result_file.parent.mkdir(parents=True, exist_ok=True)
    kept = kept_lines(result_file)
    result_file.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    done = {json.loads(line)["id"] for line in kept}
    lock, failures, finish = threading.Lock(), {}, {}

    def one(case):
        inference = new_inference(run_name, item_seed(trial, case["id"]))
        functions = case["function"]
        if isinstance(functions, (dict, str)):
            functions = [functions]
        try:
            result, process = inference.inference(case["question"], functions, "", "", case, case["id"])
            entry = {"id": case["id"], "result": result, "process": process}
            json.dumps(entry)
        except Exception:
            if not cfg["skip_failed"]:
                raise
            text = traceback.format_exc()[-2000:]
            entry = {"id": case["id"], "result": [], "process": [], "run_error": text}
            failures[case["id"]] = text
        finish[case["id"]] = inference.model.finish
        with lock:
            inference.write_result(entry, run_name, result_dir)

    todo = [c for c in cases if c["id"] not in done]
    with ThreadPoolExecutor(max_workers=cfg["max_concurrency"]) as pool:
        for future in [pool.submit(one, c) for c in todo]:
            future.result()
    sort_json(str(result_file))
    results = load_file(str(result_file))
    if [r["id"] for r in results] != [c["id"] for c in cases]:
        raise RuntimeError(f"{result_file} does not hold exactly the {len(cases)} items run")

    eval_main.language = lang  # agent_eval reads these module globals, set by eval_main's __main__
    eval_main.OUTPUT_PATH = f"./score_all/score_{lang}/"
    os.makedirs(f"{eval_main.OUTPUT_PATH}{run_name}", exist_ok=True)
    items = []
    for index, (result, case, answer) in enumerate(zip(results, cases, answers)):
        correct, process = eval_main.agent_eval([result], [case], [answer], name, run_name)
        items.append({"id": case["id"], "correct": correct == 1, "process_accuracy": process,
                      "calls": result["process"], "run_error": result.get("run_error"),
                      "finish_reasons": finish.get(case["id"])})
    # Last, over the whole category, so that ACEBench's score files are those of the full run.
    accuracy, process_accuracy = eval_main.agent_eval(results, cases, answers, name, run_name)
    score_file = Path(f"{eval_main.OUTPUT_PATH}{run_name}/data_{name}_score.json")
    for row in load_file(str(score_file))[1:]:
        items[row["id"]]["error_type"] = row.get("error_type")
        items[row["id"]]["errors"] = [str(e)[:500] for e in row.get("error", [])][:5]
    return {"accuracy": accuracy, "process_accuracy": process_accuracy, "items": items,
            "result_file": str(result_file.resolve()), "score_file": str(score_file.resolve())}


report = {"trials": {}}
for trial in range(cfg["trials"]):
    report["trials"][str(trial)] = {}
    for category in cfg["categories"]:
        try:
            report["trials"][str(trial)][category] = run_category(trial, category)
        except BaseException:
            report["trials"][str(trial)][category] = {"error": traceback.format_exc()[-4000:]}
        out_path.write_text(json.dumps(report))
