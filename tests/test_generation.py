"""``generate(..., assistant_model=draft, diversed_head=head | verifier=...)`` on tiny Llama / Qwen3 / Gemma3 pairs."""

import copy

import pytest
import torch
from tiny_models import (
    ARCHITECTURES,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    VOCAB_SIZE,
    left_padded_batch,
    make_model,
    make_pair,
    prompt,
)
from transformers import LlamaForCausalLM, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from diversed_hf import (
    DiversedGenerationMixin,
    DiversedHead,
    ExactVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    enable_diversed,
)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def pair(request):
    target, draft = make_pair(request.param)
    return enable_diversed(target), draft


def randomize(head, seed=0, scale=0.5):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    return head


GREEDY = dict(do_sample=False, max_new_tokens=24, num_assistant_tokens=4)


def test_exact_greedy_equals_target_greedy(pair):
    target, draft = pair
    input_ids = prompt(9)  # longer than Gemma3's sliding window of 6 once generation starts
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=24)
    output = target.generate(
        input_ids, assistant_model=draft, verifier=ExactVerifier(), return_dict_in_generate=True, **GREEDY
    )
    assert torch.equal(output.sequences, expected)
    assert output.speculation.total_accepted > 0, "the pair should agree sometimes, or the test proves little"


@pytest.mark.parametrize("weight", [0.3, 0.7])
def test_static_ensemble_greedy_equals_transformers_ensemble(pair, weight):
    target, draft = pair
    if target.config.model_type == "gemma3_text":
        # transformers 5.24 crops the assistant's sliding-window cache after a rejection and loses
        # positions, so its draft distributions q drift from the true ones (its lossless SD output is
        # unaffected, its ensemble output is). Ours are checked against a no-cache forward below.
        pytest.skip("transformers' assistant cache is inexact for sliding-window layers")
    draft = copy.deepcopy(draft)
    draft.generation_config.num_assistant_tokens = 4
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    input_ids = prompt(7, seed=3)
    expected = target.generate(
        input_ids, assistant_model=draft, assistant_ensemble_weight=weight, do_sample=False, max_new_tokens=24
    )
    ours = target.generate(input_ids, assistant_model=draft, verifier=StaticEnsembleVerifier(weight), **GREEDY)
    assert torch.equal(ours, expected)


class RecordingVerifier(StaticEnsembleVerifier):
    """Keeps what each round saw, to recompute it without a cache."""

    def __call__(self, draft_ids, draft_probs, target_probs, **kwargs):
        result = super().__call__(draft_ids, draft_probs, target_probs, **kwargs)
        self.rounds.append((draft_ids, draft_probs, target_probs, result.num_accepted))
        return result


def test_caches_stay_exact_after_every_rejection(pair):
    """q_t and p_t used in every round equal a no-cache forward pass over the same prefix."""
    target, draft = pair
    verifier = RecordingVerifier(1.0)
    object.__setattr__(verifier, "rounds", [])
    input_ids = prompt(7, seed=3)
    output = target.generate(
        input_ids, assistant_model=draft, verifier=verifier, do_sample=False, max_new_tokens=40, num_assistant_tokens=6
    )
    position, rejections = input_ids.shape[1], 0
    for draft_ids, draft_probs, target_probs, num_accepted in verifier.rounds:
        sequence = torch.cat([output[:, :position], draft_ids], dim=1)
        with torch.no_grad():
            expected_draft = draft(sequence).logits[:, position - 1 : position - 1 + draft_ids.shape[1]].softmax(-1)
            expected_target = target(sequence).logits[:, position - 1 :].softmax(-1)
        torch.testing.assert_close(draft_probs, expected_draft, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(target_probs, expected_target, atol=1e-5, rtol=1e-4)
        rejections += int(num_accepted) < draft_ids.shape[1]
        position += int(num_accepted) + 1
    assert rejections >= 2 and position == output.shape[1]


def test_fresh_head_equals_static_ensemble(pair):
    target, draft = pair
    head = DiversedHead.for_pair(target, draft, w_0=0.3)
    input_ids = prompt(6, seed=4)
    with_head = target.generate(input_ids, assistant_model=draft, diversed_head=head, **GREEDY)
    static = target.generate(input_ids, assistant_model=draft, verifier=StaticEnsembleVerifier(0.3), **GREEDY)
    assert torch.equal(with_head, static)
    sampled = [
        target.generate(
            input_ids,
            assistant_model=draft,
            do_sample=True,
            max_new_tokens=16,
            generator=torch.Generator().manual_seed(0),
            **kw,
        )
        for kw in (dict(diversed_head=head), dict(verifier=StaticEnsembleVerifier(0.3)))
    ]
    assert torch.equal(*sampled)


@pytest.mark.parametrize("method", ["exact", "static", "head"])
def test_batched_greedy_rows_equal_single_prompt_runs(pair, method):
    target, draft = pair
    verifier = {
        "exact": dict(verifier=ExactVerifier()),
        "static": dict(verifier=StaticEnsembleVerifier(0.4)),
        "head": dict(diversed_head=randomize(DiversedHead.for_pair(target, draft, architecture="mlp"))),
    }[method]
    rows, input_ids, attention_mask = left_padded_batch([3, 9, 5, 12, 1, 7, 4, 10])
    batched = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        return_dict_in_generate=True,
        **verifier,
        **GREEDY,
    )
    width = input_ids.shape[1]
    for i, row in enumerate(rows):
        alone = target.generate(row[None], assistant_model=draft, **verifier, **GREEDY)
        new_alone = alone[0, row.numel() :]
        new_batched = batched.sequences[i, width : width + new_alone.numel()]
        assert torch.equal(new_batched, new_alone), f"row {i}"
        assert int(batched.speculation.num_generated[i]) == new_alone.numel()
    assert batched.speculation.total_accepted > 0


def test_head_weights_vary_and_are_reported(pair):
    target, draft = pair
    head = randomize(DiversedHead.for_pair(target, draft, architecture="mlp"))
    output = target.generate(
        prompt(6),
        assistant_model=draft,
        diversed_head=head,
        do_sample=True,
        max_new_tokens=20,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(1),
    )
    weights = output.speculation.target_weights[0]
    assert weights.shape == (int(output.speculation.num_generated[0]),)
    drafted = weights[~weights.isnan()]
    assert drafted.numel() > 0 and drafted.min() >= 0 and drafted.max() <= 1 and drafted.std() > 0


