"""The vLLM plugin outside its tested releases refuses only the engines asking for DIVERSED (no vLLM needed)."""

import logging

import pytest

from diversed_hf.vllm_plugin.versions import guard_unsupported_vllm, is_supported_vllm


@pytest.mark.parametrize(
    "version, supported",
    [("0.32.0", True), ("0.32.0+cpu", True), ("0.32.1rc1", True), ("0.31.2", False), ("0.33.0", False), ("dev", False)],
)
def test_supported_releases(version, supported):
    assert is_supported_vllm(version) is supported


def _config_class():
    class Config:  # stands in for vLLM's VllmConfig: __post_init__ runs at construction
        def __init__(self, additional_config):
            self.additional_config = additional_config
            self.__post_init__()

        def __post_init__(self):
            self.checked = True

    return Config


def test_an_unsupported_release_refuses_only_diversed_engines_and_warns(caplog):
    config_class = _config_class()
    with caplog.at_level(logging.WARNING):
        guard_unsupported_vllm(config_class, "0.40.0")
    assert "vLLM 0.40.0" in caplog.text and "run untouched" in caplog.text
    assert config_class({}).checked and config_class({"other": 1}).checked
    with pytest.raises(RuntimeError, match=r"vLLM 0\.40\.0.*diversed_hf\[vllm\]"):
        config_class({"diversed": {"target_weight": 0.5}})
    guard_unsupported_vllm(config_class, "0.40.0")  # vLLM loads plugins in every process: wrapping twice is a no-op
    assert config_class({}).checked


def test_without_a_hook_every_engine_is_refused_loudly():
    with pytest.raises(RuntimeError, match="cannot find VllmConfig.__post_init__"):
        guard_unsupported_vllm(type("Config", (), {}), "0.40.0")
