"""`generate` features transformers users expect: output_scores / output_logits, num_return_sequences > 1,
right-padded batches, and the cache options that are refused."""

import copy

import pytest
import torch
from tiny_models import PAD_TOKEN_ID, VOCAB_SIZE, left_padded_batch, make_pair, prompt
from transformers import DynamicCache

from diversed_hf import ExactVerifier, StaticEnsembleVerifier, enable_diversed


@pytest.fixture(scope="module")
def pair():
    target, draft = make_pair("llama", noise=0.3)
    draft.generation_config.num_assistant_tokens = 4  # transformers reads these from the assistant
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    return enable_diversed(target), draft


def _right_padded(rows):
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), PAD_TOKEN_ID)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)], attention_mask[i, : len(row)] = row, 1
    return input_ids, attention_mask


# output_scores / output_logits --------------------------------------------------------------------------------


@pytest.mark.parametrize("processors", [{}, dict(repetition_penalty=1.5)], ids=["raw", "repetition_penalty"])
def test_scores_and_logits_equal_transformers_assisted_decoding(pair, processors):
    target, draft = pair
    input_ids = prompt(6, seed=2)
    common = dict(
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=20,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        **processors,
    )
    theirs = target.generate(input_ids, num_assistant_tokens=4, **common)
    ours = target.generate(input_ids, verifier=ExactVerifier(), num_assistant_tokens=4, **common)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(ours.scores) == len(theirs.scores) == len(ours.logits) == len(theirs.logits) == 20
    for mine, reference in [*zip(ours.scores, theirs.scores), *zip(ours.logits, theirs.logits)]:
        assert mine.shape == reference.shape == (1, VOCAB_SIZE)
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-5)
    assert ours.speculation.total_accepted > 0
    if processors:
        assert any(not torch.equal(score, logit) for score, logit in zip(ours.scores, ours.logits)), (
            "scores are the processed logits"
        )