def test_seeded_sampling_is_reproducible_and_stats_consistent(pair):
    target, draft = pair
    _, input_ids, attention_mask = left_padded_batch([4, 8, 6])
    kwargs = dict(
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=LenientVerifier(0.5),
        do_sample=True,
        temperature=0.8,
        top_p=0.95,
        max_new_tokens=20,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
    )
    first = target.generate(input_ids, generator=torch.Generator().manual_seed(7), **kwargs)
    second = target.generate(input_ids, generator=torch.Generator().manual_seed(7), **kwargs)
    torch.manual_seed(11)
    third = target.generate(input_ids, **kwargs)
    torch.manual_seed(11)
    fourth = target.generate(input_ids, **kwargs)
    assert torch.equal(first.sequences, second.sequences) and torch.equal(third.sequences, fourth.sequences)
    stats = first.speculation
    assert (stats.num_accepted <= stats.num_drafted).all()
    assert (stats.num_rounds * 3 >= stats.num_drafted).all()
    assert (stats.accepted_per_position <= stats.drafted_per_position).all()
    assert torch.equal(stats.accepted_per_position.sum(1), stats.num_accepted)
    assert torch.equal(stats.drafted_per_position.sum(1), stats.num_drafted)
    assert ((0 <= stats.acceptance_rate) & (stats.acceptance_rate <= 1)).all()
    assert stats.summary()["num_rows"] == 3
    for betas, drafted, rounds in zip(stats.position_acceptance, stats.drafted_acceptance, stats.num_rounds):
        assert betas.shape == drafted.shape == (int(rounds), 3)
        seen = ~drafted.isnan()
        assert torch.equal(seen, ~betas.isnan()) and ((drafted[seen] >= 0) & (drafted[seen] <= 1)).all()


def test_usual_kwargs_keep_working(pair):
    target, draft = pair
    input_ids = prompt(5, seed=2)
    plain = target.generate(input_ids, do_sample=False, max_new_tokens=30)
    stop_token = int(plain[0, 5 + 10])

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.clone())

        def end(self):
            self.ended = True

    streamer = Collect()
    output = target.generate(
        input_ids,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=30,
        eos_token_id=stop_token,
        pad_token_id=PAD_TOKEN_ID,
        num_assistant_tokens=3,
        streamer=streamer,
    )
    first_stop = (plain[0, 5:] == stop_token).nonzero()[0, 0] + 1
    assert torch.equal(output[0, 5:], plain[0, 5 : 5 + first_stop])
    assert streamer.ended and torch.equal(torch.cat([c.flatten() for c in streamer.chunks]), output[0])

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 0) & (input_ids[:, -1] == stop_token)

    stopped = target.generate(
        input_ids,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=30,
        stopping_criteria=StoppingCriteriaList([StopAfter()]),
        num_assistant_tokens=3,
    )
    assert torch.equal(stopped[0, 5:], plain[0, 5 : 5 + first_stop])
    short = target.generate(
        input_ids, assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=7
    )
    assert short.shape[1] == 5 + 7 and torch.equal(short, plain[:, : 5 + 7])


def test_num_assistant_tokens_is_honoured(pair):
    target, draft = pair
    for n in (1, 2, 5):
        output = target.generate(
            prompt(5),
            assistant_model=draft,
            verifier=StaticEnsembleVerifier(0.5),
            do_sample=True,
            max_new_tokens=40,
            num_assistant_tokens=n,
            return_dict_in_generate=True,
        )
        stats = output.speculation
        assert stats.num_draft_tokens == n and stats.drafted_per_position.shape[1] == n
        assert int(stats.num_drafted[0]) <= n * int(stats.num_rounds[0])


def test_every_baseline_runs_batched(pair):
    target, draft = pair
    _, input_ids, attention_mask = left_padded_batch([3, 6, 9, 2])
    for verifier in [
        ExactVerifier(),
        LenientVerifier(0.3),
        StaticEnsembleVerifier(0.0),
        *[SpecCascadeVerifier(r, 0.2) for r in ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")],
    ]:
        output = target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            verifier=verifier,
            do_sample=True,
            max_new_tokens=12,
            num_assistant_tokens=3,
            return_dict_in_generate=True,
        )
        assert output.sequences.shape[0] == 4
        assert (output.sequences[:, input_ids.shape[1] :] < VOCAB_SIZE).all()


def test_without_head_generate_is_transformers_own():
    target, draft = make_pair("llama")
    plain = copy.deepcopy(target)
    enabled = enable_diversed(target)
    input_ids = prompt(6)
    for kwargs in (dict(do_sample=False), dict(do_sample=True, top_k=10), dict(assistant_model=draft, do_sample=False)):
        torch.manual_seed(0)
        expected = plain.generate(input_ids, max_new_tokens=15, **kwargs)
        torch.manual_seed(0)
        assert torch.equal(enabled.generate(input_ids, max_new_tokens=15, **kwargs), expected)


def test_enable_diversed_is_idempotent_and_keeps_the_architecture(tmp_path):
    target, _ = make_pair("llama")
    enabled = enable_diversed(target)
    assert enabled is target and enable_diversed(enabled) is enabled
    assert isinstance(enabled, DiversedGenerationMixin) and isinstance(enabled, LlamaForCausalLM)
    assert type(enabled).__name__ == "LlamaForCausalLM"
    clone = copy.deepcopy(enabled)
    assert isinstance(clone, DiversedGenerationMixin)
    enabled.save_pretrained(tmp_path)
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config.architectures == ["LlamaForCausalLM"]
    assert type(enable_diversed(make_model("llama"))) is type(enabled)


def test_mixin_in_a_class_definition():
    class DiversedLlama(DiversedGenerationMixin, LlamaForCausalLM):
        pass

    target, draft = make_pair("llama")
    model = DiversedLlama(target.config)
    model.load_state_dict(target.state_dict())
    model.eval()
    out = model.generate(prompt(5), assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=8)
    assert torch.equal(out, target.generate(prompt(5), do_sample=False, max_new_tokens=8))


