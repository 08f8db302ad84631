"""DFlash block drafts (``speculation_type="dflash"``) in the batched loop with every verifier (diversed_hf.drafting.dflash),
on a tiny Llama target and a tiny ``MuseGlimmerAssistantModel`` that reads its layers 1 and 3."""

from __future__ import annotations

import pytest
import torch
from tiny_models import (
    VOCAB_SIZE,
    accepted_drafts,
    empirical,
    left_padded_batch,
    make_dflash_draft,
    make_model,
    prompt,
    tv_bound,
)

from diversed_hf import DiversedHead, enable_diversed
from diversed_hf.drafting.dflash import DFlashDraft
from diversed_hf.verifiers import (
    BlockVerifier,
    ExactVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    ops,
)

DFLASH = {"speculation_type": "dflash"}


@pytest.fixture(scope="module")
def pair():
    target = enable_diversed(make_model("llama", num_layers=4))
    return target, make_dflash_draft(target)


@pytest.mark.parametrize("num_tokens", [None, 2])  # the block's block_size - 1 = 3 a round; fewer when asked
def test_greedy_exact_verification_is_the_targets_greedy_output(pair, num_tokens):
    target, dflash = pair
    input_ids = prompt(10, seed=1)
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=16)
    out = target.generate(
        input_ids,
        do_sample=False,
        max_new_tokens=16,
        assistant_model=dflash,
        num_assistant_tokens=num_tokens,
        verifier=ExactVerifier(),
        return_dict_in_generate=True,
        **DFLASH,
    )
    assert torch.equal(out.sequences, expected)
    assert out.speculation.num_draft_tokens == (num_tokens or 3)
    assert int(out.speculation.num_drafted.sum()) > 0


@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(0.5), BlockVerifier(ExactVerifier())])
def test_batches_equal_single_runs(pair, verifier):
    target, dflash = pair
    rows, input_ids, attention_mask = left_padded_batch([5, 12, 9], seed=3)
    kwargs = dict(do_sample=False, max_new_tokens=10, assistant_model=dflash, verifier=verifier, **DFLASH)
    singles = [target.generate(row[None], **kwargs) for row in rows]
    batch = target.generate(input_ids, attention_mask=attention_mask, **kwargs)
    for i, single in enumerate(singles):
        assert torch.equal(batch[i, -10:], single[0, -10:])


def _block_distributions(target, dflash, input_ids) -> torch.Tensor:  # (block - 1, V)
    """The block's distributions after ``input_ids``, from transformers' own ``DFlashTokenCandidateGenerator``: the
    context is the prompt but its last token, which anchors the block."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    generator = DFlashTokenCandidateGenerator(
        dflash, target.get_input_embeddings(), target.get_output_embeddings(), GenerationConfig(max_length=512)
    )
    with torch.no_grad():
        out = target(input_ids[:, :-1], output_hidden_states=True)
        model_kwargs = {
            "position_ids": torch.arange(input_ids.shape[1])[None],
            "attention_mask": torch.ones_like(input_ids),
        }
        _, logits = generator.get_candidates(
            input_ids, model_kwargs=model_kwargs, model_outputs=out, is_first_iteration=False, n_last_matches=0
        )
    return logits[0].softmax(-1).double()


@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_first_token_follows_the_declared_law(pair, weight):
    """Lossless SD emits ``p_1``; a static ensemble ``w p_1 + (1 - w) q_1``, with ``q_1`` the block's first
    position's distribution, as transformers' own DFlash generator computes it."""
    target, dflash = pair
    input_ids = prompt(9, seed=2)
    verifier = ExactVerifier() if weight == 1.0 else StaticEnsembleVerifier(weight)
    num_rows = 4000
    tokens = target.generate(
        input_ids.repeat(num_rows, 1),
        verifier=verifier,
        assistant_model=dflash,
        do_sample=True,
        max_new_tokens=3,
        generator=torch.Generator().manual_seed(0),
        **DFLASH,
    )[:, input_ids.shape[1]]
    with torch.no_grad():
        p1 = target(input_ids).logits[0, -1].softmax(-1).double()
    q1 = _block_distributions(target, dflash, input_ids)[0]
    declared = weight * p1 + (1 - weight) * q1
    observed = empirical(tokens, VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


@pytest.mark.parametrize(
    "relaxed", [StaticEnsembleVerifier(0.5), LenientVerifier(0.5), SpecCascadeVerifier("token_v2", 0.3)]
)
def test_relaxed_verifiers_accept_at_least_as_many_drafts(pair, relaxed):
    target, dflash = pair
    input_ids = prompt(8, seed=5).repeat(32, 1)
    exact = accepted_drafts(target, input_ids, ExactVerifier(), assistant_model=dflash, **DFLASH)
    assert accepted_drafts(target, input_ids, relaxed, assistant_model=dflash, **DFLASH) >= exact > 0


def test_heads_verify_block_drafts_and_rollouts_refuse_them(pair):
    from diversed_hf.training.rollout import sample_from_mixture

    target, dflash = pair
    draft = DFlashDraft(dflash, target)
    head = DiversedHead.for_pair(target, draft)
    input_ids = prompt(8, seed=6)
    out = target.generate(
        input_ids,
        assistant_model=dflash,
        diversed_head=head,
        max_new_tokens=8,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(0),
        **DFLASH,
    )
    assert out.speculation.target_weights[0].numel() == out.sequences.shape[1] - input_ids.shape[1]
    with pytest.raises(ValueError, match="block draft"):
        sample_from_mixture(target, draft, head, input_ids, max_new_tokens=2)


def test_dflash_is_refused_before_any_forward_where_it_cannot_run(pair):
    target, dflash = pair
    other = enable_diversed(make_model("llama", num_layers=2))  # the draft reads layer 3
    calls = []
    hook = other.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"reads the target's layers \[1, 3\].*has 2"):
            other.generate(prompt(5), max_new_tokens=4, assistant_model=dflash, verifier=ExactVerifier(), **DFLASH)
        with pytest.raises(ValueError, match="drafts with a DFlash `assistant_model`"):
            other.generate(prompt(5), max_new_tokens=4, verifier=ExactVerifier(), **DFLASH)
        with pytest.raises(
            ValueError, match=r"`num_assistant_tokens=5`: this block draft \(DFlashDraft\) drafts at most 3"
        ):
            target.generate(
                prompt(5),
                max_new_tokens=4,
                assistant_model=dflash,
                num_assistant_tokens=5,
                verifier=ExactVerifier(),
                **DFLASH,
            )
        with pytest.raises(ValueError, match=r"DFlash block draft .* pass `speculation_type=\"dflash\"`"):
            target.generate(prompt(5), max_new_tokens=4, assistant_model=dflash, verifier=ExactVerifier())
        with pytest.raises(ValueError, match=r"`speculation_type='medusa'`"):
            other.generate(prompt(5), max_new_tokens=4, verifier=ExactVerifier(), speculation_type="medusa")
    finally:
        hook.remove()
    assert not calls


def test_a_one_token_prompt_drafts_from_an_empty_context(pair):
    target, dflash = pair
    input_ids = torch.tensor([[5]])
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=8)
    out = target.generate(
        input_ids, do_sample=False, max_new_tokens=8, assistant_model=dflash, verifier=ExactVerifier(), **DFLASH
    )
    assert torch.equal(out, expected)
