"""Distilling an EagleDraft (docs/eagle.md, "Training") on the testbed pair: data from the target's own decoding,
the loss, resumable checkpoints, the saved draft."""

from __future__ import annotations

import json

import pytest
import torch

from diversed_hf import EagleDraft, enable_diversed, testbed
from diversed_hf.training import eagle_distill
from diversed_hf.training.eagle_data import CollectionSettings, collect, load_sequences
from diversed_hf.training.eagle_distill import DistillSettings, distill
from diversed_hf.verifiers import ExactVerifier


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    target, _, tokenizer = testbed.load_pair()
    prompts = [(p, 20) for p in testbed.load_task("arith", split="train", num_examples=24)["prompt"]]
    directory = tmp_path_factory.mktemp("eagle") / "data"
    collect(target, tokenizer, prompts, directory, CollectionSettings(batch_size=8, shard_size=12), progress=False)
    return target, tokenizer, prompts, directory


def test_a_collection_is_streamed_from_disk(collected):
    """Loaded sequences hold their ids; their features are read from the shard when asked for (a distillation over
    millions of positions holds a batch's), the same rows every time."""
    from safetensors.torch import load_file

    directory = collected[3]
    sequences = load_sequences(directory)
    assert all(not hasattr(s, "__dict__") for s in sequences)  # no room for a feature tensor beside ids
    first_shard = load_file(str(directory / "shard-00000.safetensors"))
    hidden = torch.cat([s.hidden for s in sequences[:12]])
    assert torch.equal(hidden, first_shard["hidden"]) and sequences[0].hidden is not sequences[0].hidden
    assert torch.equal(torch.cat([s.top_ids for s in sequences[:12]]), first_shard["top_ids"])
    assert [s.ids.shape[0] - 1 for s in sequences[:12]] == [s.hidden.shape[0] for s in sequences[:12]]


def test_collection_keeps_the_targets_features_and_soft_labels(collected):
    target, tokenizer, prompts, directory = collected
    sequences = load_sequences(directory)
    assert len(sequences) == len(prompts) and len(list(directory.glob("shard-*.safetensors"))) == 2
    greedy = sequences[0]  # every 4th prompt is answered greedily, the first among them
    with torch.no_grad():
        out = target(greedy.ids[None], output_hidden_states=True)
    n = greedy.ids.shape[0]
    assert greedy.hidden.shape == (n - 1, target.config.hidden_size)
    torch.testing.assert_close(greedy.hidden.float(), out.hidden_states[-1][0, : n - 1], atol=2e-2, rtol=1e-2)
    top_logprobs, top_ids = out.logits[0, : n - 1].log_softmax(-1).topk(greedy.top_ids.shape[1])
    trained = greedy.prompt_length - 1  # the positions predicting response tokens carry the target's soft labels
    assert (greedy.top_ids[trained:, 0] == top_ids[trained:, 0]).float().mean() > 0.99
    torch.testing.assert_close(
        greedy.top_logprobs[trained:, 0].float(), top_logprobs[trained:, 0], atol=2e-2, rtol=1e-2
    )
    # the prompt's own predictions are never trained: not computed, placeholders
    assert not greedy.top_ids[:trained].any() and bool((greedy.top_logprobs[:trained] == float("-inf")).all())
    # greedy answer: each response token is the target's argmax at the position before
    response = greedy.ids[greedy.prompt_length :]
    assert torch.equal(response, greedy.top_ids[greedy.prompt_length - 1 :, 0].long())
    # a rerun with the same settings keeps the shards; other settings are refused
    collect(target, tokenizer, prompts, directory, CollectionSettings(batch_size=8, shard_size=12), progress=False)
    with pytest.raises(ValueError, match="other settings"):
        collect(target, tokenizer, prompts, directory, CollectionSettings(top_k=8), progress=False)


SETTINGS = DistillSettings(draft_vocab_size=600, epochs=3, batch_size=4, learning_rate=2e-3, save_steps=5, held_out=0.2)