def _vocabulary_pair(target_vocab: int, draft_vocab: int):
    """Target and draft of one family with padded vocabularies; the ids only one model scores carry real mass."""
    target = enable_diversed(make_model("llama", vocab_size=target_vocab, seed=1))
    draft = make_model("llama", vocab_size=draft_vocab, seed=2)
    with torch.no_grad():  # make the ids at the end of the larger vocabulary likely
        for model, size in ((target, target_vocab), (draft, draft_vocab)):
            if size > VOCAB_SIZE:
                model.get_output_embeddings().weight[VOCAB_SIZE:] *= 3.0
    return target, draft


@pytest.mark.parametrize("target_vocab, draft_vocab", [(VOCAB_SIZE + 8, VOCAB_SIZE), (VOCAB_SIZE, VOCAB_SIZE + 8)])
def test_padded_vocabularies_keep_the_targets_law_and_greedy_output(target_vocab, draft_vocab):
    """The target's distribution is never trimmed: a draft with fewer ids cannot propose the rest, but
    recovered and bonus tokens can be them; a draft with more ids gives those zero probability."""
    from test_translated import tokenizer
    from tiny_models import empirical, tv_bound

    from diversed_hf.verifiers import ops

    target, draft = _vocabulary_pair(target_vocab, draft_vocab)
    same = dict(tokenizer=tokenizer([], reverse=False), assistant_tokenizer=tokenizer([], reverse=False))
    input_ids = prompt(5, seed=3)
    greedy = target.generate(
        input_ids, assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=12, **same
    )
    plain = target.generate(input_ids, do_sample=False, max_new_tokens=12)
    assert torch.equal(greedy, plain)
    if target_vocab > draft_vocab:
        assert (plain[0, 5:] >= draft_vocab).any(), "the test needs greedy tokens the draft cannot propose"

    num_rows = 4000
    output = target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=True,
        max_new_tokens=2,
        num_assistant_tokens=1,
        generator=torch.Generator().manual_seed(0),
        **same,
    )
    with torch.no_grad():
        target_probs = target(input_ids).logits[0, -1].softmax(-1).double()  # (target_vocab,)
    if target_vocab > draft_vocab:
        assert float(target_probs[draft_vocab:].sum()) > 0.05, "the test needs mass on the ids only the target scores"
    observed = empirical(output[:, input_ids.shape[1]], target_vocab)
    assert float(ops.total_variation(observed, target_probs)) < tv_bound(target_probs, num_rows)


@pytest.mark.parametrize("target_vocab, draft_vocab", [(VOCAB_SIZE + 8, VOCAB_SIZE), (VOCAB_SIZE, VOCAB_SIZE + 4)])
def test_vocabularies_of_other_sizes_need_both_tokenizers(target_vocab, draft_vocab):
    """Sizes alone cannot tell a padded copy of one vocabulary from another tokenizer: without both tokenizers the
    call is refused, naming them, before any forward (as transformers does)."""
    target, draft = _vocabulary_pair(target_vocab, draft_vocab)
    with pytest.raises(ValueError, match=r"Pass `tokenizer=` \(the target's\) and `assistant_tokenizer=`"):
        target.generate(prompt(5), assistant_model=draft, verifier=StaticEnsembleVerifier(0.0), max_new_tokens=4)


def test_an_assistant_tokenizer_without_the_targets_is_refused():
    """Without `tokenizer`, a draft's own ids would be verified as the target's (and transformers refuses)."""
    from test_translated import MERGES, tokenizer

    target = enable_diversed(make_model("llama", seed=1))
    draft = make_model("llama", vocab_size=len(tokenizer(MERGES, reverse=True)), seed=4)
    with pytest.raises(ValueError, match="`assistant_tokenizer` was passed without `tokenizer`"):
        target.generate(
            prompt(5),
            assistant_model=draft,
            assistant_tokenizer=tokenizer(MERGES, reverse=True),
            verifier=StaticEnsembleVerifier(0.0),
            max_new_tokens=4,
        )
    with pytest.raises(ValueError, match="`assistant_tokenizer` was passed without `tokenizer`"):
        target.generate(
            prompt(5),
            prompt_lookup_num_tokens=3,
            assistant_tokenizer=tokenizer([], False),
            verifier=ExactVerifier(),
            max_new_tokens=4,
        )


def test_fit_vocabulary_pads_with_impossible_ids_and_trims_extra_ones():
    from diversed_hf.verifiers import ops

    logits = torch.tensor([[0.0, 1.0, 2.0]])
    assert ops.fit_vocabulary(logits, 5).softmax(-1)[0, 3:].tolist() == [0.0, 0.0]
    torch.testing.assert_close(ops.fit_vocabulary(logits, 2).softmax(-1), logits[:, :2].softmax(-1))


# Bad input ------------------------------------------------------------------------------------------


def test_head_or_verifier_without_assistant_model(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="assistant_model=draft"):
        target.generate(prompt(4), diversed_head=DiversedHead.for_pair(target, draft))
    with pytest.raises(ValueError, match="assistant_model=draft"):
        target.generate(prompt(4), verifier=ExactVerifier())


def test_head_and_verifier_together(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="either `diversed_head` or `verifier`"):
        target.generate(
            prompt(4),
            assistant_model=draft,
            diversed_head=DiversedHead.for_pair(target, draft),
            verifier=ExactVerifier(),
        )


def test_head_with_wrong_hidden_sizes_names_the_numbers(pair):
    target, draft = pair
    head = DiversedHead(draft_hidden_size=17, target_hidden_size=23)
    with pytest.raises(ValueError, match=r"draft 17, target 23.*draft 32, target 32"):
        target.generate(prompt(4), assistant_model=draft, diversed_head=head)


