"""A Gemma 4 assistant (it cross-attends to the target's keys and values) in the batched loop with every verifier
(diversed_hf.drafting.kv_sharing), on a tiny Gemma 4 pair."""

from __future__ import annotations

import pytest
import torch
from tiny_models import (
    VOCAB_SIZE,
    accepted_drafts,
    empirical,
    left_padded_batch,
    make_gemma4_pair,
    make_model,
    prompt,
    tv_bound,
)

from diversed_hf import DiversedHead, enable_diversed
from diversed_hf.drafting.kv_sharing import KvSharingDraft
from diversed_hf.verifiers import (
    BlockVerifier,
    ExactVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    ops,
)


@pytest.fixture(scope="module")
def pair():
    target, assistant = make_gemma4_pair()
    return enable_diversed(target), assistant


def test_greedy_exact_verification_is_the_targets_greedy_output(pair):
    target, assistant = pair
    input_ids = prompt(10, seed=1)  # longer than the sliding window (6)
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=16)
    out = target.generate(
        input_ids,
        do_sample=False,
        max_new_tokens=16,
        assistant_model=assistant,
        verifier=ExactVerifier(),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert out.speculation.num_draft_tokens == 3  # the assistant's generation_config
    assert int(out.speculation.num_drafted.sum()) > 0


@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(0.5), BlockVerifier(ExactVerifier())])
def test_batches_equal_single_runs(pair, verifier):
    target, assistant = pair
    rows, input_ids, attention_mask = left_padded_batch([5, 12, 9], seed=3)
    kwargs = dict(do_sample=False, max_new_tokens=10, assistant_model=assistant, verifier=verifier)
    singles = [target.generate(row[None], **kwargs) for row in rows]
    batch = target.generate(input_ids, attention_mask=attention_mask, **kwargs)
    for i, single in enumerate(singles):
        assert torch.equal(batch[i, -10:], single[0, -10:])


def _assistant_first_distribution(target, assistant, input_ids) -> torch.Tensor:  # (V,)
    """``q_1`` computed as transformers' generator computes it, with the target's own ``shared_kv_states``: the
    prompt's last token, the target's feature of the column before it, the keys and values of the columns before."""
    with torch.no_grad():
        out = target(input_ids[:, :-1], output_hidden_states=True, return_shared_kv_states=True)
        embeds = target.get_input_embeddings()(input_ids[:, -1:])
        drafted = assistant(
            inputs_embeds=torch.cat([embeds, out.hidden_states[-1][:, -1:]], dim=-1),
            position_ids=torch.tensor([[input_ids.shape[1] - 1]]),
            shared_kv_states=dict(out.shared_kv_states),
            use_cache=False,
        )
    return drafted.logits[0, -1].softmax(-1).double()


