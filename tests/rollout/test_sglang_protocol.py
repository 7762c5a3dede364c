"""SGLang protocol translation, checked against response shapes recorded from SGLang's source.

SGLang itself needs a GPU, so these are literal JSON bodies written from the code that builds them
in the pinned release, the ``sglang==0.5.23`` wheel (paths are inside that package).
``tests/rollout/test_sglang_upstream.py`` checks them against that wheel's code: their keys are keys SGLang
writes, and ``SGLANG_SAMPLING_KEYS`` is its /generate schema's list. The servers
run with ``--skip-tokenizer-init`` (``launcher.sglang_argv``), so finished results carry no
``"text"``.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.sglang import control_protocol as control
from spade.rollout.sglang import protocol as proto
from spade.rollout.sglang import tensor_payload

# srt/managers/tokenizer_manager.py::_handle_batch_output for a BatchTokenIDOutput (non-streaming,
# return_logprob=True, logprob_start_len=-1, metrics off): {"output_ids", "meta_info"}. meta_info in
# the order it is built: id / finish_reason / prompt_tokens / weight_version / num_retractions, the
# log-prob fields (add_logprob_to_meta_info: output_token_logprobs triples [logprob, token_id, None]
# plus output_token_logprobs_length), reasoning_tokens / completion_tokens / cached_tokens,
# weight_versions (srt/utils/weight_versions.py, always present once finished), and
# response_sent_to_client_ts (_stream_one_response). finish_reason from schedule_batch.py
# FINISH_MATCHED_TOKEN.to_json().
RECORDED_STOP = json.loads("""
{
  "output_ids": [12366, 13, 151645],
  "meta_info": {
    "id": "8c1d2f0e6a7b4c1e9d3f2a1b0c9d8e7f",
    "finish_reason": {"type": "stop", "matched": 151645},
    "prompt_tokens": 5,
    "weight_version": "default",
    "num_retractions": 0,
    "input_token_logprobs": [],
    "output_token_logprobs": [[-0.0312, 12366, null], [-0.4471, 13, null], [-0.0009, 151645, null]],
    "output_token_logprobs_length": 3,
    "reasoning_tokens": 0,
    "completion_tokens": 3,
    "cached_tokens": 0,
    "weight_versions": [{"version": "default", "start": 0, "end": 3}],
    "response_sent_to_client_ts": 1767225600.125
  }
}
""")

# FINISH_LENGTH.to_json() -> {"type": "length", "length": n}; weight_version is what the last
# weight update set (UpdateWeightsFromTensorReqInput.weight_version, a string).
RECORDED_LENGTH = json.loads("""
{
  "output_ids": [64, 65, 66, 67],
  "meta_info": {
    "id": "r-length",
    "finish_reason": {"type": "length", "length": 4},
    "prompt_tokens": 3,
    "weight_version": "7",
    "num_retractions": 0,
    "input_token_logprobs": [],
    "output_token_logprobs": [[-1.5, 64, null], [-2.25, 65, null], [-0.5, 66, null], [-3.0, 67, null]],
    "output_token_logprobs_length": 4,
    "reasoning_tokens": 0,
    "completion_tokens": 4,
    "cached_tokens": 2,
    "weight_versions": [{"version": "7", "start": 0, "end": 4}],
    "response_sent_to_client_ts": 1767225600.5
  }
}
""")

# A request that was running while the weights changed (pause_generation mode retract/in_place,
# then an update with weight_version "7"): scheduler.py::record_weight_version_change records the
# old version at the current output length, so meta_info.weight_versions has two spans and
# weight_version is the newest.
RECORDED_TWO_VERSIONS = json.loads("""
{
  "output_ids": [64, 65, 66, 67],
  "meta_info": {
    "id": "r-mixed",
    "finish_reason": {"type": "length", "length": 4},
    "prompt_tokens": 3,
    "weight_version": "7",
    "num_retractions": 1,
    "input_token_logprobs": [],
    "output_token_logprobs": [[-1.5, 64, null], [-2.25, 65, null], [-0.5, 66, null], [-3.0, 67, null]],
    "output_token_logprobs_length": 4,
    "reasoning_tokens": 0,
    "completion_tokens": 4,
    "cached_tokens": 0,
    "weight_versions": [{"version": "6", "start": 0, "end": 2}, {"version": "7", "start": 2, "end": 4}]
  }
}
""")

# An abort in the waiting queue (tokenizer_manager.py::_handle_abort_req): finish_reason carries only
# type and message, "text" is state.get_text() (empty without a tokenizer), no prompt_tokens.
RECORDED_ABORT = json.loads("""
{
  "text": "",
  "output_ids": [],
  "meta_info": {
    "id": "r-abort",
    "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
    "weight_version": "default",
    "e2e_latency": 0.0123,
    "weight_versions": [{"version": "default", "start": 0, "end": 0}],
    "input_token_logprobs": [],
    "output_token_logprobs": [],
    "output_token_logprobs_length": 0,
    "completion_tokens": 0,
    "response_sent_to_client_ts": 1767225601.0
  }
}
""")

# A running request ended by /pause_generation {"mode": "abort"} (scheduler.py abort_request sets
# FINISH_ABORT(), status_code None): an ordinary result with the tokens produced so far.
RECORDED_ABORT_RUNNING = json.loads("""
{
  "output_ids": [11, 12],
  "meta_info": {
    "id": "r-aborted-running",
    "finish_reason": {"type": "abort", "message": "Aborted", "status_code": null, "err_type": null},
    "prompt_tokens": 5,
    "weight_version": "3",
    "num_retractions": 0,
    "input_token_logprobs": [],
    "output_token_logprobs": [[-0.25, 11, null], [-0.75, 12, null]],
    "output_token_logprobs_length": 2,
    "reasoning_tokens": 0,
    "completion_tokens": 2,
    "cached_tokens": 0,
    "weight_versions": [{"version": "3", "start": 0, "end": 2}]
  }
}
""")

# http_server.py::_create_error_response -> HTTP 400 {"error": {"message": str(e)}}; the message is
# tokenizer_manager.py's input-length check.
RECORDED_ERROR = {"error": {"message": "The input (40000 tokens) is longer than the model's context length (32768 tokens)."}}
# http_server.py::generate_request: the schema gate (api/v1/api_types.py) -> HTTP 400 {"error": str}.
RECORDED_CONTRACT_ERROR = {"error": "unknown field `seed`, expected one of `max_new_tokens`, `stop`, `stop_token_ids`"}
# FastAPI errors (an HTTPException from an abort with status 503, a body that does not parse):
# openai/protocol.py::ErrorResponse.model_dump().
RECORDED_ERROR_RESPONSE = {"object": "error", "message": "Request timed out in queue", "type": "503", "param": None, "code": 503}

# api/v1/api_types.py::SamplingParams: the keys the /generate schema gate accepts inside
# sampling_params (any other key is an HTTP 400).
SGLANG_SAMPLING_KEYS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
    "watermark", "choice",
}


def req(**kw) -> GenerationRequest:
    return GenerationRequest(prompt_ids=(1, 2, 3, 4, 5), sampling=SamplingParams(**kw))


def test_payload_fields():
    p = proto.generate_payload(
        req(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=16, stop_token_ids=(7, 8), seed=42),
        "rid-1",
    )
    assert p == {
        "input_ids": [1, 2, 3, 4, 5],
        "sampling_params": {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "max_new_tokens": 16,
            "no_stop_trim": True,
            "stop_token_ids": [7, 8],
            "sampling_seed": 42,
        },
        "rid": "rid-1",
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": False,
    }
    json.dumps(p)


def test_payload_defaults_greedy_no_seed():
    sp = proto.generate_payload(req(temperature=0.0), "r")["sampling_params"]
    assert sp["temperature"] == 0.0 and sp["top_k"] == -1
    assert "sampling_seed" not in sp and "stop_token_ids" not in sp and "ignore_eos" not in sp
    assert proto.generate_payload(req(ignore_eos=True), "r")["sampling_params"]["ignore_eos"] is True


def test_payload_passes_the_generate_schema_gate():
    """Every sampling key we can send is one the 0.5.23 schema knows, with the JSON type it wants
    (floats for temperature/top_p, ints for top_k/max_new_tokens/sampling_seed/stop ids, bools)."""
    p = proto.generate_payload(
        req(temperature=1, top_p=1, top_k=5, max_new_tokens=8, stop_token_ids=(2,), seed=0, ignore_eos=True), "r"
    )
    sp = json.loads(json.dumps(p))["sampling_params"]
    assert set(sp) <= SGLANG_SAMPLING_KEYS
    assert all(isinstance(sp[k], float) for k in ("temperature", "top_p"))
    assert all(type(sp[k]) is int for k in ("top_k", "max_new_tokens", "sampling_seed"))
    assert all(type(t) is int for t in sp["stop_token_ids"])
    assert sp["no_stop_trim"] is True and sp["ignore_eos"] is True
    assert set(p) == {"input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len", "stream"}


def test_parse_stop_exact():
    r = proto.parse_generate_response(RECORDED_STOP, req(), default_weight_version=3)
    assert r.token_ids == (12366, 13, 151645)
    assert r.logprobs == (-0.0312, -0.4471, -0.0009)
    assert r.finish_reason == "stop"
    assert r.weight_version == 3  # "default" is not numeric -> the engine's version


def test_parse_length_and_numeric_version():
    r = proto.parse_generate_response(RECORDED_LENGTH, req(max_new_tokens=4))
    assert r.token_ids == (64, 65, 66, 67)
    assert r.logprobs == (-1.5, -2.25, -0.5, -3.0)
    assert r.finish_reason == "length"
    assert r.weight_version == 7


def test_parse_two_weight_versions_reports_the_oldest():
    r = proto.parse_generate_response(RECORDED_TWO_VERSIONS, req(max_new_tokens=4))
    assert r.token_ids == (64, 65, 66, 67) and r.weight_version == 6
    assert proto.parse_weight_versions(None, 0) is None and proto.parse_weight_versions([], 0) is None
    # without spans (older servers, or a body that lacks them) weight_version is used
    d = json.loads(json.dumps(RECORDED_TWO_VERSIONS))
    del d["meta_info"]["weight_versions"]
    assert proto.parse_generate_response(d, req(max_new_tokens=4)).weight_version == 7


def test_parse_abort():
    r = proto.parse_generate_response(RECORDED_ABORT, req(), default_weight_version=1)
    assert (r.token_ids, r.logprobs, r.finish_reason, r.weight_version) == ((), (), "abort", 1)


def test_parse_abort_of_a_running_request_keeps_its_tokens():
    r = proto.parse_generate_response(RECORDED_ABORT_RUNNING, req())
    assert (r.token_ids, r.logprobs, r.finish_reason, r.weight_version) == ((11, 12), (-0.25, -0.75), "abort", 3)


def test_parse_batch_of_one():
    assert proto.parse_generate_response([RECORDED_STOP], req()).finish_reason == "stop"


@pytest.mark.parametrize(
    "fr,expected",
    [
        ({"type": "stop", "matched": 2}, "stop"),
        ({"type": "stop", "matched": "</s>"}, "stop"),  # FINISH_MATCHED_STR
        ({"type": "stop", "matched": [2, 3]}, "stop"),  # api_types.py Matched: a token list too
        ({"type": "abort", "message": "Abort in waiting queue"}, "abort"),
        ({"type": "length", "length": 10}, "length"),
        ({"type": "abort", "message": "x", "status_code": 400, "err_type": None}, "abort"),
        ("stop", "stop"),
    ],
)
def test_finish_reason_mapping(fr, expected):
    assert proto.parse_finish_reason(fr) == expected


@pytest.mark.parametrize(
    "body,message",
    [
        (RECORDED_ERROR, "context length"),
        (RECORDED_CONTRACT_ERROR, "unknown field `seed`"),
        (RECORDED_ERROR_RESPONSE, "timed out in queue"),
    ],
)
def test_server_error(body, message):
    with pytest.raises(proto.SGLangServerError, match=message):
        proto.parse_generate_response(body, req())


def _broken(mutate):
    d = json.loads(json.dumps(RECORDED_STOP))
    mutate(d)
    return d


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d.pop("output_ids"), "output_ids"),
        (lambda d: d.pop("meta_info"), "meta_info"),
        (lambda d: d["meta_info"].pop("finish_reason"), "finish_reason"),
        (lambda d: d["meta_info"].__setitem__("finish_reason", None), "finish_reason"),
        (lambda d: d["meta_info"].__setitem__("finish_reason", {"type": "eos"}), "finish_reason.type"),
        (lambda d: d["meta_info"].pop("output_token_logprobs"), "output_token_logprobs"),
        (lambda d: d["meta_info"]["output_token_logprobs"].pop(), "output_token_logprobs"),
        (lambda d: d["meta_info"]["output_token_logprobs"][1].__setitem__(1, 99), r"output_token_logprobs\[1\]\[1\]"),
        (lambda d: d["meta_info"]["output_token_logprobs"][0].__setitem__(0, None), r"output_token_logprobs\[0\]\[0\]"),
        (lambda d: d["meta_info"]["output_token_logprobs"].__setitem__(2, 5), r"output_token_logprobs\[2\]"),
        (lambda d: d.__setitem__("output_ids", [1, "2", 3]), "output_ids"),
        (lambda d: d["meta_info"].__setitem__("completion_tokens", 9), "completion_tokens"),
        (lambda d: d["meta_info"].__setitem__("weight_versions", "7"), "weight_versions"),
        (lambda d: d["meta_info"].__setitem__("weight_versions", [{"start": 0}]), r"weight_versions\[0\]"),
        (lambda d: d["meta_info"].__setitem__("weight_version", 7.5), "weight_version"),
    ],
)
def test_malformed_names_field(mutate, field):
    with pytest.raises(proto.SGLangProtocolError, match=field):
        proto.parse_generate_response(_broken(mutate), req())


def test_not_an_object():
    with pytest.raises(proto.SGLangProtocolError, match="JSON object"):
        proto.parse_generate_response("oops", req())


def test_too_many_tokens():
    with pytest.raises(proto.SGLangProtocolError, match="max_new_tokens"):
        proto.parse_generate_response(RECORDED_STOP, req(max_new_tokens=2))


def test_control_payloads():
    assert control.release_memory_payload() == {"tags": ["weights", "kv_cache"]}
    assert control.resume_memory_payload(["weights"]) == {"tags": ["weights"]}
    assert control.release_memory_payload(None) == {"tags": None}
    assert control.release_memory_payload(["cuda_graph"]) == {"tags": ["cuda_graph"]}  # srt/constants.py
    with pytest.raises(ValueError, match="unknown memory tags"):
        control.release_memory_payload(["activations"])
    assert control.pause_generation_payload("retract") == {"mode": "retract"}
    with pytest.raises(ValueError):
        control.pause_generation_payload("stop")
    assert control.continue_generation_payload() == {}
    assert control.continue_generation_payload(torch_empty_cache=False) == {"torch_empty_cache": False}
    assert control.abort_request_payload("r1") == {"rid": "r1", "abort_all": False}
    assert control.begin_weight_update_payload() == {"selector": "all"}
    with pytest.raises(ValueError, match="selector"):
        control.begin_weight_update_payload("trainer")
    assert control.end_weight_update_payload() == {}
    assert control.init_weights_update_group_payload("10.0.0.1", 29500, 1, 3) == {
        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 3,
        "group_name": "weight_update_group", "backend": "nccl",
    }
    assert control.destroy_weights_update_group_payload("g") == {"group_name": "g"}
    assert control.update_weights_from_distributed_payload(
        ["model.embed_tokens.weight"], ["torch.bfloat16"], [(10, 4)], weight_version=5
    ) == {
        "names": ["model.embed_tokens.weight"], "dtypes": ["bfloat16"], "shapes": [[10, 4]],
        "group_name": "weight_update_group", "flush_cache": True, "weight_version": "5",
    }
    assert control.update_weights_from_distributed_payload(
        ["w"], ["float32"], [(2,)], flush_cache=False, load_format="flattened_bucket", abort_all_requests=False,
    ) == {
        "names": ["w"], "dtypes": ["float32"], "shapes": [[2]], "group_name": "weight_update_group",
        "load_format": "flattened_bucket", "flush_cache": False, "abort_all_requests": False,
    }
    assert control.update_weights_from_tensor_payload(["b64"], weight_version=2) == {
        "serialized_named_tensors": ["b64"], "load_format": None, "flush_cache": True,
        "weight_version": "2",
    }
    assert control.update_weights_from_tensor_payload(["b64"], torch_empty_cache=True, selector="target") == {
        "serialized_named_tensors": ["b64"], "load_format": None, "flush_cache": True,
        "torch_empty_cache": True, "selector": "target",
    }
    with pytest.raises(ValueError, match="length"):
        control.update_weights_from_distributed_payload(["a"], [], [])
    for body in (control.update_weights_from_tensor_payload(["x"], weight_version=1),
                 control.update_weights_from_distributed_payload(["a"], ["int8"], [[1]], weight_version=1)):
        # io_struct.py declares these Optional[str]; the server's parser does not turn numbers into strings
        assert all(isinstance(body[k], str) for k in ("weight_version", "new_version") if k in body)


def test_control_response_check():
    # weight endpoints: {"success", "message"} (http_server.py update_weights_from_*, begin/end_weight_update)
    assert control.check_control_response("/update_weights_from_tensor", 200, {"success": True, "message": "Success"})
    with pytest.raises(proto.SGLangServerError, match="begin_weight_update"):
        control.check_control_response(
            "/update_weights_from_tensor", 400,
            {"success": False, "message": "update_weights_from_tensor must run between begin_weight_update() "
                                          "and end_weight_update()"})
    assert control.check_control_response("/release_memory_occupation", 200, None) is None
    with pytest.raises(proto.SGLangServerError, match="idle"):
        control.check_control_response("/release_memory_occupation", 400, {"error": {"message": "server is not idle"}})
    assert control.check_control_response("/pause_generation", 200,
                                        {"message": "Generation paused successfully.", "status": "ok"})
    assert control.check_control_response("/update_weight_version", 200,
                                        {"success": True, "message": "Weight version updated to 4", "new_version": "4"})
    with pytest.raises(proto.SGLangServerError, match="HTTP 400"):
        control.check_control_response("/flush_cache", 400, "Flush cache failed.\n")
    assert control.check_control_response("/flush_cache", 200, "Cache flushed.\nPlease check backend logs")
    with pytest.raises(proto.SGLangServerError, match="Field required"):
        control.check_control_response("/init_weights_update_group", 400,
                                     {"object": "error", "message": "Field required", "type": "Bad Request",
                                      "param": None, "code": 400})


def test_endpoints():
    assert set(proto.ENDPOINTS) >= {
        "generate", "update_weights_from_tensor", "update_weights_from_distributed",
        "init_weights_update_group", "destroy_weights_update_group", "begin_weight_update",
        "end_weight_update", "release_memory_occupation", "resume_memory_occupation", "flush_cache",
        "pause_generation", "continue_generation", "health", "server_info", "model_info",
        "get_server_info", "update_weight_version",
    }
    # http_server.py: /server_info and /model_info are GET routes, the control calls POST
    assert proto.ENDPOINTS["server_info"] == ("GET", "/server_info")
    assert proto.ENDPOINTS["model_info"] == ("GET", "/model_info")
    assert all(m == "POST" for n, (m, _p) in proto.ENDPOINTS.items()
               if n not in ("health", "health_generate", "ready", "server_info", "model_info",
                            "get_server_info", "get_model_info"))
    assert "0.5.23" in proto.SGLANG_REFERENCE and proto.SGLANG_MIN_VERSION == "0.5.23"


def test_server_and_model_info():
    # /server_info: build_server_info = ServerArgs.resolved_dict() (flat fields) + scheduler info
    info = {"model_path": "/models/qwen3", "tp_size": 2, "dp_size": 1, "weight_version": "default",
            "version": "0.5.23", "internal_states": [{}]}
    assert control.server_info_tp_size(info) == 2
    with pytest.raises(proto.SGLangProtocolError, match="tp_size"):
        control.server_info_tp_size({"version": "0.5.23"})


def test_serialized_tensors_only_name_globals_sglang_unpickles():
    """SGLang 0.5.23 decodes serialized_named_tensors with SafeUnpickler (srt/utils/common.py): only
    an allow-list of globals resolves. Our serializer's output must stay inside it (CPU tensors here;
    a CUDA tensor adds torch.multiprocessing.reductions.rebuild_cuda_tensor, also allowed)."""
    from spade.rollout.sglang.weight_transport import serialize_named_tensors

    bucket = torch.zeros(16)
    named = [
        ("a", bucket[:4].view(2, 2)), ("b", bucket[4:]),
        ("c", torch.ones(3, dtype=torch.bfloat16)), ("d", torch.nn.Parameter(torch.ones(2))),
        ("e", torch.ones(2, dtype=torch.float16)), ("f", torch.arange(3)),
    ]
    found = tensor_payload.payload_globals(serialize_named_tensors(named))
    assert found <= tensor_payload.SGLANG_TENSOR_PAYLOAD_GLOBALS, found - tensor_payload.SGLANG_TENSOR_PAYLOAD_GLOBALS
    assert ("torch.multiprocessing.reductions", "rebuild_tensor") in found
    assert ("torch.multiprocessing.reductions", "rebuild_cuda_tensor") in tensor_payload.SGLANG_TENSOR_PAYLOAD_GLOBALS
    # a payload naming anything else is caught, without calling it
    bad = tensor_payload.payload_globals(pickle.dumps([os.getcwd]))
    assert bad == {(os.getcwd.__module__, "getcwd")} and not bad <= tensor_payload.SGLANG_TENSOR_PAYLOAD_GLOBALS
    with pytest.raises(ValueError, match="base64"):
        tensor_payload.payload_globals("not base64!")