def test_different_vocabularies_are_rejected():
    target = enable_diversed(make_model("llama", vocab_size=VOCAB_SIZE, seed=1))
    draft = make_model("llama", vocab_size=VOCAB_SIZE * 10, seed=2)
    with pytest.raises(ValueError, match="tokenizer"):
        target.generate(prompt(4), assistant_model=draft, verifier=ExactVerifier())
    other = make_model("llama", seed=3)
    other.config.eos_token_id = 5
    with pytest.raises(ValueError, match="eos_token_id"):
        target.generate(prompt(4), assistant_model=other, verifier=ExactVerifier())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_beams=2), "num_beams"),
        (dict(assistant_ensemble_weight=0.5), "assistant_ensemble_weight"),
        (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
        (
            dict(cache_implementation="static"),
            r"`cache_implementation='static'` cannot be combined.*Remove `cache_implementation`",
        ),
        (dict(cache_implementation="paged"), r"`cache_implementation='paged'` cannot be combined"),
        (dict(use_cache=False), r"`use_cache=False` cannot be combined.*Remove `use_cache=False`"),
        (dict(dola_layers="high"), "dola_layers"),
        (dict(synced_gpus=True), r"`synced_gpus=True` cannot be combined.*Remove `synced_gpus`"),
        (dict(num_assistant_tokens=0), "num_assistant_tokens"),
        (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha"),
    ],
)
def test_modes_that_cannot_be_combined(pair, kwargs, message):
    target, draft = pair
    with pytest.raises(ValueError, match=message):
        target.generate(prompt(4), assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=5, **kwargs)


def test_our_kwargs_without_a_verifier_are_errors(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="output_target_weights"):
        target.generate(prompt(4), output_target_weights=True)


@pytest.mark.parametrize(
    "method",
    ["exact", "static0.3", "static0", "lenient0.5", "cascade-opt", "cascade-token_v3", "head"],
)
def test_generate_emits_the_declared_distribution_with_temperature_top_k_top_p(method):
    """Thousands of rows in one call: the first emitted token follows pi_1 built from processed q and p."""
    from tiny_models import declared_first_token, empirical, tv_bound

    from diversed_hf import HeadVerifier
    from diversed_hf.verifiers import ops

    target, draft = make_pair("llama", noise=0.5)
    enable_diversed(target)
    head = randomize(DiversedHead.for_pair(target, draft, architecture="mlp"), scale=0.1).requires_grad_(False)
    verifier = {
        "exact": ExactVerifier(),
        "static0.3": StaticEnsembleVerifier(0.3),
        "static0": StaticEnsembleVerifier(0.0),
        "lenient0.5": LenientVerifier(0.5),
        "cascade-opt": SpecCascadeVerifier("opt", 0.3),
        "cascade-token_v3": SpecCascadeVerifier("token_v3", 0.5),
        "head": HeadVerifier(head),
    }[method]
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
    declared, target_probs = declared_first_token(target, draft, verifier, input_ids, sampling)
    assert ops.total_variation(declared, target_probs) > 0.02 or method == "exact", "pick a case that differs from p"
    observed = empirical(output[:, input_ids.shape[1]], VOCAB_SIZE)
    tv = float(ops.total_variation(observed, declared.double()))
    assert tv < tv_bound(declared, num_rows), tv


def test_crop_cache_uses_transformers_crop_and_ignores_shorter_caches():
    from diversed_hf import compat

    target, _ = make_pair("llama")
    cache = compat.new_cache()
    compat.crop_cache(cache, 3)  # empty: nothing to crop
    compat.forward_with_cache(
        target, prompt(6), torch.ones(1, 6, dtype=torch.long), cache, logits_to_keep=1, output_hidden_states=False
    )
    compat.crop_cache(cache, 8)
    assert cache.get_seq_length() == 6
    compat.crop_cache(cache, 4)
    assert cache.get_seq_length() == 4


# Bad input, hardened -------------------------------------------------------------------------------


def test_generate_refuses_unusable_inputs_with_the_fix(pair):
    target, draft = pair
    with pytest.raises(TypeError, match="`assistant_model` must be a transformers causal LM"):
        target.generate(prompt(4), assistant_model="my-draft", verifier=ExactVerifier())
    embeds = target.get_input_embeddings()(prompt(4))
    with pytest.raises(ValueError, match="needs `input_ids`"):
        target.generate(inputs_embeds=embeds, assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=4)
    with pytest.raises(ValueError, match="batch size 0"):
        target.generate(prompt(4)[:0], assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=4)
    with pytest.raises(TypeError, match="`generator` must be a torch.Generator"):
        target.generate(prompt(4), assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=4, generator=0)


def test_a_huge_draft_length_allocates_nothing_per_position(pair):
    target, draft = pair
    output = target.generate(
        prompt(4),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=6,
        num_assistant_tokens=10**9,
        return_dict_in_generate=True,
    )
    stats = output.speculation
    assert stats.drafted_per_position.shape == (1, 5) and stats.num_draft_tokens == 5
    assert torch.equal(output.sequences, target.generate(prompt(4), do_sample=False, max_new_tokens=6))


@pytest.mark.parametrize("broken", ["target", "draft"])
def test_non_finite_distributions_name_the_model(broken):
    target, draft = make_pair("llama")
    enable_diversed(target)
    with torch.no_grad():
        (target if broken == "target" else draft).get_output_embeddings().weight[7, 0] = float("nan")
    for do_sample in (True, False):
        with pytest.raises(ValueError, match=f"The {broken}'s next-token distribution has no finite probability mass"):
            target.generate(
                prompt(4), assistant_model=draft, verifier=ExactVerifier(), do_sample=do_sample, max_new_tokens=6
            )


# Draft-length knobs (transformers' semantics, per row) ----------------------------------------------


@pytest.mark.parametrize(
    "processors", [dict(repetition_penalty=1.3), dict(repetition_penalty=1.3, no_repeat_ngram_size=2)]
)
def test_batched_rows_equal_single_runs_under_per_row_logits_processors(processors):
    """transformers gives the repetition penalty each row's left padding (``prompt_ignore_length``); the loop drops
    finished rows and realigns the rest, and the processor must follow (it used to fail on a batch size mismatch)."""
    target, draft = make_pair("llama", noise=0.3)
    enable_diversed(target)
    rows, input_ids, attention_mask = left_padded_batch([4, 9, 6, 2])
    batched = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=12,
        num_assistant_tokens=3,
        **processors,
    )
    for b, row in enumerate(rows):
        alone = target.generate(row[None], do_sample=False, max_new_tokens=12, **processors)
        assert torch.equal(batched[b, -12:], alone[0, -12:]), b


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_repetition_penalty_ignores_the_columns_a_realignment_brings_in(seed):
    """Rows without padding: transformers (5.23+) drops the all-ones mask and gives the penalty no per-row count, and
    before 5.23 it never does. The columns a shift brings in hold rejected drafts; the penalty must not count them."""
    target, draft = make_pair("llama", noise=0.3)
    enable_diversed(target)
    rows, input_ids, attention_mask = left_padded_batch([6, 6, 6, 6], seed=seed)  # no padding
    kwargs = dict(do_sample=False, max_new_tokens=16, repetition_penalty=1.3)
    out = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=ExactVerifier(),
        num_assistant_tokens=4,
        return_dict_in_generate=True,
        **kwargs,
    )
    assert out.speculation.total_accepted > 0, "rows must accept different numbers of drafts, or nothing shifts"
    assert torch.equal(out.sequences, target.generate(input_ids, attention_mask=attention_mask, **kwargs))