def test_distillation_raises_acceptance_and_resumes_exactly(collected, tmp_path, monkeypatch):
    target, tokenizer, _, directory = collected
    saved = distill(
        target, directory, tmp_path / "a" / "checkpoints", tmp_path / "a" / "draft", SETTINGS, progress=False
    )
    record = json.loads((saved / "training.json").read_text())
    before, after = record["held_out_before"]["acceptance_t1"], record["held_out_after"]["acceptance_t1"]
    assert after[0] > before[0] + 0.2 and after[-1] > before[-1] + 0.2  # learned, also on its own features
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md"} <= {
        p.name for p in saved.iterdir()
    }
    assert "Held-out acceptance" in (saved / "README.md").read_text()

    # interrupted after its first checkpoint, then rerun: the same draft as the uninterrupted run
    real_save = eagle_distill._save_checkpoint

    def save_then_stop(directory, step, *args, **kwargs):
        real_save(directory, step, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(eagle_distill, "_save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        distill(target, directory, tmp_path / "b" / "checkpoints", tmp_path / "b" / "draft", SETTINGS, progress=False)
    monkeypatch.setattr(eagle_distill, "_save_checkpoint", real_save)
    resumed = distill(
        target, directory, tmp_path / "b" / "checkpoints", tmp_path / "b" / "draft", SETTINGS, progress=False
    )
    first, second = (EagleDraft.from_pretrained(p).state_dict() for p in (saved, resumed))
    assert all(torch.equal(first[k], second[k]) for k in first)
    with pytest.raises(ValueError, match="another run"):
        distill(
            target, directory, tmp_path / "b" / "checkpoints", tmp_path / "c", DistillSettings(epochs=1), progress=False
        )

    # the saved draft drafts for its target
    draft = EagleDraft.from_pretrained(saved, target=target).float()
    enable_diversed(target)
    inputs = tokenizer(testbed.load_task("arith", num_examples=1)["prompt"][0], return_tensors="pt")
    out = target.generate(
        **inputs,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=24,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, target.generate(**inputs, do_sample=False, max_new_tokens=24))
    assert out.speculation.total_acceptance_rate > 0.2


def test_an_eagle3_draft_distils_on_its_fused_layers_and_keeps_greedy_parity(collected, tmp_path):
    """``--arch eagle3``: the collection keeps the target's layers (2, 8, 13) stacked, the draft fuses them, learns
    (held-out acceptance up, also on its own features), saves and loads back as an EAGLE-3 draft, and a collection of
    last hidden states is refused for it by name."""
    target, tokenizer, prompts, last_layer = collected
    layers = (2, 8, 13)
    directory = tmp_path / "data"
    collect(
        target,
        tokenizer,
        prompts,
        directory,
        CollectionSettings(batch_size=8, shard_size=12, feature_layers=layers),
        progress=False,
    )
    sequences = load_sequences(directory)
    with torch.no_grad():
        states = target(sequences[0].ids[None], output_hidden_states=True).hidden_states
    stacked = torch.cat([states[i] for i in layers], dim=-1)[0, : sequences[0].ids.shape[0] - 1]
    torch.testing.assert_close(sequences[0].hidden.float(), stacked, atol=3e-2, rtol=1e-2)
    settings = DistillSettings(
        architecture="eagle3",
        aux_layer_ids=layers,
        draft_vocab_size=600,
        epochs=6,
        batch_size=4,
        learning_rate=3e-3,
        save_steps=50,
        held_out=0.2,
    )
    saved = distill(target, directory, tmp_path / "checkpoints", tmp_path / "draft", settings, progress=False)
    record = json.loads((saved / "training.json").read_text())
    before, after = record["held_out_before"]["acceptance_t1"], record["held_out_after"]["acceptance_t1"]
    assert after[0] > before[0] + 0.2 and after[-1] > before[-1] + 0.2
    draft = EagleDraft.from_pretrained(saved, target=target).float()
    assert draft.config.architecture == "eagle3" and draft.config.aux_layer_ids == list(layers)
    enable_diversed(target)
    inputs = tokenizer(testbed.load_task("arith", num_examples=1)["prompt"][0], return_tensors="pt")
    out = target.generate(**inputs, assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=24)
    assert torch.equal(out, target.generate(**inputs, do_sample=False, max_new_tokens=24))
    refused = (
        r"keeps the target's hidden states \[\d+\] per position; a draft of architecture 'eagle3' reads \[2, 8, 13\]"
    )
    with pytest.raises(ValueError, match=refused):
        distill(target, last_layer, tmp_path / "c" / "checkpoints", tmp_path / "c" / "draft", settings, progress=False)
    with pytest.raises(ValueError, match="`aux_layer_ids` names the target layers"):
        DistillSettings(architecture="eagle3")


def test_a_read_only_text_keeps_every_position_and_decodes_nothing(tmp_path):
    """A job with 0 new tokens (existing text, prefill): its ids are the text's, every position is trained, and its
    features are the target's on that text; in a batch beside rows that decode."""
    from diversed_hf.lab.tasks.eagle_prompts import eagle_prompt_mix

    target, _, tokenizer = testbed.load_pair()
    prompts = [(p, 0 if i % 2 else 8) for i, p in enumerate(testbed.load_task("arith", num_examples=4)["prompt"])]
    collect(target, tokenizer, prompts, tmp_path / "data", CollectionSettings(batch_size=4), progress=False)
    sequences = load_sequences(tmp_path / "data")
    for (text, limit), sequence in zip(prompts, sequences):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if limit:
            assert sequence.prompt_length == len(ids) and sequence.ids.shape[0] > len(ids)
            continue
        assert sequence.prompt_length == 1 and sequence.ids.tolist() == ids
        with torch.no_grad():
            states = target(sequence.ids[None], output_hidden_states=True).hidden_states[-1][0, :-1]
        torch.testing.assert_close(sequence.hidden.float(), states, atol=2e-2, rtol=1e-2)
    mix = eagle_prompt_mix(0, 0, 3, num_prefill=5)
    assert [limit for _, limit in mix["prefill"]] == [0] * 5
    assert not any(text in prompt for text, _ in mix["prefill"] for prompt, _ in mix["docstrings"])  # kept apart
