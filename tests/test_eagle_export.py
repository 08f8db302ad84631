"""``EagleDraft.save_for_vllm``: the layout vLLM's ``eagle`` method loads (diversed_hf/drafting/eagle_export.py).

Format only, on tiny models; tests/vllm_plugin/test_eagle_engine.py serves an export with vLLM itself.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import make_model, prompt
from transformers import LlamaConfig

from diversed_hf import EagleDraft, EagleDraftConfig


def llama_draft(num_layers: int = 2, draft_vocab_ids=None, dtype=torch.float32) -> EagleDraft:
    target = make_model("llama", hidden_size=32, num_layers=2).to(dtype)
    torch.manual_seed(3)
    return EagleDraft.for_target(target, num_layers=num_layers, draft_vocab_ids=draft_vocab_ids).eval()


def test_the_weights_are_the_drafts_own_under_vllms_names(tmp_path):
    draft = llama_draft(num_layers=2)
    weights = load_file(str(draft.save_for_vllm(tmp_path / "export") / "model.safetensors"))
    own = draft.state_dict()  # fc.weight, model.layers.<i>.*
    assert set(weights) == {name.removeprefix("model.") for name in own}
    assert "fc.weight" in weights and not any(name.startswith("model.") for name in weights)
    assert not any("embed_tokens" in name or "lm_head" in name for name in weights), "vLLM shares the target's"
    assert "layers.0.input_layernorm.weight" not in weights  # vLLM's first layer has none
    assert "layers.1.input_layernorm.weight" in weights
    assert weights["fc.weight"].shape == (32, 64)  # (d, 2d) over [embedding, feature]
    for name, tensor in weights.items():
        mine = own["fc.weight" if name == "fc.weight" else f"model.{name}"]
        assert tensor.dtype == mine.dtype and torch.equal(tensor, mine), name


def test_loading_the_export_back_gives_the_same_draft(tmp_path):
    target = make_model("llama", hidden_size=32, num_layers=2)
    draft = EagleDraft.for_target(target).eval()
    weights = load_file(str(draft.save_for_vllm(tmp_path / "export") / "model.safetensors"))
    copy = EagleDraft(draft.config)
    copy.load_state_dict({(name if name == "fc.weight" else f"model.{name}"): w for name, w in weights.items()})
    copy.attach_target(target).eval()
    ids = prompt(7)  # (1, 7)
    features = torch.randn(1, 7, 32)  # (1, 7, d)
    with torch.no_grad():
        assert torch.equal(copy.features(ids, features), draft.features(ids, features))


def test_the_config_is_the_targets_llama_config_with_the_drafts_layers(tmp_path):
    draft = llama_draft(num_layers=2, dtype=torch.bfloat16)
    directory = draft.save_for_vllm(tmp_path / "export")
    values = json.loads((directory / "config.json").read_text())
    assert values["architectures"] == ["EagleLlamaForCausalLM"] and values["model_type"] == "llama"
    assert values["dtype"] == "bfloat16"
    config, target = LlamaConfig.from_pretrained(directory), draft.config.target_config
    assert config.num_hidden_layers == 2
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        assert getattr(config, name) == target[name], name
    assert config.rms_norm_eps == target["rms_norm_eps"] and config.rope_parameters == target["rope_parameters"]
    record = json.loads((directory / "diversed_export.json").read_text())
    assert record["format"] == "vllm-eagle" and record["num_layers"] == 2 and record["scored_ids"] == "all"
    assert load_file(str(directory / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16


def test_a_pruned_draft_needs_full_vocab(tmp_path):
    draft = llama_draft(num_layers=1, draft_vocab_ids=torch.arange(2, 40))
    with pytest.raises(ValueError, match=r"scores 38 of the target's 64 ids .*`full_vocab=True`"):
        draft.save_for_vllm(tmp_path / "export")
    assert not (tmp_path / "export").exists(), "nothing is written before the checks pass"
    directory = draft.save_for_vllm(tmp_path / "export", full_vocab=True)
    assert "draft_vocab_ids" not in load_file(str(directory / "model.safetensors"))
    assert json.loads((directory / "config.json").read_text())["vocab_size"] == 64  # the whole head
    assert json.loads((directory / "diversed_export.json").read_text())["draft_vocab_size"] == 38


def test_a_non_llama_target_is_refused_naming_its_model_type(tmp_path):
    target = make_model("qwen3", hidden_size=32, num_layers=2)
    draft = EagleDraft.for_target(target)
    with pytest.raises(ValueError, match=r"model_type 'qwen3'"):
        draft.save_for_vllm(tmp_path / "export")


@pytest.mark.parametrize("flag", ["fc_bias", "input_norm", "final_norm"])
def test_a_layout_vllm_does_not_build_is_refused(tmp_path, flag):
    target = make_model("llama", hidden_size=32, num_layers=2)
    draft = EagleDraft(EagleDraftConfig(target_config=target.config.to_dict(), **{flag: True}))
    with pytest.raises(ValueError, match=rf"{flag}=True"):
        draft.save_for_vllm(tmp_path / "export")


def test_the_directory_may_be_empty_or_an_earlier_export_and_nothing_else(tmp_path):
    (tmp_path / "empty").mkdir()
    first = llama_draft(num_layers=1)
    first.save_for_vllm(tmp_path / "empty")
    second = llama_draft(num_layers=2)
    second.save_for_vllm(tmp_path / "empty")  # an earlier export: replaced
    assert json.loads((tmp_path / "empty" / "config.json").read_text())["num_hidden_layers"] == 2
    assert sorted(path.name for path in (tmp_path / "empty").iterdir()) == [
        "config.json",
        "diversed_export.json",
        "model.safetensors",
    ]
    saved = tmp_path / "saved"
    first.save_pretrained(saved)  # the project's own layout: not an export
    with pytest.raises(ValueError, match=r"`save_directory` '.*saved' holds files an export does not write"):
        first.save_for_vllm(saved)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"`save_directory` '.*file' is a file"):
        first.save_for_vllm(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds no earlier export"):
        first.save_for_vllm(tmp_path / "other")
