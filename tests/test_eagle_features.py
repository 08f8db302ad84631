"""Features for a collection already made (diversed_hf.training.eagle_features): the target reads the stored
sequences again and keeps other layers, so both draft architectures distil on the same answers (tiny models, a
word-level tokenizer, a few short answers)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("trl")

import train_eagle_draft  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from test_training import tiny_tokenizer  # noqa: E402
from tiny_models import make_model  # noqa: E402

from diversed_hf import EagleDraft  # noqa: E402
from diversed_hf.training.eagle_data import CollectionSettings, collect, load_sequences  # noqa: E402
from diversed_hf.training.eagle_distill import DistillSettings, distill  # noqa: E402
from diversed_hf.training.eagle_features import featurize, stored_layers  # noqa: E402

PROMPTS = [("t5 t6 t7", 5), ("t8 t9", 3), ("t10 t11 t12 t13", 6), ("t14 t15", 4), ("t16", 5), ("t17 t18", 2)]
LAYERS = (1, 2, 3)  # of a 4-layer target: an EAGLE-3 draft's three


@pytest.fixture(scope="module")
def target():
    return make_model("llama", num_layers=4)


def _collect(target, directory, feature_layers=None):
    settings = CollectionSettings(batch_size=3, shard_size=2, top_k=4, feature_layers=feature_layers)
    return collect(target, tiny_tokenizer(), PROMPTS, directory, settings, progress=False)


def test_the_features_read_again_are_the_ones_decoding_kept(target, tmp_path):
    """Featurizing a collection with the layers it already keeps gives back its features (one batched pass against
    the decoding's cached steps); ids and soft labels are copied; the manifest says where they came from; the layers
    of a collection made for an EAGLE-3 draft are the ones featurizing gives."""
    source = _collect(target, tmp_path / "last")
    assert stored_layers(source, 4) == (4,)
    made = featurize(target, source, tmp_path / "again", (4,), batch_size=4, progress=False)
    shards = sorted(p.name for p in source.glob("shard-*.safetensors"))
    assert len(shards) == 3 and shards == sorted(p.name for p in made.glob("shard-*.safetensors"))
    for name in shards:
        before, after = load_file(str(source / name)), load_file(str(made / name))
        for key in ("ids", "offsets", "prompt_lengths", "top_ids", "top_logprobs"):
            assert torch.equal(before[key], after[key]), key
        torch.testing.assert_close(after["hidden"].float(), before["hidden"].float(), atol=2e-3, rtol=2e-3)
    manifest = json.loads((made / "manifest.json").read_text())
    assert manifest["settings"]["feature_layers"] == [4] and manifest["featurized_from"]["feature_layers"] == [4]
    assert manifest["prompts_sha256"] == json.loads((source / "manifest.json").read_text())["prompts_sha256"]

    fused = featurize(target, source, tmp_path / "fused", LAYERS, batch_size=2, progress=False)
    direct = _collect(target, tmp_path / "direct", LAYERS)
    assert stored_layers(fused, 4) == stored_layers(direct, 4) == LAYERS
    for a, b in zip(load_sequences(fused), load_sequences(direct), strict=True):
        assert a.hidden.shape == (a.ids.shape[0] - 1, 3 * 32) and torch.equal(a.ids, b.ids)  # same seeds
        torch.testing.assert_close(a.hidden.float(), b.hidden.float(), atol=2e-3, rtol=2e-3)


def test_featurizing_resumes_shard_by_shard_and_refuses_by_name(target, tmp_path):
    source = _collect(target, tmp_path / "data")
    made = featurize(target, source, tmp_path / "f", LAYERS, shards=["shard-00001.safetensors"], progress=False)
    assert [p.name for p in made.glob("shard-*.safetensors")] == ["shard-00001.safetensors"]
    kept = (made / "shard-00001.safetensors").stat().st_mtime_ns
    featurize(target, source, made, LAYERS, progress=False)  # the rest; the one written stays
    assert len(list(made.glob("shard-*.safetensors"))) == 3
    assert (made / "shard-00001.safetensors").stat().st_mtime_ns == kept and not list(made.glob("*.tmp"))
    with pytest.raises(ValueError, match="holds another collection's or other layers' features"):
        featurize(target, source, made, (0, 1, 2), progress=False)
    with pytest.raises(ValueError, match=r"`feature_layers` \(1, 5\) must be hidden-state indices in \[0, 4\]"):
        featurize(target, source, tmp_path / "g", (1, 5), progress=False)
    with pytest.raises(FileNotFoundError, match="`shards` names files that are not in .*: shard-00009"):
        featurize(target, source, tmp_path / "g", LAYERS, shards=["shard-00009.safetensors"], progress=False)
    with pytest.raises(FileNotFoundError, match="is not a collection"):
        featurize(target, tmp_path, tmp_path / "g", LAYERS, progress=False)


def test_an_eagle3_draft_distils_on_a_featurized_collection_and_is_refused_the_raw_one(target, tmp_path):
    source = _collect(target, tmp_path / "data")
    settings = DistillSettings(
        architecture="eagle3", aux_layer_ids=LAYERS, draft_vocab_size=None, epochs=1, batch_size=2, held_out=0.2
    )
    with pytest.raises(ValueError, match=r"keeps the target's hidden states \[4\] per position; a draft of "):
        distill(target, source, tmp_path / "a" / "checkpoints", tmp_path / "a" / "draft", settings, progress=False)
    fused = featurize(target, source, tmp_path / "fused", LAYERS, progress=False)
    saved = distill(target, fused, tmp_path / "b" / "checkpoints", tmp_path / "b" / "draft", settings, progress=False)
    draft = EagleDraft.from_pretrained(saved, target=target)
    assert draft.config.architecture == "eagle3" and draft.config.aux_layer_ids == list(LAYERS)
    run = json.loads((tmp_path / "b" / "checkpoints" / "run.json").read_text())
    assert run["data_manifest"]["featurized_from"]["directory"] == str(source.resolve())


def test_train_eagle_draft_featurizes_an_extra_collection_of_the_other_arch(target, tmp_path, monkeypatch):
    """``--arch eagle3 --extra_data`` a collection of last hidden states: the target reads it again into
    ``<output_dir>/features-1`` and the draft distils on both; a rerun reuses what is written."""
    from diversed_hf.testbed import smollm2

    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: (target, tiny_tokenizer()))
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"t{i} t{i + 1}"}) for i in range(20, 25)))
    common = ["--prompts", str(prompts), "--num_chat", "0", "--num_arith", "0", "--code_samples", "0"]
    common += ["--num_docstrings", "0", "--chat_max_new_tokens", "3", "--top_k", "4", "--generation_batch_size", "4"]
    train_eagle_draft.main(["--output_dir", str(tmp_path / "a"), "--data_only", *common])
    assert stored_layers(tmp_path / "a" / "data", 4) == (4,)
    save_to = tmp_path / "draft"
    argv = ["--output_dir", str(tmp_path / "b"), "--save_to", str(save_to), "--arch", "eagle3", "--aux_layer_ids"]
    argv += [*map(str, LAYERS), "--extra_data", str(tmp_path / "a" / "data"), "--epochs", "1", "--batch_size", "2"]
    argv += ["--draft_vocab_size", "0", "--held_out", "0.2", *common]
    assert train_eagle_draft.main(argv) == save_to
    assert stored_layers(tmp_path / "b" / "features-1", 4) == LAYERS
    record = json.loads((save_to / "training.json").read_text())
    assert record["num_sequences"]["train"] + record["num_sequences"]["held_out"] == 10
    assert EagleDraft.from_pretrained(save_to, target=target).config.aux_layer_ids == list(LAYERS)
