"""Heads that read distribution features of p_t and q_t (docs/method.md §4): the features by hand, the rule that
w_t never reads the drafted token, config format 2 (and format-1 heads loading unchanged), pair-agnostic heads in
generate, and the same features in training rollouts as in generation."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import VOCAB_SIZE, empirical, make_model, make_pair, prompt, tv_bound
from torch import nn

from diversed_hf import DiversedHead, DiversedHeadConfig, HeadVerifier, StaticEnsembleVerifier, compat, enable_diversed
from diversed_hf.heads.hub import HEAD_FORMAT_VERSION
from diversed_hf.training.rollout import build_logits_warpers, sample_from_mixture
from diversed_hf.verifiers import ops
from diversed_hf.verifiers.distribution_features import FEATURE_NAMES, MARGIN_CAP, distribution_features

SOME_FEATURES = ["tv", "target_entropy", "draft_top1", "argmax_agree", "target_margin"]


def randomize(head, seed=0, scale=0.5):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    return head


def random_round(batch=2, num_draft=3, vocab=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    draft_probs = (2 * torch.randn(batch, num_draft, vocab, generator=generator)).softmax(-1)
    target_probs = (2 * torch.randn(batch, num_draft + 1, vocab, generator=generator)).softmax(-1)
    return draft_probs, target_probs


# The features ----------------------------------------------------------------------------------------


def test_features_by_hand():
    target = torch.tensor([0.7, 0.2, 0.1])
    draft = torch.tensor([0.2, 0.3, 0.5])
    values = dict(zip(FEATURE_NAMES, distribution_features(draft, target, FEATURE_NAMES).tolist()))
    entropy = lambda probs: -sum(x * math.log(x) for x in probs) / math.log(3)  # noqa: E731
    expected = {
        "tv": 0.5,
        "target_entropy": entropy([0.7, 0.2, 0.1]),
        "draft_entropy": entropy([0.2, 0.3, 0.5]),
        "target_top1": 0.7,
        "draft_top1": 0.5,
        "argmax_agree": 0.0,
        "target_margin": math.log(0.7 / 0.2) / MARGIN_CAP,
        "draft_margin": math.log(0.5 / 0.3) / MARGIN_CAP,
    }
    assert values == pytest.approx(expected, abs=1e-6)


def test_features_at_the_extremes_stay_in_the_unit_interval():
    point = torch.tensor([0.0, 1.0, 0.0, 0.0])  # what top-k = 1 leaves: log 0 in the margin, 0 log 0 in the entropy
    uniform = torch.full((4,), 0.25)
    values = dict(zip(FEATURE_NAMES, distribution_features(uniform, point, FEATURE_NAMES).tolist()))
    assert values["target_entropy"] == 0.0 and values["target_margin"] == 1.0 and values["target_top1"] == 1.0
    assert values["draft_entropy"] == pytest.approx(1.0) and values["draft_margin"] == 0.0
    assert values["tv"] == pytest.approx(0.75)
    draft_probs, target_probs = random_round(batch=3, num_draft=4, vocab=7)
    features = distribution_features(draft_probs, target_probs[:, :4], FEATURE_NAMES)
    assert features.shape == (3, 4, len(FEATURE_NAMES)) and features.min() >= 0 and features.max() <= 1


def test_features_follow_the_requested_order_and_none_is_zero_width():
    draft_probs, target_probs = random_round()
    everything = distribution_features(draft_probs, target_probs[:, :3], FEATURE_NAMES)
    picked = distribution_features(draft_probs, target_probs[:, :3], ["draft_margin", "tv"])
    assert torch.equal(picked, everything[..., [7, 0]])
    assert distribution_features(draft_probs, target_probs[:, :3], []).shape == (2, 3, 0)


@pytest.mark.parametrize(
    "names, error, match",
    [
        (["tv", "kl"], ValueError, r"`features` has an unknown feature 'kl'; valid names are \['tv', 'target_entropy'"),
        ("tv", TypeError, r"`features` must be a list of feature names, got the string 'tv'; write \['tv'\]"),
        (["tv", "tv"], ValueError, r"`features` names \['tv'\] more than once"),
    ],
)
def test_bad_feature_names_are_named(names, error, match):
    with pytest.raises(error, match=match):
        DiversedHead(features=names, use_hidden_states=False)


def test_a_head_must_read_something_and_hidden_sizes_only_when_it_reads_hidden_states():
    with pytest.raises(
        ValueError, match=r"`use_hidden_states=False` with no `features` leaves the head nothing to read"
    ):
        DiversedHeadConfig(draft_hidden_size=4, target_hidden_size=6, use_hidden_states=False)
    with pytest.raises(ValueError, match=r"`draft_hidden_size` must be a positive integer, got None"):
        DiversedHeadConfig(features=["tv"])
    with pytest.raises(TypeError, match=r"`use_hidden_states` must be True or False, got 'no'"):
        DiversedHeadConfig(features=["tv"], use_hidden_states="no")
    config = DiversedHeadConfig(features=["tv"], use_hidden_states=False)
    assert config.draft_hidden_size is None and config.format_version == HEAD_FORMAT_VERSION == 2


# w_t never reads the drafted token ------------------------------------------------------------------


@pytest.mark.parametrize("use_hidden_states", [True, False])
@pytest.mark.parametrize("do_sample", [True, False])
def test_target_weight_does_not_change_with_the_drafted_tokens(use_hidden_states, do_sample):
    """Same p, q and hidden states, other drafted tokens: the weights the verifier mixes with are identical."""
    head = randomize(
        DiversedHead(
            draft_hidden_size=4,
            target_hidden_size=5,
            architecture="mlp",
            mlp_hidden_size=8,
            features=list(FEATURE_NAMES),
            use_hidden_states=use_hidden_states,
        )
    )
    verifier = HeadVerifier(head)
    draft_probs, target_probs = random_round(batch=2, num_draft=3, vocab=6)
    generator = torch.Generator().manual_seed(1)
    hidden = dict(
        draft_hidden=torch.randn(2, 3, 4, generator=generator), target_hidden=torch.randn(2, 4, 5, generator=generator)
    )
    weights = []
    for seed in range(4):
        draft_ids = torch.randint(0, 6, (2, 3), generator=torch.Generator().manual_seed(seed))
        sampling = dict(do_sample=do_sample, generator=torch.Generator().manual_seed(0))
        result = verifier(draft_ids, draft_probs, target_probs, **sampling, **hidden)
        weights.append(result.target_weight)
    assert all(torch.equal(weights[0], w) for w in weights[1:])
    assert weights[0].std() > 0, "the weights should vary with the context, or the test proves little"


# Config format 2; format-1 heads load unchanged -------------------------------------------------------


def _old_network(architecture, input_size, width=8):
    """The network a format-1 head held (before features existed)."""
    if architecture == "linear":
        return nn.Sequential(nn.Linear(input_size, 1))
    return nn.Sequential(nn.LayerNorm(input_size), nn.Linear(input_size, width), nn.GELU(), nn.Linear(width, 1))


@pytest.mark.parametrize("architecture", ["linear", "mlp"])
def test_a_format_1_head_loads_unchanged(tmp_path, architecture):
    old_config = {
        "architecture": architecture,
        "draft_hidden_size": 4,
        "target_hidden_size": 6,
        "draft_model_id": "org/draft",
        "format_version": 1,
        "mixing": "probs",
        "mlp_hidden_size": 8 if architecture == "mlp" else 256,
        "target_model_id": "org/target",
        "task": "gsm8k",
        "w_0": 0.5,
    }
    network = randomize(_old_network(architecture, 10))
    directory = tmp_path / "old"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(old_config, indent=2, sort_keys=True) + "\n")
    state = {f"net.{name}": tensor for name, tensor in network.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})

    config = DiversedHeadConfig(**old_config)
    assert config.features == [] and config.use_hidden_states is True and config.format_version == HEAD_FORMAT_VERSION
    head = DiversedHead.from_pretrained(directory)
    assert head.config == config
    draft_hidden, target_hidden = torch.randn(2, 3, 4), torch.randn(2, 3, 6)
    with torch.no_grad():
        expected = torch.sigmoid(network(torch.cat([draft_hidden, target_hidden], dim=-1)).squeeze(-1).double()).float()
        assert torch.equal(head(draft_hidden, target_hidden), expected)
    head.save_pretrained(tmp_path / "resaved")
    written = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert written == {**old_config, "format_version": 2, "features": [], "use_hidden_states": True}


@pytest.mark.parametrize("architecture", ["linear", "mlp"])
@pytest.mark.parametrize("use_hidden_states", [True, False])
def test_features_head_round_trip(tmp_path, architecture, use_hidden_states):
    head = randomize(
        DiversedHead(
            draft_hidden_size=4,
            target_hidden_size=6,
            architecture=architecture,
            mlp_hidden_size=8 if architecture == "mlp" else 256,
            features=SOME_FEATURES,
            use_hidden_states=use_hidden_states,
            w_0=0.3,
        )
    )
    head.save_pretrained(tmp_path / "head")
    written = json.loads((tmp_path / "head" / "config.json").read_text())
    assert written["features"] == SOME_FEATURES and written["use_hidden_states"] is use_hidden_states
    assert written["format_version"] == 2
    loaded = DiversedHead.from_pretrained(tmp_path / "head")
    assert loaded.config == head.config
    draft_probs, target_probs = random_round()
    features = distribution_features(draft_probs, target_probs[:, :3], SOME_FEATURES)
    hidden = (torch.randn(2, 3, 4), torch.randn(2, 3, 6)) if use_hidden_states else (None, None)
    assert torch.equal(loaded(*hidden, features), head(*hidden, features))


def test_a_features_only_head_without_hidden_sizes_round_trips(tmp_path):
    head = randomize(DiversedHead(features=["tv", "draft_top1"], use_hidden_states=False))
    head.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["draft_hidden_size"] is None
    loaded = DiversedHead.from_pretrained(tmp_path)
    features = torch.rand(2, 3, 2)
    assert torch.equal(loaded(None, None, features), head(None, None, features))


def test_the_head_names_missing_or_misshapen_features():
    head = DiversedHead(draft_hidden_size=4, target_hidden_size=6, features=["tv", "draft_top1"])
    hidden = (torch.randn(2, 3, 4), torch.randn(2, 3, 6))
    expected = r"reads the features \['tv', 'draft_top1'\]: `features` must be \(batch, tokens, 2\), got None"
    with pytest.raises(ValueError, match=expected):
        head(*hidden)
    with pytest.raises(ValueError, match=r"must agree on every dimension but the last"):
        head(*hidden, torch.rand(2, 4, 2))
    with pytest.raises(ValueError, match=r"reads hidden states: pass `draft_hidden` and `target_hidden`"):
        head(None, None, torch.rand(2, 3, 2))


# Pair-agnostic heads in generate --------------------------------------------------------------------


def other_pair():
    """A pair sharing the tiny models' vocabulary but with other hidden sizes (target 48, draft 24)."""
    return enable_diversed(make_model("llama", hidden_size=48, seed=5)), make_model("llama", hidden_size=24, seed=6)


