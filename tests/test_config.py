"""Config loading: wrong keys, types and choices are refused with the key and what is allowed."""

from __future__ import annotations

import pytest

from spade.config import ConfigError, load_yaml
from spade.envs.sandbox.config import SandboxConfig


def test_defaults_match_the_spec_timeouts():
    config = SandboxConfig.from_mapping({})
    assert config.isolation == "bubblewrap"
    assert (config.load_timeout_s, config.step_timeout_s) == (30.0, 30.0)


def test_values_are_taken_and_coerced():
    config = SandboxConfig.from_mapping({"isolation": "unsafe-local", "step_timeout_s": 2,
                                         "allowed_imports": ["math", "random"]})
    assert config.isolation == "unsafe-local" and config.step_timeout_s == 2.0
    assert config.allowed_imports == ("math", "random")


@pytest.mark.parametrize("data, fragments", [
    ({"isolation": "docker"}, ["sandbox.isolation", "'docker'", "bubblewrap", "unsafe-local"]),
    ({"step_timeout": 3}, ["sandbox.step_timeout", "unknown key", "step_timeout_s"]),
    ({"pool_size": "two"}, ["sandbox.pool_size", "integer"]),
    ({"pool_size": True}, ["sandbox.pool_size", "integer"]),
    ({"pool_size": 0}, ["sandbox.pool_size", "positive"]),
    ({"memory_limit_mb": 8}, ["sandbox.memory_limit_mb", "at least 64"]),
    ({"allowed_imports": "math"}, ["sandbox.allowed_imports", "list"]),
    ({"allowed_imports": ["math", 3]}, ["sandbox.allowed_imports[1]", "string"]),
])
def test_invalid_values_name_the_key(data, fragments):
    with pytest.raises(ConfigError) as caught:
        SandboxConfig.from_mapping(data)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_yaml_errors_are_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sandbox: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(listing)