def test_min_new_tokens_and_min_length_hold_per_row_in_a_batch():
    """Rows accept different numbers of drafts, so each needs its own count: transformers' processors count the
    batch's width (a row kept EOS suppressed past min_new_tokens)."""
    target, draft = make_pair("llama", noise=0.3)
    for model in (target, draft):  # EOS just above token 45 (a frequent one): rows end early unless held back
        with torch.no_grad():
            model.lm_head.weight[EOS_TOKEN_ID] = model.lm_head.weight[45] * 1.05
    enable_diversed(target)
    rows, input_ids, attention_mask = left_padded_batch([4, 9, 6, 2], seed=3)
    common = dict(do_sample=False, max_new_tokens=16, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID)
    held_back = 0
    for lengths in (dict(min_new_tokens=8), dict(min_length=input_ids.shape[1] + 8)):
        batched = target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            verifier=ExactVerifier(),
            num_assistant_tokens=3,
            **common,
            **lengths,
        )
        for b, row in enumerate(rows):
            alone = target.generate(row[None], **common, min_new_tokens=8)[0, len(row) :]
            assert torch.equal(batched[b, input_ids.shape[1] : input_ids.shape[1] + len(alone)], alone), (lengths, b)
            free = target.generate(row[None], **common)[0, len(row) :]
            held_back += int(len(free) < 8)
    assert held_back, "pick a case where some row would end before 8 tokens"


POLICIES = [
    dict(num_assistant_tokens_schedule="heuristic"),
    dict(num_assistant_tokens_schedule="heuristic_transient"),
    dict(assistant_confidence_threshold=0.5),
    dict(num_assistant_tokens_schedule="heuristic", assistant_confidence_threshold=0.3),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "+".join(f"{k}={v}" for k, v in p.items()))
def test_greedy_output_and_batching_are_exact_under_every_policy(policy):
    target, draft = make_pair("qwen3", noise=0.3)
    enable_diversed(target)
    rows, input_ids, attention_mask = left_padded_batch([3, 8, 5, 11])
    batched = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=copy.deepcopy(draft),
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=14,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
        **policy,
    )
    for b, row in enumerate(rows):
        alone = target.generate(row[None], do_sample=False, max_new_tokens=14)
        assert torch.equal(batched.sequences[b, -14:], alone[0, -14:]), b
    lengths = batched.speculation.draft_lengths
    assert [len(r) for r in lengths] == batched.speculation.num_rounds.tolist()
    assert all(int(r.max()) <= batched.speculation.drafted_per_position.shape[1] for r in lengths)
    if "assistant_confidence_threshold" in policy and "num_assistant_tokens_schedule" not in policy:
        # the threshold stops rows early (the last round of a row may be cut by its length budget instead)
        assert any(int(length) < 3 for r in lengths for length in r[:-1])


def test_heuristic_schedule_persists_like_transformers():
    target, draft = make_pair("llama", noise=0.05)
    enable_diversed(target)
    ours_draft, theirs_draft = copy.deepcopy(draft), copy.deepcopy(draft)
    for model in (ours_draft, theirs_draft):
        model.generation_config.num_assistant_tokens = 2
        model.generation_config.num_assistant_tokens_schedule = "heuristic"
        model.generation_config.assistant_confidence_threshold = 0.0  # transformers' default 0.4 would stop early
    ours = target.generate(
        prompt(5),
        assistant_model=ours_draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=20,
        return_dict_in_generate=True,
    )
    theirs = target.generate(prompt(5), assistant_model=theirs_draft, do_sample=False, max_new_tokens=20)
    assert torch.equal(ours.sequences, theirs)
    assert ours_draft.generation_config.num_assistant_tokens == theirs_draft.generation_config.num_assistant_tokens
    assert ours_draft.generation_config.num_assistant_tokens != 2, "pick a case where the schedule moves"
    assert int(ours.speculation.draft_lengths[0].max()) > 2  # drafted past N: per-position arrays grew
    transient = copy.deepcopy(draft)
    transient.generation_config.num_assistant_tokens_schedule = "heuristic_transient"
    target.generate(
        prompt(5),
        assistant_model=transient,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=20,
        num_assistant_tokens=2,
    )
    assert transient.generation_config.num_assistant_tokens is None  # not written back