def record_hidden_state_requests(monkeypatch) -> list:
    requests = []
    forward = compat.forward_with_cache

    def recording(*args, **kwargs):
        requests.append(kwargs.get("output_hidden_states"))
        return forward(*args, **kwargs)

    monkeypatch.setattr(compat, "forward_with_cache", recording)
    return requests


def test_a_features_only_head_runs_with_a_pair_of_other_hidden_sizes(monkeypatch):
    target, draft = make_pair("llama")
    head = randomize(
        DiversedHead.for_pair(target, draft, architecture="mlp", features=SOME_FEATURES, use_hidden_states=False)
    )
    hidden_head = DiversedHead.for_pair(target, draft, features=SOME_FEATURES)
    other_target, other_draft = other_pair()
    expected = r"built for hidden sizes \(draft 32, target 32\) but the models have \(draft 24, target 48\)"
    with pytest.raises(ValueError, match=expected):
        other_target.generate(prompt(4), assistant_model=other_draft, diversed_head=hidden_head)
    requests = record_hidden_state_requests(monkeypatch)
    output = other_target.generate(
        prompt(5, batch=2),
        assistant_model=other_draft,
        diversed_head=head,
        do_sample=True,
        max_new_tokens=12,
        num_assistant_tokens=3,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert output.sequences.shape[0] == 2 and output.sequences.shape[1] > 5
    drafted = torch.cat([w[~w.isnan()] for w in output.speculation.target_weights])
    assert drafted.numel() > 0 and drafted.std() > 0
    assert requests and not any(requests), "a head without hidden states must not ask the models for them"


def test_a_hidden_state_head_still_asks_for_them(monkeypatch):
    target, draft = make_pair("llama")
    enable_diversed(target)
    requests = record_hidden_state_requests(monkeypatch)
    target.generate(
        prompt(4),
        assistant_model=draft,
        diversed_head=DiversedHead.for_pair(target, draft, features=["tv"]),
        do_sample=False,
        max_new_tokens=6,
    )
    assert requests and all(requests)


def test_a_fresh_features_head_equals_the_static_ensemble():
    target, draft = other_pair()
    head = DiversedHead.for_pair(target, draft, w_0=0.3, features=list(FEATURE_NAMES), use_hidden_states=False)
    input_ids = prompt(6, seed=4)
    greedy = dict(do_sample=False, max_new_tokens=24, num_assistant_tokens=4)
    with_head = target.generate(input_ids, assistant_model=draft, diversed_head=head, **greedy)
    static = target.generate(input_ids, assistant_model=draft, verifier=StaticEnsembleVerifier(0.3), **greedy)
    assert torch.equal(with_head, static)
    sampling = dict(do_sample=True, max_new_tokens=16)
    sampled = [
        target.generate(input_ids, assistant_model=draft, generator=torch.Generator().manual_seed(0), **sampling, **kw)
        for kw in (dict(diversed_head=head), dict(verifier=StaticEnsembleVerifier(0.3)))
    ]
    assert torch.equal(*sampled)


def test_batched_greedy_rows_equal_single_prompt_runs_with_a_features_head():
    target, draft = make_pair("qwen3")
    enable_diversed(target)
    head = DiversedHead.for_pair(target, draft, architecture="mlp", features=SOME_FEATURES, use_hidden_states=False)
    randomize(head, scale=2.0)
    greedy = dict(do_sample=False, max_new_tokens=16, num_assistant_tokens=3, diversed_head=head)
    lengths = [3, 8, 5, 1]
    rows = [prompt(length, seed=i)[0] for i, length in enumerate(lengths)]
    input_ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, max(lengths) - len(row) :], attention_mask[i, max(lengths) - len(row) :] = row, 1
    batched = target.generate(input_ids, attention_mask=attention_mask, assistant_model=draft, **greedy)
    for i, row in enumerate(rows):
        alone = target.generate(row[None], assistant_model=draft, **greedy)[0, row.numel() :]
        assert torch.equal(batched[i, max(lengths) : max(lengths) + alone.numel()], alone), f"row {i}"


