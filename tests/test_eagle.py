"""EagleDraft: a feature draft as a plain ``assistant_model`` (docs/eagle.md).

Exactness is checked against a reference written here without caches: at every column the draft reads the target's
last hidden state of the column before (recomputed from scratch on the whole sequence), and within a round its own
predicted features.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB_SIZE, empirical, left_padded_batch, make_model, make_other_model, prompt, tv_bound

from diversed_hf import DiversedHead, EagleDraft, EagleDraftConfig, enable_diversed
from diversed_hf.drafting.eagle import LAYOUTS
from diversed_hf.verifiers import BlockVerifier, ExactVerifier, StaticEnsembleVerifier, Verifier


def eagle_pair(architecture: str = "llama", draft_vocab_ids=None, seed: int = 0):
    target = enable_diversed(make_model(architecture, hidden_size=32, num_layers=2, seed=seed))
    torch.manual_seed(seed + 7)
    draft = EagleDraft.for_target(target, draft_vocab_ids=draft_vocab_ids).eval()
    with torch.no_grad():  # sharper draft distributions, so drafts agree with the target on some tokens
        draft.fc.weight.mul_(4.0)
    return target, draft


@torch.no_grad()
def reference_features(target, draft, seq: torch.Tensor) -> torch.Tensor:  # (1, L, d): column j holds h_{j-1}
    hidden = target(seq, output_hidden_states=True).hidden_states[-1]  # (1, L, d)
    return torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)


@torch.no_grad()
def reference_draft(target, draft, seq: torch.Tensor, tokens: list[int]):
    """The draft's distributions after ``seq`` (true features) and then after each of ``tokens`` (its own features):
    ``len(tokens) + 1`` distributions over the target's vocabulary, no cache anywhere."""
    features = reference_features(target, draft, seq)
    probs = []
    for step in range(len(tokens) + 1):
        predicted = draft.features(seq, features)  # (1, L, d)
        probs.append(draft.full_logits(predicted[0, -1]).softmax(-1))
        if step < len(tokens):
            seq = torch.cat([seq, torch.tensor([[tokens[step]]])], dim=1)
            features = torch.cat([features, predicted[:, -1:]], dim=1)
    return probs


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_greedy_with_exact_verifier_is_the_targets_greedy_output(architecture, padding_side):
    target, draft = eagle_pair(architecture, draft_vocab_ids=torch.arange(2, 50))
    rows, input_ids, attention_mask = left_padded_batch([4, 9, 6])
    if padding_side == "right":
        input_ids = torch.stack([torch.cat([r, torch.zeros(9 - len(r), dtype=r.dtype)]) for r in rows])
        attention_mask = torch.stack([torch.cat([torch.ones(len(r)), torch.zeros(9 - len(r))]).long() for r in rows])
    for n in (1, 3, 6):
        out = target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            verifier=ExactVerifier(),
            do_sample=False,
            max_new_tokens=24,
            num_assistant_tokens=n,
            return_dict_in_generate=True,
        )
        for i, row in enumerate(rows):
            alone = target.generate(row[None], do_sample=False, max_new_tokens=24)
            new = out.sequences[i, input_ids.shape[1] :]
            assert torch.equal(new, alone[0, len(row) :]), (architecture, padding_side, n, i)


def test_a_features_buffer_that_outgrows_its_room_keeps_greedy_parity(monkeypatch):
    """The features buffer is sized for the call; should a round outrun it, it grows and the output is unchanged."""
    from diversed_hf.drafting.feature_candidates import FeatureCandidateGenerator

    set_features = FeatureCandidateGenerator.set_target_features

    def no_room(self, hidden, attention_mask):  # a buffer holding only the prompt: every round must grow it
        set_features(self, hidden, attention_mask)
        self.buffer = self.buffer[:, : self.length].clone()

    monkeypatch.setattr(FeatureCandidateGenerator, "set_target_features", no_room)
    target, draft = eagle_pair(draft_vocab_ids=torch.arange(2, 50))
    rows, input_ids, attention_mask = left_padded_batch([4, 9, 6])
    out = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=24,
        num_assistant_tokens=3,
    )
    for i, row in enumerate(rows):
        alone = target.generate(row[None], do_sample=False, max_new_tokens=24)
        assert torch.equal(out[i, input_ids.shape[1] :], alone[0, len(row) :]), i