@pytest.mark.parametrize("policy", [POLICIES[0], POLICIES[2]], ids=["heuristic", "confidence"])
def test_sampled_two_token_law_is_the_targets_under_a_policy(policy):
    """With ExactVerifier, stopping early or drafting longer never changes the law: both tokens follow p (a relaxed
    verifier's law does move with where rounds end: its bonus tokens come from p)."""
    from tiny_models import empirical, tv_bound

    from diversed_hf.verifiers import ops

    target, draft = make_pair("llama", noise=0.5)
    enable_diversed(target)
    input_ids = prompt(6, seed=5)
    num_rows = 6000
    output = target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=True,
        max_new_tokens=2,
        num_assistant_tokens=1,
        generator=torch.Generator().manual_seed(0),
        **policy,
    )
    with torch.no_grad():
        first = target(input_ids).logits[0, -1].softmax(-1).double()  # (V,) p(x1)
        every_first = torch.cat([input_ids.repeat(VOCAB_SIZE, 1), torch.arange(VOCAB_SIZE)[:, None]], dim=1)
        second = target(every_first).logits[:, -1].softmax(-1).double()  # (V, V) p(x2 | x1)
    declared = first @ second  # (V,) marginal law of the second token
    observed = empirical(output[:, -1], VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


@pytest.mark.parametrize(
    "policy, error, match",
    [
        (dict(num_assistant_tokens_schedule="sometimes"), ValueError, "`num_assistant_tokens_schedule` must be one of"),
        (dict(assistant_confidence_threshold=1.0), ValueError, r"`assistant_confidence_threshold` must be in \[0, 1\)"),
        (dict(assistant_confidence_threshold="high"), TypeError, "`assistant_confidence_threshold` must be a number"),
    ],
)
def test_bad_draft_length_knobs_are_refused(pair, policy, error, match):
    target, draft = pair
    with pytest.raises(error, match=match):
        target.generate(prompt(4), assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=4, **policy)


def test_the_draft_length_knobs_are_resolved_once_per_call(pair, monkeypatch):
    """``generate`` resolves the knobs once (keyword, the call's config, the assistant's config, default) into one
    policy; the candidate generator it builds takes that policy and reads no config again."""
    from diversed_hf.drafting.candidates import DiversedCandidateGenerator, DraftLengthPolicy

    target, draft = pair
    resolved, built = [], []
    resolve = DraftLengthPolicy.resolve.__func__
    init = DiversedCandidateGenerator.__init__

    def counting_resolve(cls, *args, **kwargs):
        resolved.append(resolve(cls, *args, **kwargs))
        return resolved[-1]

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self.policy)

    monkeypatch.setattr(DraftLengthPolicy, "resolve", classmethod(counting_resolve))
    monkeypatch.setattr(DiversedCandidateGenerator, "__init__", recording_init)
    monkeypatch.setattr(draft.generation_config, "num_assistant_tokens", 2)  # the assistant's, under the keyword's
    target.generate(
        prompt(4), assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=6, num_assistant_tokens=3
    )
    assert len(resolved) == 1 and resolved[0].num_assistant_tokens == 3
    assert built == resolved  # the generator got the very policy, without resolving it again
    with pytest.raises(TypeError, match="either as `policy` or as"):
        DiversedCandidateGenerator(prompt(4), draft, max_new_tokens=4, policy=resolved[0], num_assistant_tokens=2)


def test_typical_acceptance_runs_in_generate(pair):
    from diversed_hf import TypicalAcceptanceVerifier

    target, draft = pair
    output = target.generate(
        prompt(5, batch=3),
        assistant_model=draft,
        verifier=TypicalAcceptanceVerifier(),
        do_sample=True,
        max_new_tokens=12,
        generator=torch.Generator().manual_seed(0),
        return_dict_in_generate=True,
    )
    assert output.sequences.shape == (3, 17) and 0.0 <= output.speculation.total_acceptance_rate <= 1.0


def test_optimal_schedule_is_exact_and_chooses_by_acceptance_and_cost():
    from diversed_hf.verifiers import theory

    # theory: long drafts when every position accepts and drafting is cheap, one draft when nothing is accepted
    verify = torch.tensor([1.0, 1.1, 1.2, 1.3])
    assert theory.optimal_draft_length(torch.ones(1, 4), 0.05, verify).tolist() == [4]
    assert theory.optimal_draft_length(torch.zeros(1, 4), 0.05, verify).tolist() == [1]
    decaying = torch.tensor([[0.9, 0.5, 0.1, 0.01]])
    rates = [(1 + decaying[0, :n].sum()) / (n * 0.2 + verify[n - 1]) for n in range(1, 5)]
    assert theory.optimal_draft_length(decaying, 0.2, verify).item() == 1 + int(torch.tensor(rates).argmax())

    # in generate: greedy output stays the target's, batched rows equal single runs, lengths stay in 1..N
    target, draft = make_pair("llama", noise=0.3)
    enable_diversed(target)
    rows, input_ids, attention_mask = left_padded_batch([4, 9, 6])
    output = target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=30,
        num_assistant_tokens=6,
        num_assistant_tokens_schedule="optimal",
        return_dict_in_generate=True,
    )
    for b, row in enumerate(rows):
        assert torch.equal(
            output.sequences[b, -30:], target.generate(row[None], do_sample=False, max_new_tokens=30)[0, -30:]
        )
    for lengths in output.speculation.draft_lengths:
        assert int(lengths.max()) <= 6 and lengths[2] <= 1  # the third round is the one-draft warm-up probe


# Logits processors that read the sequence width --------------------------------------------------------


def _ours(target, draft, input_ids, **kwargs):
    kwargs = dict(do_sample=False, num_assistant_tokens=3) | kwargs
    return target.generate(input_ids, assistant_model=draft, verifier=ExactVerifier(), **kwargs)


@pytest.mark.parametrize("prompt_length", [1, 5])
def test_width_reading_processors_keep_greedy_parity_with_the_target(prompt_length):
    """transformers reads a row's length as the width of `input_ids`. The loop's first round used to see one extra
    (padding) column: `forced_eos_token_id` ended a token early, `begin_suppress_tokens` never applied,
    `forced_bos_token_id` never fired, and the repetition penalty counted the pad id as a prompt token."""
    target, draft = make_pair("llama")
    enable_diversed(target)
    input_ids = prompt(prompt_length, seed=2)
    first = int(target.generate(input_ids, do_sample=False, max_new_tokens=1)[0, -1])
    cases = [
        dict(forced_eos_token_id=7, max_new_tokens=2),
        dict(forced_eos_token_id=7, max_new_tokens=3),
        dict(begin_suppress_tokens=[first], max_new_tokens=6),
        dict(forced_bos_token_id=9, max_new_tokens=4),  # fires at width 1: a one-token prompt
        dict(repetition_penalty=3.0, pad_token_id=first, max_new_tokens=6),  # the extra column held the pad id
        dict(exponential_decay_length_penalty=(1, 3.0), eos_token_id=45, max_new_tokens=6),
    ]
    for case in cases:
        assert torch.equal(
            _ours(target, draft, input_ids, **case), target.generate(input_ids, do_sample=False, **case)
        ), case


