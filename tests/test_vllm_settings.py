"""The vLLM plugin's settings (``additional_config["diversed"]``): checked without vLLM, in the main suite."""

import pytest
import torch

from diversed_hf import testbed
from diversed_hf.verifiers import HeadVerifier, StaticEnsembleVerifier
from diversed_hf.vllm_plugin.settings import settings_from_additional_config


def test_no_diversed_entry_means_the_engine_is_vllms_own():
    assert settings_from_additional_config({}) is None
    assert settings_from_additional_config({"other_plugin": 1}) is None


def test_a_static_weight_builds_the_static_ensemble_verifier():
    settings = settings_from_additional_config({"diversed": {"target_weight": 0.25}})
    verifier, identity = settings.build_verifier()
    assert verifier == StaticEnsembleVerifier(0.25)
    assert "target_weight=0.25" in identity


@pytest.mark.parametrize(
    "values, message",
    [
        ({}, "exactly one of `target_weight`"),
        ({"target_weight": 0.5, "head": "x"}, "exactly one of `target_weight`"),
        ({"target_weight": 1.5}, r'\["target_weight"\] must be a number in \[0, 1\]'),
        ({"target_weight": "0.5"}, r'\["target_weight"\] must be a number'),
        ({"target_weight": 0.5, "mixing": "geometric"}, r'\["mixing"\] must be one of'),
        ({"head": "x", "mixing": "logits"}, "a head mixes in its own config's space"),
        ({"target_weight": 0.5, "weight": 1}, r"unknown keys \['weight'\]"),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(values, message):
    with pytest.raises(ValueError, match=message):
        settings_from_additional_config({"diversed": values})


def test_settings_must_be_an_object():
    with pytest.raises(ValueError, match="must be a JSON object"):
        settings_from_additional_config({"diversed": 0.5})


def test_a_head_on_hidden_states_is_refused_with_the_heads_that_work():
    settings = settings_from_additional_config({"diversed": {"head": str(testbed.asset_path("heads/arith"))}})
    with pytest.raises(ValueError, match=r"reads hidden states.*use_hidden_states=False.*target_weight"):
        settings.build_verifier()


def test_a_features_only_head_loads_with_its_identity(tmp_path):
    from diversed_hf import DiversedHead

    head = DiversedHead(use_hidden_states=False, features=["tv", "draft_top1"])
    head.save_pretrained(tmp_path)
    verifier, identity = settings_from_additional_config({"diversed": {"head": str(tmp_path)}}).build_verifier()
    assert isinstance(verifier, HeadVerifier)
    assert torch.equal(verifier.head.net[-1].weight, head.net[-1].weight)
    assert str(tmp_path) in identity and "features=['tv', 'draft_top1']" in identity and "weights sha256=" in identity