@pytest.mark.parametrize("architecture", ["llama", "gemma3"])
def test_drafts_follow_the_reference_through_shifted_rows(architecture):
    """Per-round drafts equal the cache-free reference, with rows accepting different numbers of drafts (so rows are
    shifted, caches cropped and features realigned), and a head reads the draft's predicted features."""

    class EveryThirdId(
        Verifier
    ):  # greedy: a draft whose id is not a multiple of 3 is kept; else it must equal argmax p
        def verification_probs(self, draft_probs, target_probs, **context):
            trusted = (draft_probs.argmax(-1) % 3 != 0)[..., None]
            return torch.where(trusted, draft_probs, target_probs), None

    target, draft = eagle_pair(architecture)
    rows, input_ids, attention_mask = left_padded_batch([5, 8, 3], seed=3)
    num_draft, max_new = 3, 20
    out = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=EveryThirdId(),
        do_sample=False,
        max_new_tokens=max_new,
        num_assistant_tokens=num_draft,
        return_dict_in_generate=True,
    )
    accepted = [int(a) for a in out.speculation.num_accepted]
    assert len(set(accepted)) > 1, "rows should accept different numbers of drafts"
    for i, row in enumerate(rows):  # the reference, one row alone
        seq, lengths = row[None], []
        while seq.shape[1] - len(row) < max_new:
            remaining = max_new - (seq.shape[1] - len(row))
            n = min(num_draft, remaining - 1)
            drafts = []
            for probs in reference_draft(target, draft, seq, [])[:1] if n else []:
                drafts.append(int(probs.argmax()))
            for _ in range(1, n):
                drafts.append(int(reference_draft(target, draft, seq, drafts)[-1].argmax()))
            with torch.no_grad():
                p = target(torch.cat([seq, torch.tensor([drafts], dtype=seq.dtype)], dim=1)).logits[0, -(n + 1) :]
            kept = 0
            while kept < n and (drafts[kept] % 3 != 0 or drafts[kept] == int(p[kept].argmax())):
                kept += 1
            lengths.append(kept)
            step = drafts[:kept] + [int(p[kept].argmax())]
            seq = torch.cat([seq, torch.tensor([step], dtype=seq.dtype)], dim=1)
        assert torch.equal(out.sequences[i, input_ids.shape[1] :], seq[0, len(row) : len(row) + max_new]), i
        assert accepted[i] == sum(lengths), i

    head = DiversedHead.for_pair(target, draft, w_0=0.5)
    assert head.config.draft_hidden_size == target.config.hidden_size  # h^q lives in the target's feature space
    out = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        diversed_head=head,
        do_sample=True,
        max_new_tokens=12,
        generator=torch.Generator().manual_seed(0),
        output_target_weights=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (3, 8 + 12)


def _law_of_two_tokens(target, draft, verifier: Verifier, input_ids, num_rows: int):
    return target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=verifier,
        do_sample=True,
        max_new_tokens=3,
        num_assistant_tokens=2,
        generator=torch.Generator().manual_seed(0),
    )[:, input_ids.shape[1] : input_ids.shape[1] + 2]


@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_sampled_law_at_drafted_positions_is_the_declared_one(weight):
    """Tokens 1 and 2 of a round of N = 2 (untrained draft): token 1 follows nu_1 = w p_1 + (1 - w) q_1; token 2
    follows nu_2 built from the draft's step on its own feature when token 1 was a kept draft, and from a new round's
    first step (true features) when it was the recovered token. ``weight = 1`` is lossless SD: both follow ``p``."""
    from diversed_hf.verifiers import ops

    target, draft = eagle_pair("llama", draft_vocab_ids=torch.arange(2, 60))
    verifier = ExactVerifier() if weight == 1.0 else StaticEnsembleVerifier(weight)
    input_ids = prompt(5, seed=11)
    num_rows = 6000
    tokens = _law_of_two_tokens(target, draft, verifier, input_ids, num_rows)
    with torch.no_grad():
        p1 = target(input_ids).logits[0, -1].softmax(-1).double()
        q1 = reference_draft(target, draft, input_ids, [])[0].double()
        nu1 = weight * p1 + (1 - weight) * q1
        kept = q1 * torch.minimum(torch.ones_like(q1), nu1 / q1.clamp(min=1e-300)) * (q1 > 0)  # P(x kept as a draft)
        recovered = nu1 - kept  # P(x emitted as the recovered token)
        declared_second = torch.zeros(VOCAB_SIZE, dtype=torch.float64)
        for x in range(VOCAB_SIZE):
            seq = torch.cat([input_ids, torch.tensor([[x]])], dim=1)
            p2 = target(seq).logits[0, -1].softmax(-1).double()
            if kept[x] > 0:
                q2_own = reference_draft(target, draft, input_ids, [x])[1].double()
                declared_second += kept[x] * (weight * p2 + (1 - weight) * q2_own)
            if recovered[x] > 1e-12:
                q2_true = reference_draft(target, draft, seq, [])[0].double()
                declared_second += recovered[x] * (weight * p2 + (1 - weight) * q2_true)
    for observed, declared in ((tokens[:, 0], nu1), (tokens[:, 1], declared_second)):
        observed = empirical(observed, VOCAB_SIZE)
        assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