@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_first_token_follows_the_declared_law(pair, weight):
    """Lossless SD emits ``p_1``; a static ensemble ``w p_1 + (1 - w) q_1``, with ``q_1`` the assistant's
    distribution: the loop samples the draft from it (transformers' path takes its argmax)."""
    target, assistant = pair
    input_ids = prompt(9, seed=2)
    verifier = ExactVerifier() if weight == 1.0 else StaticEnsembleVerifier(weight)
    num_rows = 4000
    tokens = target.generate(
        input_ids.repeat(num_rows, 1),
        verifier=verifier,
        assistant_model=assistant,
        do_sample=True,
        top_k=0,  # p_1 itself: transformers' default top-k of 50 would cut this flat 64-token distribution
        max_new_tokens=3,
        generator=torch.Generator().manual_seed(0),
    )[:, input_ids.shape[1]]
    with torch.no_grad():
        p1 = target(input_ids).logits[0, -1].softmax(-1).double()
    q1 = _assistant_first_distribution(target, assistant, input_ids)
    declared = weight * p1 + (1 - weight) * q1
    observed = empirical(tokens, VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


@pytest.mark.parametrize(
    "relaxed", [StaticEnsembleVerifier(0.5), LenientVerifier(0.5), SpecCascadeVerifier("token_v2", 0.3)]
)
def test_relaxed_verifiers_accept_at_least_as_many_drafts(pair, relaxed):
    target, assistant = pair
    input_ids = prompt(8, seed=5).repeat(32, 1)
    exact = accepted_drafts(target, input_ids, ExactVerifier(), assistant_model=assistant)
    assert accepted_drafts(target, input_ids, relaxed, assistant_model=assistant) >= exact > 0


def test_heads_verify_the_assistants_drafts_and_train_on_its_rollouts(pair):
    from diversed_hf.training.rollout import sample_from_mixture

    target, assistant = pair
    draft = KvSharingDraft(assistant, target)
    head = DiversedHead.for_pair(target, draft)
    input_ids = prompt(8, seed=6)
    out = target.generate(
        input_ids,
        assistant_model=assistant,
        diversed_head=head,
        max_new_tokens=8,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert out.speculation.target_weights[0].numel() == out.sequences.shape[1] - input_ids.shape[1]
    _, input_ids, attention_mask = left_padded_batch([4, 7, 7], seed=1)
    input_ids[2], attention_mask[2] = input_ids[1], attention_mask[1]  # a repeated prompt: the prefill reads it once
    rollout = sample_from_mixture(target, draft, head, input_ids, attention_mask, max_new_tokens=5)
    assert rollout.completion_ids.shape == (3, 5)
    assert rollout.draft_hidden.shape[-1] == target.config.hidden_size


def test_rollout_draft_probabilities_are_the_loops_first_draft_step(pair):
    """The trainer's q_t at a rollout's first token is the assistant's distribution the loop drafts from."""
    from diversed_hf.training.rollout import sample_from_mixture

    target, assistant = pair
    draft = KvSharingDraft(assistant, target)
    head = DiversedHead.for_pair(target, draft)
    input_ids = prompt(9, seed=2)
    rollout = sample_from_mixture(target, draft, head, input_ids, torch.ones_like(input_ids), max_new_tokens=1)
    q1 = _assistant_first_distribution(target, assistant, input_ids)
    first = rollout.completion_ids[0, 0]
    assert torch.allclose(rollout.draft_token_probs[0, 0].double(), q1[first], atol=1e-5)


def test_an_assistant_without_its_gemma4_target_is_refused_before_any_forward(pair):
    _, assistant = pair
    other = enable_diversed(make_model("llama"))
    calls = []
    hook = other.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match="no layer that stores them"):
            other.generate(prompt(5), max_new_tokens=4, assistant_model=assistant, verifier=ExactVerifier())
    finally:
        hook.remove()
    assert not calls


def test_early_exit_is_refused_on_a_target_with_per_layer_inputs(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="hidden_size_per_layer_input"):
        target.generate(prompt(5), max_new_tokens=4, assistant_early_exit=2, verifier=ExactVerifier())


def test_a_one_token_prompt_drafts_once_the_target_has_keys_and_values(pair):
    target, assistant = pair
    input_ids = torch.tensor([[5]])
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=8)
    out = target.generate(
        input_ids,
        do_sample=False,
        max_new_tokens=8,
        assistant_model=assistant,
        verifier=ExactVerifier(),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected) and int(out.speculation.num_drafted.sum()) > 0


def test_a_head_of_another_pair_on_the_assistant_is_named_in_a_warning(pair, caplog):
    """A head records the pair it was trained for; on the Gemma 4 assistant, as on other drafters, another pair of
    the same widths runs with a warning naming both."""
    target, assistant = pair
    head = DiversedHead.for_pair(target, KvSharingDraft(assistant, target))
    head.config.draft_model_id = "org/another-assistant"
    assistant.config._name_or_path = "org/gemma-4-assistant"
    try:
        with caplog.at_level("WARNING", logger="diversed_hf"):
            target.generate(prompt(6, seed=2), assistant_model=assistant, diversed_head=head, max_new_tokens=4)
    finally:
        assistant.config._name_or_path = ""
    assert "'org/another-assistant' but is used with 'org/gemma-4-assistant'" in caplog.text