def test_generate_with_a_features_head_emits_the_declared_mixture():
    """Thousands of rows in one call: the first token follows nu_1 = w p + (1 - w) q, w from the features of p, q."""
    from transformers import GenerationConfig

    target, draft = make_pair("llama", noise=0.5)
    enable_diversed(target)
    head = randomize(
        DiversedHead.for_pair(target, draft, features=list(FEATURE_NAMES), use_hidden_states=False), scale=0.5
    )
    verifier = HeadVerifier(head.requires_grad_(False))
    sampling = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    input_ids = prompt(6, seed=5)
    num_rows = 6000
    output = target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=verifier,
        max_new_tokens=2,
        num_assistant_tokens=1,
        generator=torch.Generator().manual_seed(0),
        **sampling,
    )
    processors = target._get_logits_processor(GenerationConfig(**sampling))
    with torch.no_grad():
        target_probs = processors(input_ids, target(input_ids).logits[:, -1]).softmax(-1)[:, None]  # (1, 1, V)
        draft_probs = processors(input_ids, draft(input_ids).logits[:, -1]).softmax(-1)[:, None]
    declared, weight = verifier.verification_probs(draft_probs, target_probs)
    assert 0.05 < float(weight) < 0.95 and ops.total_variation(declared[0, 0], target_probs[0, 0]) > 0.02
    observed = empirical(output[:, input_ids.shape[1]], VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared[0, 0].double())) < tv_bound(declared[0, 0], num_rows)