def test_width_reading_processors_count_each_row_like_transformers_in_a_batch():
    """In a batch transformers gives every row the padded prompt's width plus its new tokens; the loop's rows are
    right-aligned and accept different numbers of drafts, so each row needs its own width."""
    target, draft = make_pair("llama", noise=0.3)
    for model in (target, draft):  # EOS a little below token 45 (a frequent one): the decay penalty can end rows
        with torch.no_grad():
            model.lm_head.weight[EOS_TOKEN_ID] = model.lm_head.weight[45] * 0.9
    enable_diversed(target)
    _, input_ids, attention_mask = left_padded_batch([4, 9, 6, 2], seed=3)
    common = dict(
        attention_mask=attention_mask, max_new_tokens=12, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID
    )
    plain = target.generate(input_ids, do_sample=False, **common)
    for case in (
        dict(forced_eos_token_id=7),
        dict(begin_suppress_tokens=plain[:, input_ids.shape[1]].tolist()),
        dict(exponential_decay_length_penalty=(3, 1.5)),
    ):
        expected = target.generate(input_ids, do_sample=False, **common, **case)
        assert not torch.equal(expected, plain), f"pick a case where {case} changes the output"
        assert torch.equal(_ours(target, draft, input_ids, **common, **case), expected), case


def test_classifier_free_guidance_is_refused(pair):
    """transformers runs the model again per token on a cache of its own; a speculative round cannot follow it."""
    from transformers import LogitsProcessorList, UnbatchedClassifierFreeGuidanceLogitsProcessor

    target, draft = pair
    with pytest.raises(
        ValueError, match=r"`guidance_scale=1.5` \(classifier-free guidance\) cannot be combined.*Remove"
    ):
        _ours(target, draft, prompt(4), max_new_tokens=4, guidance_scale=1.5)
    guidance = LogitsProcessorList([UnbatchedClassifierFreeGuidanceLogitsProcessor(1.5, target)])
    with pytest.raises(ValueError, match="`UnbatchedClassifierFreeGuidanceLogitsProcessor` .* cannot be combined"):
        _ours(target, draft, prompt(4), max_new_tokens=4, logits_processor=guidance)
    assert torch.equal(  # guidance_scale=1 is off
        _ours(target, draft, prompt(4), max_new_tokens=4, guidance_scale=1.0),
        target.generate(prompt(4), do_sample=False, max_new_tokens=4),
    )


@pytest.mark.parametrize("with_draft", [False, True])
def test_an_unknown_speculation_type_is_refused_before_any_forward_naming_the_argument(pair, with_draft):
    """Every drafter transformers ships runs (tests/test_drafters.py, test_mtp.py, test_kv_sharing.py,
    test_dflash.py); a `speculation_type` the loop does not know is refused."""
    target, draft = pair
    target = enable_diversed(target)
    calls = []
    hook = target.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"`speculation_type='medusa'`: diversed_hf's loop runs 'dflash'.*Drop"):
            target.generate(
                prompt(4),
                max_new_tokens=4,
                verifier=ExactVerifier(),
                speculation_type="medusa",
                **({"assistant_model": draft} if with_draft else {}),
            )
    finally:
        hook.remove()
    assert not calls


def test_a_kv_sharing_assistant_without_its_gemma4_target_is_refused_naming_its_class(pair):
    """A Gemma 4 assistant runs with its Gemma 4 target (tests/test_kv_sharing.py); with another target it is
    refused before any forward pass."""
    target, draft = pair

    class Gemma4AssistantForCausalLM(torch.nn.Module):  # the class name is what transformers dispatches on
        config = draft.config

    with pytest.raises(ValueError, match=r"`assistant_model` is a Gemma4AssistantForCausalLM.*no layer that stores"):
        enable_diversed(target).generate(
            prompt(4),
            assistant_model=Gemma4AssistantForCausalLM(),
            diversed_head=DiversedHead.for_pair(target, draft),
            max_new_tokens=4,
        )


def test_empty_prompts_are_refused_early(pair):
    """An empty prompt used to return tokens (transformers fails on it); an empty-string row of a padded batch
    failed deep in the model."""
    target, draft = pair
    with pytest.raises(ValueError, match=r"`input_ids` has shape \(1, 0\): the prompt is empty.*BOS"):
        _ours(target, draft, prompt(4)[:, :0], max_new_tokens=4)
    _, input_ids, attention_mask = left_padded_batch([4, 3])
    attention_mask[1] = 0
    with pytest.raises(ValueError, match=r"Row 1 of the batch is empty \(its `attention_mask` is all zeros"):
        _ours(target, draft, input_ids, attention_mask=attention_mask, max_new_tokens=4)


@pytest.mark.parametrize("width", [-1, 1])
def test_an_attention_mask_of_another_width_is_refused_naming_both_shapes(pair, width):
    """A right-padded batch with a mask one column narrower used to continue each prompt minus its last token while
    the output showed the whole prompt; transformers raises, and so does the loop."""
    target, draft = pair
    rows, _, _ = left_padded_batch([4, 6])
    input_ids = torch.stack([torch.cat([r, torch.zeros(6 - len(r), dtype=r.dtype)]) for r in rows])  # right-padded
    attention_mask = (torch.arange(6)[None, :] < torch.tensor([4, 6])[:, None]).long()
    attention_mask = attention_mask[:, :-1] if width < 0 else torch.cat([attention_mask, attention_mask[:, -1:]], 1)
    expected = rf"`attention_mask` has shape \(2, {6 + width}\) but `input_ids` has shape \(2, 6\)"
    with pytest.raises(ValueError, match=expected):
        _ours(target, draft, input_ids, attention_mask=attention_mask, max_new_tokens=4)


def test_a_custom_verifiers_bad_output_is_blamed_on_the_verifier_in_generate():
    class NaNVerifier(ExactVerifier):
        def verification_probs(self, draft_probs, target_probs, **context):
            return target_probs.index_fill(-1, torch.tensor([5]), float("nan")), None

    class Unnormalised(ExactVerifier):
        def verification_probs(self, draft_probs, target_probs, **context):
            return 5 * target_probs, None

    target, draft = make_pair("llama")
    enable_diversed(target)
    for verifier in (NaNVerifier(), Unnormalised()):
        for do_sample in (False, True):  # greedy NaN used to emit pad ids; 5 * p raised acceptance silently
            with pytest.raises(ValueError, match=rf"`{type(verifier).__qualname__}.verification_probs` returned"):
                target.generate(
                    prompt(4), assistant_model=draft, verifier=verifier, do_sample=do_sample, max_new_tokens=6
                )