def test_training_rollouts_read_the_targets_features():
    """``sample_from_mixture`` with a feature draft: at every sampled token of a left-padded batch, ``q_t`` and
    ``h^q_t`` are the draft's after the sequence so far with the target's features (the reference without caches),
    ``p_t`` the target's, and the head's ``w`` reads that ``h^q_t``."""
    from diversed_hf.training.rollout import sample_from_mixture

    target, draft = eagle_pair("llama", draft_vocab_ids=torch.arange(2, 60))
    head = DiversedHead.for_pair(target, draft, w_0=0.4, use_hidden_states=True)
    rows, input_ids, attention_mask = left_padded_batch([4, 7, 5], seed=3)
    order = [0, 1, 0, 2, 1]  # repeated prompts, as a group's samples: the prefill reads each one once
    rows, input_ids, attention_mask = [rows[i] for i in order], input_ids[order], attention_mask[order]
    rollout = sample_from_mixture(
        target, draft, head, input_ids, attention_mask, max_new_tokens=6, generator=torch.Generator().manual_seed(0)
    )
    for b, row in enumerate(rows):
        tokens = rollout.completion_ids[b].tolist()
        for t, token in enumerate(tokens):
            seq = torch.cat([row, torch.tensor(tokens[:t], dtype=torch.long)])[None]
            with torch.no_grad():
                p = target(seq).logits[0, -1].softmax(-1)
                q = reference_draft(target, draft, seq, [])[0]
                predicted = draft.features(seq, reference_features(target, draft, seq))[:, -1]  # (1, d)
                w = head(predicted[:, None], target(seq, output_hidden_states=True).hidden_states[-1][:, -1:])[0, 0]
            torch.testing.assert_close(rollout.draft_token_probs[b, t], q[token], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(rollout.target_token_probs[b, t], p[token], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(rollout.draft_hidden[b, t], predicted[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(rollout.target_weight[b, t], w.float(), atol=1e-5, rtol=1e-4)


def test_draft_ids_outside_its_vocabulary_have_probability_zero():
    target, draft = eagle_pair("llama", draft_vocab_ids=torch.arange(10, 30))
    out = target.generate(
        prompt(5, batch=4),
        assistant_model=draft,
        verifier=StaticEnsembleVerifier(0.0),
        do_sample=True,
        max_new_tokens=16,
        num_assistant_tokens=15,
        generator=torch.Generator().manual_seed(0),
        return_dict_in_generate=True,
    )
    # w = 0 keeps every draft: each round's tokens but its bonus are drafts, all inside the draft's ids
    new = out.sequences[:, 5:]
    assert ((new[:, :15] >= 10) & (new[:, :15] < 30)).all()


def test_every_generate_option_runs_with_a_feature_draft():
    from transformers import TextIteratorStreamer  # noqa: F401 - the streamer class transformers exports

    target, draft = eagle_pair("qwen3")
    inputs = prompt(6, batch=2, seed=2)
    out = target.generate(inputs, assistant_model=draft, do_sample=False, max_new_tokens=10)  # no verifier: lossless
    assert torch.equal(out, target.generate(inputs, do_sample=False, max_new_tokens=10))
    sampled = target.generate(
        inputs,
        assistant_model=draft,
        verifier=BlockVerifier(StaticEnsembleVerifier(0.5)),
        do_sample=True,
        num_return_sequences=3,
        max_new_tokens=10,
        num_assistant_tokens_schedule="heuristic_transient",
        num_assistant_tokens=3,
        generator=torch.Generator().manual_seed(0),
    )
    assert sampled.shape == (6, 16)
    optimal = target.generate(
        inputs,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=10,
        num_assistant_tokens=4,
        num_assistant_tokens_schedule="optimal",
    )
    assert torch.equal(optimal, out)

    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Collect()
    streamed = target.generate(inputs[:1], assistant_model=draft, do_sample=False, max_new_tokens=8, streamer=streamer)
    assert sum((c for c in streamer.chunks[1:-1]), []) == streamed[0, 6:].tolist() and streamer.chunks[-1] == "end"


def test_save_load_and_attach(tmp_path):
    target, draft = eagle_pair("llama", draft_vocab_ids=torch.arange(5, 40))
    draft.generation_config.num_assistant_tokens = 4
    draft.save_pretrained(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= names
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved:  # the target's embeddings are never saved
        assert not any("embed" in key or "lm_head" in key for key in saved.keys())
    loaded = EagleDraft.from_pretrained(tmp_path)
    assert loaded.generation_config.num_assistant_tokens == 4
    with pytest.raises(ValueError, match="no target attached"):
        loaded(torch.tensor([[3, 4]]), torch.zeros(1, 2, 32))
    inputs = prompt(5, seed=4)
    ours = target.generate(
        inputs,
        assistant_model=draft,
        verifier=StaticEnsembleVerifier(0.5),
        do_sample=True,
        max_new_tokens=12,
        generator=torch.Generator().manual_seed(1),
    )
    theirs = target.generate(
        inputs,
        assistant_model=loaded,
        verifier=StaticEnsembleVerifier(0.5),
        do_sample=True,
        max_new_tokens=12,
        generator=torch.Generator().manual_seed(1),
    )  # generate attaches it
    assert torch.equal(ours, theirs)
    from transformers import AutoConfig

    assert isinstance(AutoConfig.from_pretrained(tmp_path), EagleDraftConfig)


def test_bad_inputs_are_refused_with_the_fix():
    target, draft = eagle_pair("llama")
    other = make_model("llama", hidden_size=48, num_layers=2)
    with pytest.raises(ValueError, match="hidden_size=32.*hidden_size=48"):
        draft.attach_target(other)
    with pytest.raises(TypeError, match="assistant_model"):
        draft.generate(prompt(3))
    with pytest.raises(ValueError, match="draft_vocab_size=5.*holds 3 ids"):
        EagleDraft.for_target(target, draft_vocab_size=5, draft_vocab_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="`num_layers` must be a positive integer"):
        EagleDraftConfig(target_config=target.config.to_dict(), num_layers=0)
    with pytest.raises(ValueError, match="distinct token ids"):
        EagleDraft.for_target(target, draft_vocab_ids=[3, 3, 4])


def test_a_token_only_loop_gets_a_clear_error():
    target, draft = eagle_pair("llama")
    with pytest.raises(ValueError, match="reads the target's hidden states"):
        draft(prompt(3))
    plain = make_model("llama", hidden_size=32, num_layers=2)  # no enable_diversed: transformers' own assisted loop
    with pytest.raises(TypeError, match=r"transformers' own assisted decoding.*enable_diversed\(target\)"):
        plain.generate(prompt(3), assistant_model=EagleDraft.for_target(plain), max_new_tokens=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_saved_draft_loads_in_one_dtype_and_drafts(tmp_path, dtype):
    """Saved in ``dtype`` (train_eagle_draft.py saves bfloat16) for a float32 target whose config records its dtype:
    loaded as documented, every weight is in the saved dtype (not the target config's), and ``generate`` runs; with
    ``target=`` every weight is in the target's dtype and greedy exact verification is the target's greedy output."""
    target, draft = eagle_pair("llama", draft_vocab_ids=torch.arange(2, 50))
    target.config.dtype = torch.float32  # as from_pretrained records it: the draft's target_config carries it
    draft = EagleDraft.for_target(target, draft_vocab_ids=torch.arange(2, 50))
    draft.to(dtype).save_pretrained(tmp_path)
    loaded = EagleDraft.from_pretrained(tmp_path)
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    inputs = prompt(5, batch=2, seed=5)
    out = target.generate(inputs, assistant_model=loaded, verifier=StaticEnsembleVerifier(0.5), max_new_tokens=6)
    assert out.shape == (2, 11)
    attached = EagleDraft.from_pretrained(tmp_path, target=target)
    assert {p.dtype for p in attached.parameters()} == {torch.float32} and attached.is_attached_to(target)
    greedy = target.generate(
        inputs, assistant_model=attached, verifier=ExactVerifier(), do_sample=False, max_new_tokens=8
    )
    assert torch.equal(greedy, target.generate(inputs, do_sample=False, max_new_tokens=8))


def test_drafts_for_unsupported_targets_or_configs_are_refused_naming_them():
    with pytest.raises(ValueError, match="no `target_config`.*EagleDraft.for_target"):
        EagleDraft(EagleDraftConfig())
    for architecture in ("gpt2", "opt"):
        with pytest.raises(
            ValueError, match=rf"no layout for model_type '{architecture}' .*diversed_hf.drafting.eagle.LAYOUTS"
        ):
            EagleDraft.for_target(make_other_model(architecture))
    for architecture in ("llama", "qwen3", "gemma3"):  # the supported layout builds
        assert EagleDraft.for_target(make_model(architecture)).config.hidden_size == 32


def layout_target(model_type: str):
    """A tiny causal LM of ``model_type`` (every entry of ``LAYOUTS``), hidden size 32, 2 layers."""
    import transformers

    sizes = dict(
        vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    kv = dict(num_key_value_heads=2)
    configs = {
        "llama": transformers.LlamaConfig(**sizes, **kv),
        "mistral": transformers.MistralConfig(**sizes, **kv),
        "qwen2": transformers.Qwen2Config(**sizes, **kv),
        "qwen3": transformers.Qwen3Config(**sizes, **kv, head_dim=8),
        "gemma3_text": transformers.Gemma3TextConfig(**sizes, **kv, head_dim=8),
        "phi3": transformers.Phi3Config(**sizes, **kv, pad_token_id=0),
        "gpt_neox": transformers.GPTNeoXConfig(**sizes),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[model_type]).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return enable_diversed(model)


@pytest.mark.parametrize("model_type", sorted(LAYOUTS))
def test_every_layout_in_the_table_builds_drafts_and_keeps_greedy_parity(model_type):
    target = layout_target(model_type)
    draft = EagleDraft.for_target(target, draft_vocab_ids=torch.arange(2, 50)).eval()
    layout = LAYOUTS[model_type]
    assert getattr(draft.model, layout.embeddings) is None
    assert isinstance(getattr(draft.model, layout.final_norm), torch.nn.Identity)
    rows, input_ids, attention_mask = left_padded_batch([4, 7])
    out = target.generate(
        input_ids, attention_mask=attention_mask, assistant_model=draft, do_sample=False, max_new_tokens=12
    )
    for i, row in enumerate(rows):
        alone = target.generate(row[None], do_sample=False, max_new_tokens=12)
        assert torch.equal(out[i, input_ids.shape[1] :], alone[0, len(row) :]), (model_type, i)


def test_bench_measures_a_feature_drafts_cost():
    """``diversed-hf bench`` times each model's one-token forward; a feature draft is timed with zero features."""
    from diversed_hf.lab.bench.runner import measure_cost

    target, draft = eagle_pair("llama")
    seconds = measure_cost(draft, prompt(6), num_tokens=2, repeats=1)
    assert seconds > 0 and seconds == seconds


def test_a_feature_draft_has_a_fingerprint_of_its_own():
    """Training checkpoints record both models' fingerprints; an EagleDraft has no output embeddings of its own (it
    uses the target's), so its fingerprint comes from its own weights and tells two drafts apart."""
    from diversed_hf.training.checkpoint import model_fingerprint

    target, draft = eagle_pair("llama", seed=0)
    _, other = eagle_pair("llama", seed=1)
    other.attach_target(target)
    assert model_fingerprint(draft) != model_fingerprint(other)
    assert model_fingerprint(draft) != model_fingerprint(target)


@pytest.mark.parametrize("architecture", ["llama", "gemma3"])
def test_transformers_assisted_decoding_drives_the_feature_generator(architecture):
    """transformers' own loop (its ``requires_model_outputs`` contract) hands the generator the target's hidden states:
    greedy output is the target's, and every round's drafts are the cache-free reference draft's greedy tokens."""
    from transformers import GenerationMixin

    from diversed_hf import compat
    from diversed_hf.drafting.feature_candidates import FeatureCandidateGenerator

    rounds = []

    class Recording(FeatureCandidateGenerator):
        def get_candidates(self, input_ids, **kwargs):
            candidates = super().get_candidates(input_ids, **kwargs)
            rounds.append((input_ids, candidates.candidate_ids[0, input_ids.shape[1] :].tolist()))
            return candidates

    target, draft = eagle_pair(architecture)
    draft.generation_config.num_assistant_tokens = 3
    input_ids = prompt(9, seed=3)  # crosses Gemma3's sliding window of 6
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=20)
    with compat.assisted_decoding_candidates(target, Recording):
        output = GenerationMixin.generate(target, input_ids, assistant_model=draft, do_sample=False, max_new_tokens=20)
    assert torch.equal(output, expected)
    assert rounds[0][1] == [] and len(rounds) > 3  # the first call drafts nothing: the target reads the prompt
    for seq, drafts in (r for r in rounds[1:] if r[1]):  # the last rounds may draft nothing (budget)
        reference = [int(probs.argmax()) for probs in reference_draft(target, draft, seq, drafts[:-1])]
        assert drafts == reference