def test_scores_are_the_targets_at_each_emitted_token_for_relaxed_verifiers_in_a_batch(pair):
    """For a relaxed verifier the scores are still the target's (processed) logits at each emitted position; rows that
    ended early hold NaN after their last token."""
    target, draft = pair
    rows, input_ids, attention_mask = left_padded_batch([3, 8, 5])
    width = input_ids.shape[1]

    def run(eos_token_id):
        return target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            verifier=StaticEnsembleVerifier(0.3),
            do_sample=True,
            temperature=0.7,
            top_k=0,
            max_new_tokens=10,
            num_assistant_tokens=3,
            eos_token_id=eos_token_id,
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
            generator=torch.Generator().manual_seed(0),
        )

    stop = int(run(1).sequences[0, width + 2])  # row 0's third token ends it (draws before it are unchanged)
    output = run([1, stop])
    num_new = len(output.scores)
    assert num_new == output.sequences.shape[1] - width == 10
    ended = output.speculation.num_generated < num_new
    assert bool(ended[0]), "row 0 ends early"
    for b, row in enumerate(rows):
        generated = int(output.speculation.num_generated[b])
        sequence = torch.cat([row, output.sequences[b, width : width + generated]])[None]
        with torch.no_grad():
            logits = target(sequence).logits[0, len(row) - 1 : -1]  # (generated, V): the target at each new token
        for t in range(generated):
            torch.testing.assert_close(output.logits[t][b], logits[t], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(output.scores[t][b], logits[t] / 0.7, atol=1e-4, rtol=1e-4)  # temperature
        for t in range(generated, num_new):
            assert output.scores[t][b].isnan().all() and output.logits[t][b].isnan().all()


def test_scores_only_with_return_dict(pair):
    target, draft = pair
    out = target.generate(
        prompt(4),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=5,
        output_scores=True,
        return_dict_in_generate=True,
    )
    assert len(out.scores) == 5 and out.logits is None
    plain = target.generate(
        prompt(4),
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=5,
        output_scores=True,
    )
    assert torch.equal(plain, out.sequences)


# num_return_sequences ------------------------------------------------------------------------------------------


def test_num_return_sequences_repeats_rows_and_samples_each(pair):
    """Rows are repeated as transformers repeats them for sampling (`repeat_interleave`); each is its own sample."""
    target, draft = pair
    _, input_ids, attention_mask = left_padded_batch([4, 7])
    common = dict(attention_mask=attention_mask, do_sample=True, max_new_tokens=12)
    ours = target.generate(
        input_ids,
        assistant_model=draft,
        verifier=StaticEnsembleVerifier(0.5),
        num_return_sequences=3,
        generator=torch.Generator().manual_seed(3),
        **common,
    )
    theirs = target.generate(input_ids, num_return_sequences=3, **common)  # transformers' sampling: the same layout
    assert ours.shape == theirs.shape == (6, input_ids.shape[1] + 12)
    assert torch.equal(ours[:, : input_ids.shape[1]], input_ids.repeat_interleave(3, dim=0))
    for group in ours.split(3):
        assert len({tuple(r.tolist()) for r in group}) == 3, "each repeated row is sampled independently"
    repeated = target.generate(
        input_ids.repeat_interleave(3, dim=0),
        assistant_model=draft,
        verifier=StaticEnsembleVerifier(0.5),
        generator=torch.Generator().manual_seed(3),
        **(common | dict(attention_mask=attention_mask.repeat_interleave(3, dim=0))),
    )
    assert torch.equal(ours, repeated)


def test_num_return_sequences_under_greedy_is_refused_as_transformers_does(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="Greedy methods .* do not support `num_return_sequences`"):
        target.generate(prompt(4), do_sample=False, num_return_sequences=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="Greedy methods .* do not support `num_return_sequences`"):
        target.generate(
            prompt(4),
            assistant_model=draft,
            verifier=ExactVerifier(),
            do_sample=False,
            num_return_sequences=2,
            max_new_tokens=4,
        )


# Right padding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(0.4)], ids=["exact", "static"])
def test_right_padded_batches_run_as_left_padded_ones(pair, verifier):
    """Re-laid left-padded inside the call: the new tokens are those of the left-padded batch (transformers' output
    for these prompts under ExactVerifier); the prompt part keeps the caller's right-padded layout."""
    target, draft = pair
    rows, left_ids, left_mask = left_padded_batch([3, 9, 5, 12])
    right_ids, right_mask = _right_padded(rows)
    common = dict(assistant_model=draft, verifier=verifier, do_sample=False, max_new_tokens=12, num_assistant_tokens=3)
    from_right = target.generate(right_ids, attention_mask=right_mask, **common)
    from_left = target.generate(left_ids, attention_mask=left_mask, **common)
    width = right_ids.shape[1]
    assert torch.equal(from_right[:, :width], right_ids)
    assert torch.equal(from_right[:, width:], from_left[:, width:])
    if isinstance(verifier, ExactVerifier):
        expected = target.generate(left_ids, attention_mask=left_mask, do_sample=False, max_new_tokens=12)
        assert torch.equal(from_right[:, width:], expected[:, width:])


# Cache options -------------------------------------------------------------------------------------------------


def test_cache_options_are_refused_with_the_fix(pair):
    target, draft = pair
    kwargs = dict(assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"`cache=` cannot be combined.*Remove `cache`"):
        target.generate(prompt(4), cache=DynamicCache(), **kwargs)
    configured = copy.deepcopy(target)
    configured.generation_config.cache_implementation = "static"  # set on the model, not passed to generate
    with pytest.raises(ValueError, match=r"`cache_implementation='static'` cannot be combined"):
        configured.generate(prompt(4), **kwargs)
    dynamic = target.generate(prompt(4), cache_implementation="dynamic", use_cache=True, **kwargs)
    assert torch.equal(dynamic, target.generate(prompt(4), do_sample=False, max_new_tokens=4))