# The same features in training rollouts as in generation ---------------------------------------------


@pytest.mark.parametrize("use_hidden_states", [True, False])
def test_rollout_gives_the_head_what_generation_gives_it(monkeypatch, use_hidden_states):
    """The first position's w is the same in a training rollout and in generate, at the same temperature and top-k;
    and a rollout's stored features are those of the teacher-forced processed distributions."""
    target, draft = make_pair("llama", noise=0.5)
    enable_diversed(target)
    head = DiversedHead.for_pair(
        target, draft, architecture="mlp", features=list(FEATURE_NAMES), use_hidden_states=use_hidden_states
    )
    randomize(head, scale=0.3).requires_grad_(False)
    input_ids = prompt(6, seed=2, batch=3)
    temperature, top_k = 0.7, 20
    requests = record_hidden_state_requests(monkeypatch)
    rollout = sample_from_mixture(
        target,
        draft,
        head,
        input_ids,
        max_new_tokens=4,
        temperature=temperature,
        top_k=top_k,
        generator=torch.Generator().manual_seed(0),
    )
    assert all(requests) if use_hidden_states else not any(requests)
    width = 32 if use_hidden_states else 0
    assert rollout.draft_hidden.shape == rollout.target_hidden.shape == (3, 4, width)
    assert rollout.features.shape == (3, 4, len(FEATURE_NAMES))
    output = target.generate(
        input_ids,
        assistant_model=draft,
        diversed_head=head,
        do_sample=True,
        temperature=temperature,
        top_k=top_k,
        top_p=1.0,
        max_new_tokens=3,
        num_assistant_tokens=2,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(0),
    )
    generated = torch.stack(
        [weights[0] for weights in output.speculation.target_weights]
    )  # (3,) first drafted position
    torch.testing.assert_close(generated, rollout.target_weight[:, 0], atol=1e-5, rtol=0)
    warpers = build_logits_warpers(temperature, top_k)
    for row in range(3):
        full = torch.cat([input_ids[row], rollout.completion_ids[row]])[None]
        positions = slice(input_ids.shape[1] - 1, full.shape[1] - 1)
        with torch.no_grad():
            target_probs = warpers(full, target(full).logits[0, positions].float()).softmax(-1)
            draft_probs = warpers(full, draft(full).logits[0, positions].float()).softmax(-1)
        expected = distribution_features(draft_probs, target_probs, FEATURE_NAMES)
        torch.testing.assert_close(rollout.features[row], expected, atol=1e-5, rtol=0)


