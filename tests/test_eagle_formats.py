"""Drafts in the public EAGLE formats (diversed_hf.drafting.eagle_formats, diversed_hf.drafting.eagle3): tiny
checkpoints with random weights and the formats' exact key names and config fields load, keep the target's greedy
output (chains and trees, ragged batches), follow the declared law, run a head, save back into the same layouts, and
bad checkpoints are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import VOCAB_SIZE, empirical, left_padded_batch, make_model, prompt, tv_bound

from diversed_hf import DiversedHead, EagleDraft, enable_diversed
from diversed_hf.verifiers import ExactVerifier, StaticEnsembleVerifier, ops

HIDDEN, HEADS, KV_HEADS, MLP = 32, 4, 2, 64
LAYER_IDS = [1, 2, 3]
DRAFT_IDS = torch.tensor([3, 5, 6, 9, 10, 11, 14, 17, 20, 21, 30, 33, 40, 41, 50, 60, 61, 62, 63, 1])  # any order
TREE = dict(num_assistant_tokens=3, assistant_tree_top_k=2, assistant_tree_size=6)


@pytest.fixture(scope="module")
def target():
    return enable_diversed(make_model("llama", hidden_size=HIDDEN, num_layers=4, seed=3))


def _llama_fields(vocab: int = VOCAB_SIZE) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": MLP,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "torch_dtype": "float32",
    }


def _attention(prefix: str, generator, width: int) -> dict:
    head_dim = HIDDEN // HEADS
    shapes = {
        "self_attn.q_proj.weight": (HEADS * head_dim, width),
        "self_attn.k_proj.weight": (KV_HEADS * head_dim, width),
        "self_attn.v_proj.weight": (KV_HEADS * head_dim, width),
        "self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
        "mlp.gate_proj.weight": (MLP, HIDDEN),
        "mlp.up_proj.weight": (MLP, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, MLP),
        "post_attention_layernorm.weight": (HIDDEN,),
    }
    return {
        prefix + name: (1.0 + 0.1 * torch.randn(shape, generator=generator))
        if len(shape) == 1
        else 0.2 * torch.randn(shape, generator=generator)
        for name, shape in shapes.items()
    }


def write_eagle3(directory, *, draft_ids=DRAFT_IDS, layer_ids=LAYER_IDS, fc_width=None, drop=(), config_extra=None):
    """An EAGLE-3 checkpoint as the EAGLE authors and SpecForge write it, with random weights."""
    generator = torch.Generator().manual_seed(0)
    draft_vocab = VOCAB_SIZE if draft_ids is None else len(draft_ids)
    weights = {
        "fc.weight": 0.3 * torch.randn(HIDDEN, fc_width or len(layer_ids or LAYER_IDS) * HIDDEN, generator=generator),
        "midlayer.input_layernorm.weight": 1.0 + 0.1 * torch.randn(HIDDEN, generator=generator),
        "midlayer.hidden_norm.weight": 1.0 + 0.1 * torch.randn(HIDDEN, generator=generator),
        **_attention("midlayer.", generator, 2 * HIDDEN),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": 2.0 * torch.randn(draft_vocab, HIDDEN, generator=generator),
    }
    if draft_ids is not None:
        weights["d2t"] = draft_ids - torch.arange(len(draft_ids))
        weights["t2d"] = torch.zeros(VOCAB_SIZE, dtype=torch.bool).index_fill_(
            0, draft_ids.clamp(max=VOCAB_SIZE - 1), 1
        )
    for name in drop:
        weights.pop(name)
    config = {
        **_llama_fields(),
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": draft_vocab,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)} if layer_ids else {},
        **(config_extra or {}),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))
    return directory


def write_eagle1(directory, *, with_bias=True):
    """An EAGLE-1 checkpoint as the EAGLE authors write it (``pytorch_model.bin``), with random weights."""
    generator = torch.Generator().manual_seed(1)
    weights = {
        "fc.weight": 0.3 * torch.randn(HIDDEN, 2 * HIDDEN, generator=generator),
        **_attention("layers.0.", generator, HIDDEN),
    }
    if with_bias:
        weights["fc.bias"] = 0.1 * torch.randn(HIDDEN, generator=generator)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps({**_llama_fields(), "architectures": ["LlamaForCausalLM"], "bias": with_bias})
    )
    torch.save(weights, directory / "pytorch_model.bin")
    return directory


def _greedy(target, input_ids, mask, **options):
    return target.generate(
        input_ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0, **options
    )


@pytest.mark.parametrize("fmt", ["eagle3", "eagle"])
@pytest.mark.parametrize("shape", [dict(num_assistant_tokens=3), TREE], ids=["chain", "tree"])
def test_public_checkpoints_load_and_keep_the_targets_greedy_output(target, tmp_path, fmt, shape):
    path = write_eagle3(tmp_path / "d") if fmt == "eagle3" else write_eagle1(tmp_path / "d")
    draft = EagleDraft.from_pretrained(path, target=target)
    assert draft.config.architecture == fmt
    _, input_ids, mask = left_padded_batch([5, 8, 3], seed=2)
    expected = _greedy(target, input_ids, mask)
    out = _greedy(target, input_ids, mask, assistant_model=draft, verifier=ExactVerifier(), **shape)
    assert torch.equal(out, expected)


def test_an_eagle3_draft_scores_only_its_ids_through_d2t(target, tmp_path):
    draft = EagleDraft.from_pretrained(write_eagle3(tmp_path / "d"), target=target)
    assert torch.equal(draft.draft_vocab_ids, DRAFT_IDS)  # the lm_head's row order, kept
    seq = prompt(6, seed=4)
    with torch.no_grad():
        features = draft.target_features(target(seq, output_hidden_states=True).hidden_states)
        assert features.shape[-1] == len(LAYER_IDS) * HIDDEN
        logits = draft(seq, target_hidden=features).logits[0, -1]
        rows = draft.lm_head(draft.norm(draft.features(seq, features)))[0, -1]
    assert torch.isinf(logits).sum() == VOCAB_SIZE - len(DRAFT_IDS)
    assert torch.allclose(logits[DRAFT_IDS], rows)  # row i scores target id i + d2t[i]


@torch.no_grad()
def _first_draft_distribution(target, draft, seq):  # q_1 with the target's fused features, no cache
    stacked = draft.target_features(target(seq, output_hidden_states=True).hidden_states)
    features = torch.cat([torch.zeros_like(stacked[:, :1]), stacked[:, :-1]], dim=1)
    return draft.full_logits(draft.features(seq, features)[0, -1]).softmax(-1).double()


@pytest.mark.parametrize("weight", [1.0, 0.3])
def test_the_first_token_with_an_eagle3_draft_follows_the_declared_mixture(target, tmp_path, weight):
    draft = EagleDraft.from_pretrained(write_eagle3(tmp_path / "d", draft_ids=None), target=target)
    verifier = ExactVerifier() if weight == 1.0 else StaticEnsembleVerifier(weight)
    input_ids = prompt(5, seed=11)
    num_rows = 5000
    out = target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=verifier,
        do_sample=True,
        max_new_tokens=2,
        num_assistant_tokens=2,
        generator=torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        p1 = target(input_ids).logits[0, -1].softmax(-1).double()
    q1 = _first_draft_distribution(target, draft, input_ids)
    assert float(ops.total_variation(p1, q1)) > 0.5  # a mixture that tells the draft's law from the target's
    declared = weight * p1 + (1 - weight) * q1
    observed = empirical(out[:, input_ids.shape[1]], VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


def test_a_head_reads_an_eagle3_drafts_hidden_state(target, tmp_path):
    draft = EagleDraft.from_pretrained(write_eagle3(tmp_path / "d"), target=target)
    head = DiversedHead.for_pair(target, draft)
    _, input_ids, mask = left_padded_batch([4, 7], seed=5)
    out = target.generate(
        input_ids,
        attention_mask=mask,
        assistant_model=draft,
        diversed_head=head,
        do_sample=True,
        max_new_tokens=8,
        pad_token_id=0,
        return_dict_in_generate=True,
        **TREE,
    )
    assert out.sequences.shape == (2, 7 + 8)
    assert out.speculation.total_rounds > 0


def test_eagle3_saves_back_into_its_own_layout(target, tmp_path):
    source = write_eagle3(tmp_path / "source")
    draft = EagleDraft.from_pretrained(source, target=target)
    exported = draft.save_pretrained(tmp_path / "out", format="eagle3")
    assert set(load_file(str(exported / "model.safetensors"))) == set(load_file(str(source / "model.safetensors")))
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        assert torch.equal(load_file(str(exported / "model.safetensors"))[name], tensor), name
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == len(DRAFT_IDS)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == LAYER_IDS
    again = EagleDraft.from_pretrained(exported, target=target)
    seq = prompt(6, seed=4)
    with torch.no_grad():
        features = draft.target_features(target(seq, output_hidden_states=True).hidden_states)
        assert torch.equal(again(seq, target_hidden=features).logits, draft(seq, target_hidden=features).logits)
    draft.save_pretrained(tmp_path / "out", format="eagle3")  # an earlier export of the format may be replaced


def test_an_eagle3_draft_built_here_round_trips_through_both_layouts(target, tmp_path):
    draft = EagleDraft.for_target(target, architecture="eagle3", draft_vocab_ids=DRAFT_IDS).eval()
    assert draft.config.aux_layer_ids == [2, 2, 1]  # (2, L // 2, L - 3) of the target's 4 layers
    seq = prompt(6, seed=4)
    draft.save_pretrained(tmp_path / "ours")
    draft.save_pretrained(tmp_path / "eagle3", format="eagle3")
    with torch.no_grad():
        features = draft.target_features(target(seq, output_hidden_states=True).hidden_states)
        expected = draft(seq, target_hidden=features).logits
        for path in ("ours", "eagle3"):
            loaded = EagleDraft.from_pretrained(tmp_path / path, target=target)
            assert loaded.config.architecture == "eagle3"
            assert torch.allclose(loaded(seq, target_hidden=features).logits, expected, atol=1e-6), path


def test_a_deeper_eagle3_draft_runs_saves_and_keeps_the_targets_greedy_output(target, tmp_path):
    """``num_layers=2``: the Eagle3Layer, then a plain Llama layer over its output; this project's format keeps both,
    the public EAGLE-3 layout (one ``midlayer``) refuses it by name."""
    from diversed_hf.drafting.eagle3 import Eagle3Layer

    draft = EagleDraft.for_target(target, architecture="eagle3", num_layers=2, draft_vocab_ids=DRAFT_IDS).eval()
    layers = draft.model.layers
    assert len(layers) == 2 and isinstance(layers[0], Eagle3Layer) and not isinstance(layers[1], Eagle3Layer)
    seq = prompt(6, seed=4)
    with torch.no_grad():
        features = draft.target_features(target(seq, output_hidden_states=True).hidden_states)
        expected = draft(seq, target_hidden=features).logits
        draft.save_pretrained(tmp_path / "ours")
        loaded = EagleDraft.from_pretrained(tmp_path / "ours", target=target)
        assert loaded.config.num_layers == 2
        assert torch.allclose(loaded(seq, target_hidden=features).logits, expected, atol=1e-6)
    _, ids, mask = left_padded_batch([5, 7, 4])
    out = target.generate(
        ids, attention_mask=mask, assistant_model=loaded, verifier=ExactVerifier(), do_sample=False, max_new_tokens=12
    )
    assert torch.equal(out, target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12))
    with pytest.raises(ValueError, match=r"`format='eagle3'` writes EAGLE-3's one `midlayer`; this draft has 2 layers"):
        draft.save_pretrained(tmp_path / "public", format="eagle3")


def test_an_eagle1_draft_exports_for_vllm_and_loads_back(target, tmp_path):
    draft = EagleDraft.from_pretrained(write_eagle1(tmp_path / "d", with_bias=False), target=target)
    exported = draft.save_pretrained(tmp_path / "out", format="eagle")
    again = EagleDraft.from_pretrained(exported, target=target)
    seq = prompt(6, seed=4)
    with torch.no_grad():
        features = target(seq, output_hidden_states=True).hidden_states[-1]
        assert torch.equal(again(seq, target_hidden=features).logits, draft(seq, target_hidden=features).logits)


@pytest.mark.parametrize(
    "writer, match",
    [
        (lambda d: write_eagle3(d, drop=("d2t",)), r"no `d2t`"),
        (lambda d: write_eagle3(d, fc_width=2 * HIDDEN), r"`fc.weight` is \[32, 64\].*another width"),
        (
            lambda d: write_eagle3(d, draft_ids=None, config_extra={"draft_vocab_size": VOCAB_SIZE + 8}),
            r"`draft_vocab_size` \(72\) is larger than its target's vocabulary",
        ),
        (lambda d: write_eagle3(d, drop=("lm_head.weight",)), r"no `lm_head.weight`"),
        (lambda d: write_eagle3(d, config_extra={"num_hidden_layers": 2}), r"num_hidden_layers=2"),
        (lambda d: write_eagle3(d, config_extra={"norm_before_fc": True}), r"variant.*norm_before_fc"),
        (lambda d: write_eagle3(d, config_extra={"model_type": "mistral", "architectures": ["X"]}), r"neither"),
    ],
    ids=["no-d2t", "fc-width", "draft-vocab", "no-lm-head", "two-layers", "variant", "foreign"],
)
def test_bad_checkpoints_are_refused_by_name(target, tmp_path, writer, match):
    path = writer(tmp_path / "d")
    with pytest.raises(ValueError, match=match):
        EagleDraft.from_pretrained(path, target=target)


def test_bad_uses_are_refused_by_name(target, tmp_path):
    no_ids = write_eagle3(tmp_path / "no_ids", layer_ids=[])
    with pytest.raises(ValueError, match="pass `target=`"):
        EagleDraft.from_pretrained(no_ids)
    assert EagleDraft.from_pretrained(no_ids, target=target).config.aux_layer_ids == [2, 2, 1]
    deep = write_eagle3(tmp_path / "deep", layer_ids=[2, 8, 13])
    with pytest.raises(ValueError, match=r"fuses the target's layers \[2, 8, 13\] and `target` has 4"):
        EagleDraft.from_pretrained(deep, target=target)
    eagle1 = EagleDraft.from_pretrained(write_eagle1(tmp_path / "e1"), target=target)
    with pytest.raises(ValueError, match="format='eagle'"):
        eagle1.save_pretrained(tmp_path / "x", format="eagle3")
    with pytest.raises(ValueError, match="`format` is 'gguf'"):
        eagle1.save_pretrained(tmp_path / "x", format="gguf")
    eagle3 = EagleDraft.from_pretrained(write_eagle3(tmp_path / "e3"), target=target)
    with pytest.raises(ValueError, match="format='eagle3'"):
        eagle3.save_pretrained(tmp_path / "x", format="eagle")
    with pytest.raises(ValueError, match="holds files an export does not write"):
        (tmp_path / "busy").mkdir()
        (tmp_path / "busy" / "notes.txt").write_text("mine")
        eagle3.save_pretrained(tmp_path / "busy", format="eagle3")


@pytest.mark.parametrize("layer_ids", [[-1, 2, 3], [4, 4, 4], [1, 2, 4]], ids=["negative", "after-final-norm", "last"])
def test_eagle3_layer_ids_outside_the_targets_layers_are_refused(target, tmp_path, layer_ids):
    """The target has 4 layers: ids 0..3 are their inputs; 4 is the state after the final norm, -1 no layer."""
    path = write_eagle3(tmp_path / "d", layer_ids=layer_ids)
    with pytest.raises(ValueError, match=rf"fuses the target's layers \[{', '.join(map(str, layer_ids))}\].*0 \.\. 3"):
        EagleDraft.from_pretrained(path, target=target)


def test_a_library_built_eagle3_draft_takes_its_targets_special_ids(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=4,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, bos_token_id=7, eos_token_id=9, pad_token_id=8,
    )  # fmt: skip
    torch.manual_seed(0)
    other = enable_diversed(LlamaForCausalLM(config).eval())
    draft = EagleDraft.for_target(other, architecture="eagle3")
    assert (draft.config.eos_token_id, draft.config.bos_token_id) == (9, 7)
    output = other.generate(
        prompt(5), assistant_model=draft, do_sample=False, max_new_tokens=6, verifier=ExactVerifier()
    )
    assert torch.equal(output, other.generate(prompt(5), do_sample=False, max_new_tokens=6))
    exported = json.loads((draft.save_pretrained(tmp_path / "e3", format="eagle3") / "config.json").read_text())
    assert (exported["eos_token_id"], exported["bos_token_id"]) == (9, 7)


def test_save_pretrained_in_the_eagle_format_takes_full_vocab(target, tmp_path):
    draft = EagleDraft.for_target(target, draft_vocab_size=20)
    with pytest.raises(ValueError, match=r'save_pretrained\(path, format="eagle", full_vocab=True\)'):
        draft.save_pretrained(tmp_path / "a", format="eagle")
    directory = draft.save_pretrained(tmp_path / "b", format="eagle", full_vocab=True)
    assert load_file(str(directory / "model.safetensors"))["fc.weight"].shape == (HIDDEN, 2 * HIDDEN)
    with pytest.raises(TypeError, match="`format='eagle3'` takes only `save_directory`"):
        draft.save_pretrained(tmp_path / "c", format="eagle3", full_vocab=True)


def _damage(directory, how):
    if how == "truncated":
        data = (directory / "model.safetensors").read_bytes()
        (directory / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif how == "config":
        (directory / "config.json").write_text('{"model_type": "llama", ')
    elif how == "float-d2t" or how == "int-fc" or how == "permuted-d2t":
        weights = load_file(str(directory / "model.safetensors"))
        if how == "float-d2t":
            weights["d2t"] = weights["d2t"].float() + 0.5
        elif how == "int-fc":
            weights["fc.weight"] = weights["fc.weight"].mul(10).long()
        else:
            weights["d2t"] = torch.ones(VOCAB_SIZE, dtype=torch.long)
        save_file(weights, str(directory / "model.safetensors"))
    elif how == "shape":
        weights = load_file(str(directory / "model.safetensors"))
        weights["midlayer.mlp.up_proj.weight"] = torch.zeros(MLP + 1, HIDDEN)
        save_file(weights, str(directory / "model.safetensors"))


@pytest.mark.parametrize(
    "how, match",
    [
        ("truncated", r"model\.safetensors' could not be read .*truncated"),
        ("config", r"config\.json' is not valid JSON"),
        ("float-d2t", r"`d2t` is torch\.float32, and it holds integer offsets"),
        ("int-fc", r"`fc\.weight` is torch\.int64, and it holds floating-point values"),
        ("shape", r"`model\.layers\.0\.mlp\.up_proj\.weight` is \[65, 32\], the config needs \[64, 32\]"),
        ("permuted-d2t", r"scores every id .* `d2t` is not all zeros"),
    ],
)
def test_damaged_eagle_checkpoints_name_the_file_or_the_key(target, tmp_path, how, match):
    draft_ids = None if how == "permuted-d2t" else DRAFT_IDS
    path = write_eagle3(tmp_path / "d", draft_ids=draft_ids)
    if how == "permuted-d2t":
        weights = load_file(str(path / "model.safetensors"))
        save_file({**weights, "d2t": torch.zeros(VOCAB_SIZE, dtype=torch.long)}, str(path / "model.safetensors"))
    _damage(path, how)
    with pytest.raises(ValueError, match=match):
        EagleDraft.from_pretrained(path, target=target)


def test_a_missing_directory_is_named(target, tmp_path):
    with pytest.raises(ValueError, match=r"is neither a local directory nor a Hub repo id"):
        EagleDraft.from_pretrained(str(tmp_path / "nowhere" / "draft"), target=target)


def test_the_default_layout_is_not_saved_over_an_eagle_export(target, tmp_path):
    draft = EagleDraft.from_pretrained(write_eagle3(tmp_path / "e3"), target=target)
    export = draft.save_pretrained(tmp_path / "export", format="eagle3")
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    with pytest.raises(ValueError, match="holds an EAGLE export"):
        draft.save_pretrained(export)
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before
