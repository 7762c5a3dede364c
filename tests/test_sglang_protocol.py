"""SGLang protocol translation, checked against response shapes recorded from SGLang's source.

SGLang itself needs a GPU, so these are literal JSON bodies written from the code that builds
them (paths are inside https://github.com/sgl-project/sglang).
"""

from __future__ import annotations

import json

import pytest

from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout import sglang_protocol as proto

# Shape from python/sglang/srt/managers/tokenizer_manager.py::_handle_batch_output (non-streaming,
# return_logprob=True, logprob_start_len=-1): {"text", "output_ids", "meta_info"}; meta_info keys
# id / finish_reason / prompt_tokens / weight_version / completion_tokens / cached_tokens /
# output_token_logprobs ([logprob, token_id, text|None]; text is None unless
# return_text_in_logprobs). finish_reason from schedule_batch.py FINISH_MATCHED_TOKEN.to_json().
RECORDED_STOP = json.loads("""
{
  "text": " Paris.",
  "output_ids": [12366, 13, 151645],
  "meta_info": {
    "id": "8c1d2f0e6a7b4c1e9d3f2a1b0c9d8e7f",
    "finish_reason": {"type": "stop", "matched": 151645},
    "prompt_tokens": 5,
    "weight_version": "default",
    "total_retractions": 0,
    "completion_tokens": 3,
    "cached_tokens": 0,
    "e2e_latency": 0.0421,
    "input_token_logprobs": [],
    "output_token_logprobs": [[-0.0312, 12366, null], [-0.4471, 13, null], [-0.0009, 151645, null]]
  }
}
""")

# FINISH_LENGTH.to_json() -> {"type": "length", "length": n}; weight_version set by an update
# (UpdateWeightsFromTensorReqInput.weight_version is a string).
RECORDED_LENGTH = json.loads("""
{
  "text": "abcd",
  "output_ids": [64, 65, 66, 67],
  "meta_info": {
    "id": "r-length",
    "finish_reason": {"type": "length", "length": 4},
    "prompt_tokens": 3,
    "weight_version": "7",
    "completion_tokens": 4,
    "cached_tokens": 2,
    "output_token_logprobs": [[-1.5, 64, null], [-2.25, 65, null], [-0.5, 66, null], [-3.0, 67, null]]
  }
}
""")

# FINISH_ABORT.to_json() -> {"type": "abort", "message", "status_code", "err_type"}
# (tokenizer_manager.py::_handle_abort_req also reports completion_tokens=len(output_ids)).
RECORDED_ABORT = json.loads("""
{
  "text": "",
  "output_ids": [],
  "meta_info": {
    "id": "r-abort",
    "finish_reason": {"type": "abort", "message": "Abort in waiting queue", "status_code": null, "err_type": null},
    "weight_version": "default",
    "completion_tokens": 0,
    "output_token_logprobs": []
  }
}
""")

# http_server.py::_create_error_response -> HTTP 400 {"error": {"message": str(e)}}
RECORDED_ERROR = {"error": {"message": "The input (40000 tokens) is longer than the model's context length (32768 tokens)."}}


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


def test_parse_abort():
    r = proto.parse_generate_response(RECORDED_ABORT, req(), default_weight_version=1)
    assert (r.token_ids, r.logprobs, r.finish_reason, r.weight_version) == ((), (), "abort", 1)


def test_parse_batch_of_one():
    assert proto.parse_generate_response([RECORDED_STOP], req()).finish_reason == "stop"


@pytest.mark.parametrize(
    "fr,expected",
    [
        ({"type": "stop", "matched": 2}, "stop"),
        ({"type": "stop", "matched": "</s>"}, "stop"),  # FINISH_MATCHED_STR
        ({"type": "length", "length": 10}, "length"),
        ({"type": "abort", "message": "x", "status_code": 400, "err_type": None}, "abort"),
        ("stop", "stop"),
    ],
)
def test_finish_reason_mapping(fr, expected):
    assert proto.parse_finish_reason(fr) == expected


def test_server_error():
    with pytest.raises(proto.SGLangServerError, match="context length"):
        proto.parse_generate_response(RECORDED_ERROR, req())


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
    assert proto.release_memory_payload() == {"tags": ["weights", "kv_cache"]}
    assert proto.resume_memory_payload(["weights"]) == {"tags": ["weights"]}
    assert proto.release_memory_payload(None) == {"tags": None}
    with pytest.raises(ValueError, match="cuda_graph"):
        proto.release_memory_payload(["cuda_graph"])
    assert proto.pause_generation_payload("retract") == {"mode": "retract"}
    with pytest.raises(ValueError):
        proto.pause_generation_payload("stop")
    assert proto.continue_generation_payload() == {}
    assert proto.init_weights_update_group_payload("10.0.0.1", 29500, 1, 3) == {
        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 3,
        "group_name": "weight_update_group", "backend": "nccl",
    }
    assert proto.update_weights_from_distributed_payload(
        ["model.embed_tokens.weight"], ["torch.bfloat16"], [(10, 4)], weight_version=5
    ) == {
        "names": ["model.embed_tokens.weight"], "dtypes": ["bfloat16"], "shapes": [[10, 4]],
        "group_name": "weight_update_group", "flush_cache": True, "weight_version": "5",
    }
    assert proto.update_weights_from_tensor_payload(["b64"], weight_version=2) == {
        "serialized_named_tensors": ["b64"], "load_format": None, "flush_cache": True,
        "weight_version": "2",
    }
    with pytest.raises(ValueError, match="length"):
        proto.update_weights_from_distributed_payload(["a"], [], [])


def test_control_response_check():
    # weight endpoints: {"success", "message"} (http_server.py update_weights_from_*)
    assert proto.check_control_response("/update_weights_from_tensor", 200, {"success": True, "message": "ok"})
    with pytest.raises(proto.SGLangServerError, match="shape mismatch"):
        proto.check_control_response("/update_weights_from_tensor", 400, {"success": False, "message": "shape mismatch"})
    assert proto.check_control_response("/release_memory_occupation", 200, None) is None
    with pytest.raises(proto.SGLangServerError, match="HTTP 400"):
        proto.check_control_response("/flush_cache", 400, "Cache flushed.\n")
    assert set(proto.ENDPOINTS) >= {
        "generate", "update_weights_from_tensor", "update_weights_from_distributed",
        "init_weights_update_group", "release_memory_occupation", "resume_memory_occupation",
        "flush_cache", "pause_generation", "continue_generation", "health", "get_server_info",
    }
    assert proto.SGLANG_REFERENCE