def test_training_config_takes_features_from_yaml_and_trains_a_features_head(tmp_path):
    pytest.importorskip("trl")
    from test_training import trainer_for
    from trl import TrlParser

    from diversed_hf.training import DiversedConfig

    (tmp_path / "run.yaml").write_text(
        f"output_dir: {tmp_path / 'out'}\nhead_features: [tv, draft_top1, target_entropy]\nhead_use_hidden_states: false\n"
        "report_to: none\n"
    )
    (parsed,) = TrlParser((DiversedConfig,)).parse_args_and_config(args=["--config", str(tmp_path / "run.yaml")])
    assert parsed.head_features == ["tv", "draft_top1", "target_entropy"] and parsed.head_use_hidden_states is False
    (flags,) = TrlParser((DiversedConfig,)).parse_args_and_config(
        args=["--output_dir", str(tmp_path), "--head_features", "tv", "argmax_agree", "--report_to", "none"]
    )
    assert flags.head_features == ["tv", "argmax_agree"] and flags.head_use_hidden_states is True
    with pytest.raises(ValueError, match=r"`head_features` has an unknown feature 'entropy'"):
        DiversedConfig(output_dir=str(tmp_path), head_features=["entropy"], report_to="none")
    with pytest.raises(ValueError, match=r"`head_use_hidden_states=False` needs `head_features`"):
        DiversedConfig(output_dir=str(tmp_path), head_use_hidden_states=False, report_to="none")

    trainer = trainer_for(
        tmp_path, head_features=["tv", "draft_top1", "target_entropy"], head_use_hidden_states=False, max_steps=2
    )  # the trainer builds the head from the config
    head = trainer.model
    assert head.config.features == ["tv", "draft_top1", "target_entropy"] and not head.config.use_hidden_states
    first = head.net[0].weight.detach().clone()  # (1, 3): starts at zero, moves only if gradients reach it
    trainer.train()
    assert not torch.equal(head.net[0].weight, first) and bool(torch.isfinite(head.net[0].weight).all())
    assert head.net[0].weight.grad is None or bool(torch.isfinite(head.net[0].weight.grad).all())