def test_numpy_scalars_are_numbers_in_generate_kwargs():
    np = pytest.importorskip("numpy")
    target, draft = make_pair("llama")
    enable_diversed(target)
    expected = target.generate(prompt(5), do_sample=False, max_new_tokens=8)
    output = target.generate(
        prompt(5),
        assistant_model=draft,
        verifier=StaticEnsembleVerifier(np.float32(1.0)),
        do_sample=False,
        max_new_tokens=8,
        num_assistant_tokens=np.int64(3),
        assistant_confidence_threshold=np.float32(0.2),
        return_dict_in_generate=True,
    )
    assert torch.equal(output.sequences, expected) and output.speculation.num_draft_tokens == 3


def _word_tokenizer():
    """A tokenizer for the tiny models' 64 ids (``w0`` .. ``w63``), built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB_SIZE)}
    vocab["abcdef"] = vocab.pop("w3")  # StopStringCriteria tokenizes "abcdef" to clean the vocabulary
    backend = Tokenizer(models.WordLevel(vocab, unk_token="abcdef"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0", eos_token="w1", bos_token="w2")


def test_stop_strings_with_a_tokenizer():
    """transformers does not hand `tokenizer` on to a `custom_generate` function: it used to say none was given."""
    target, draft = make_pair("llama")
    enable_diversed(target)
    tokenizer = _word_tokenizer()
    input_ids = prompt(5, seed=2)
    plain = target.generate(input_ids, do_sample=False, max_new_tokens=12)
    stop = tokenizer.decode(plain[0, 5 + 4])
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=12, stop_strings=stop, tokenizer=tokenizer)
    assert expected.shape[1] < plain.shape[1], "pick a stop string that stops generation"
    assert torch.equal(
        _ours(target, draft, input_ids, max_new_tokens=12, stop_strings=stop, tokenizer=tokenizer), expected
    )
    with pytest.raises(ValueError, match="tokenizer"):  # without one, transformers' own error
        _ours(target, draft, input_ids, max_new_tokens=12, stop_strings=stop)


def test_a_callers_length_and_eos_criteria_hold_as_in_transformers(pair):
    """A `MaxLengthCriteria` / `EosTokenCriteria` passed in `stopping_criteria` replaces generate's own (transformers'
    merge rule); the loop used to drop every such criterion, the caller's included, and ran to `max_new_tokens`."""
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    target, draft = pair
    rows, input_ids, attention_mask = left_padded_batch([5, 7])
    reference = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=20)
    stop_id = int(reference[1, 7 + 3])  # a token row 1 writes as its 4th new token
    limited = _ours(
        target,
        draft,
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=20,
        stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(max_length=7 + 6)]),
    )
    assert limited.shape == (2, 7 + 6)
    for criteria in ([MaxLengthCriteria(max_length=7 + 6)], [EosTokenCriteria(eos_token_id=stop_id)]):
        kwargs = dict(
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=20,
            stopping_criteria=StoppingCriteriaList(criteria),
        )
        expected = target.generate(input_ids, **kwargs)
        ours = _ours(target, draft, input_ids, **kwargs)
        assert torch.equal(ours, expected), (criteria, ours, expected)
        assert not torch.equal(expected[:, : reference.shape[1]], reference)  # the criterion stopped something


def _constraint_by_row():
    """Row 0 may only end (EOS), row 1 only write even ids, row 2 only ids 40..59: row 0 leaves the batch first."""
    allowed = {0: [EOS_TOKEN_ID], 1: list(range(2, VOCAB_SIZE, 2)), 2: list(range(40, 60))}
    return allowed, lambda batch_id, sent: allowed[batch_id]


def test_prefix_allowed_tokens_fn_sees_the_callers_row_index_after_a_row_finishes(pair):
    """Once a row finished, the loop used to number the remaining rows from 0 again: row 1 followed row 0's
    constraint (greedy output differed from transformers'; sampled rows left their allowed set)."""
    target, draft = pair
    allowed, constraint = _constraint_by_row()
    rows, input_ids, attention_mask = left_padded_batch([4, 6, 5])
    kwargs = dict(attention_mask=attention_mask, max_new_tokens=10, prefix_allowed_tokens_fn=constraint)
    expected = target.generate(input_ids, do_sample=False, **kwargs)
    assert torch.equal(_ours(target, draft, input_ids, **kwargs), expected)
    sampled = _ours(target, draft, input_ids, do_sample=True, **kwargs)[:, input_ids.shape[1] :]
    for row, tokens in enumerate(sampled.tolist()):
        ended = tokens[: tokens.index(EOS_TOKEN_ID) + 1] if EOS_TOKEN_ID in tokens else tokens
        assert set(ended) <= set(allowed[row]) | {EOS_TOKEN_ID}, (row, tokens)
    assert sampled[1:, 1:].ne(PAD_TOKEN_ID).all(), "rows 1 and 2 should go on after row 0 ends"


def test_a_batch_shaped_logits_processor_keeps_its_rows_after_a_row_finishes(pair):
    """A caller's processor holding one bias row per batch row failed with a bare size mismatch once a row left."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class BiasPerRow(LogitsProcessor):
        def __init__(self, bias):
            self.bias = bias  # (batch, vocab)

        def __call__(self, input_ids, scores):
            return scores + self.bias.to(scores.dtype)

    target, draft = pair
    rows, input_ids, attention_mask = left_padded_batch([4, 6, 5])
    bias = torch.zeros(3, VOCAB_SIZE)
    bias[0, EOS_TOKEN_ID] = 1e4  # row 0 ends at once
    bias[1, 2:VOCAB_SIZE:2] = 8.0
    bias[2, 40:60] = 8.0
    kwargs = dict(
        attention_mask=attention_mask,
        max_new_tokens=10,
        do_sample=False,
        logits_processor=LogitsProcessorList([BiasPerRow(bias)]),
    )
    expected = target.generate(input_ids, **kwargs)
    assert torch.equal(_ours(target, draft, input_ids, **kwargs), expected)
