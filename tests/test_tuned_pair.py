"""The task-tuned real pair: SmolLM2-135M-Instruct with the shipped LoRA adapter merged (``load_pair("smollm2-tuned")``).

Skipped, with the reason, without the ``smollm2`` extra or the model on this machine (as tests/test_real_pair.py).
Until the tuned target's own EagleDraft ships, greedy parity is checked with the pair's everyday EagleDraft (any draft
keeps greedy parity), and ``load_pair("smollm2-tuned")`` must name the missing draft and the command that makes it.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from diversed_hf import enable_diversed
from diversed_hf.verifiers import ExactVerifier

if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("peft") is None:
    pytest.skip('the real pair needs the smollm2 extra: pip install -e ".[smollm2]"', allow_module_level=True)

from diversed_hf import testbed
from diversed_hf.lab.tasks import load_task_dataset
from diversed_hf.testbed import smollm2, smollm2_tuned

pytestmark = pytest.mark.real_pair  # opt-in: DIVERSED_REAL_PAIR=1 (tests/conftest.py)


@pytest.fixture(scope="module")
def tuned():
    try:
        smollm2.ensure_target()
    except (FileNotFoundError, ImportError) as error:
        pytest.skip(f"SmolLM2-135M-Instruct is not available here: {error}")
    target, tokenizer = smollm2_tuned.load_tuned_target(torch_dtype=torch.float32)
    return enable_diversed(target), tokenizer


def test_the_adapter_is_merged_into_the_target(tuned):
    from safetensors import safe_open

    target, _ = tuned
    assert target.config._name_or_path == smollm2_tuned.TUNED_MODEL_ID
    assert not any(name.startswith("base_model") or "lora" in name for name, _ in target.named_parameters())
    name = "model.layers.0.self_attn.q_proj.weight"  # a layer the adapter tunes, against the base model's file
    with safe_open(str(smollm2.target_dir() / "model.safetensors"), "pt") as weights:
        base = weights.get_tensor(name).float()
    assert not torch.allclose(target.get_parameter(name), base, atol=1e-4)


def test_greedy_exact_verification_is_the_tuned_targets_greedy_output(tuned):
    target, tokenizer = tuned
    draft = smollm2.load_eagle_draft(target, *smollm2.EAGLE_DRAFTS["eagle"])  # the tuned draft: once it ships
    prompts = list(load_task_dataset("arith_steps", split="test", num_examples=1)["prompt"])
    for prompt in prompts:
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        expected = target.generate(**inputs, do_sample=False, max_new_tokens=16)
        out = target.generate(
            **inputs, assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=16
        )
        assert torch.equal(out, expected)


def test_load_pair_names_a_missing_draft_and_the_command_that_makes_it():
    if smollm2_tuned.TUNED_EAGLE_DIR.is_dir():
        pytest.skip("the tuned target's EagleDraft ships: load_pair loads it")
    with pytest.raises(FileNotFoundError, match="train_eagle_draft.py --target smollm2-tuned"):
        testbed.load_pair("smollm2-tuned")
