"""Speculation that turns itself off above the draft's batch limit (``assistant_disable_by_batch_size``): lossless
calls only, the drafting left to the draft, the same law (the target's) on either side of the limit."""

import pytest
import torch
from tiny_models import VOCAB_SIZE, empirical, make_pair, prompt, tv_bound

from diversed_hf import ExactVerifier, StaticEnsembleVerifier, enable_diversed
from diversed_hf.generation import batch_rule
from diversed_hf.verifiers import BlockVerifier

KNOB = batch_rule.KNOB


@pytest.fixture
def pair():
    target, draft = make_pair("llama")
    setattr(draft.generation_config, KNOB, 2)  # as a draft measured to lose beyond two rows ships it
    draft.generation_config.num_assistant_tokens = 3
    return enable_diversed(target), draft


def _stats(target, draft, batch: int, **kwargs):
    return target.generate(
        prompt(5, batch=batch),
        assistant_model=draft,
        max_new_tokens=6,
        do_sample=False,
        return_dict_in_generate=True,
        **kwargs,
    )


def test_the_draft_speculates_up_to_its_limit_and_the_target_decodes_alone_beyond(pair):
    target, draft = pair
    within = _stats(target, draft, 2, verifier=ExactVerifier())
    assert within.speculation.disabled_by_batch_size is None and within.speculation.total_drafted > 0
    beyond = _stats(target, draft, 3, verifier=ExactVerifier())
    stats = beyond.speculation
    assert stats.disabled_by_batch_size == 2 and stats.total_drafted == 0 and stats.num_draft_tokens == 0
    assert stats.num_generated.tolist() == [6, 6, 6] and stats.num_rounds.tolist() == [6, 6, 6]
    assert stats.summary()["disabled_by_batch_size"] == 2 and stats.summary()["tokens_per_round"] == 1.0
    plain = target.generate(prompt(5, batch=3), max_new_tokens=6, do_sample=False)
    assert torch.equal(beyond.sequences, plain)  # transformers' own greedy decoding


def test_the_rule_stays_out_of_calls_that_choose_their_drafting_or_a_relaxed_law(pair):
    target, draft = pair
    for kwargs in (
        dict(verifier=ExactVerifier(), num_assistant_tokens=2),  # the call's own drafting
        dict(verifier=ExactVerifier(), assistant_tree_top_k=2, assistant_tree_size=4),
        dict(verifier=ExactVerifier(), output_target_weights=True),
        dict(verifier=StaticEnsembleVerifier(0.5)),  # a relaxed law is the call's choice
    ):
        stats = _stats(target, draft, 3, **kwargs).speculation
        assert stats.disabled_by_batch_size is None and stats.total_drafted > 0, kwargs
    stats = _stats(target, draft, 3, verifier=BlockVerifier(ExactVerifier())).speculation
    assert stats.disabled_by_batch_size == 2  # block verification of the exact rule: the target's law too
    # the keyword itself applies whatever else the call passes, and beats the draft's value
    stats = _stats(target, draft, 3, verifier=ExactVerifier(), num_assistant_tokens=2, **{KNOB: 2}).speculation
    assert stats.disabled_by_batch_size == 2
    assert _stats(target, draft, 3, verifier=ExactVerifier(), **{KNOB: 4}).speculation.disabled_by_batch_size is None


def test_num_return_sequences_counts_rows(pair):
    target, draft = pair
    out = target.generate(
        prompt(5, batch=2),
        assistant_model=draft,
        verifier=ExactVerifier(),
        max_new_tokens=4,
        do_sample=True,
        num_return_sequences=2,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[0] == 4 and out.speculation.disabled_by_batch_size == 2


def test_the_law_is_the_targets_on_both_sides_of_the_limit(pair):
    """First sampled token over many rows: beyond the limit (target alone) and within it (speculation), each
    within the TV bound of the target's distribution."""
    target, draft = pair
    ids = prompt(5, batch=1)
    with torch.no_grad():
        expected = torch.softmax(target(ids).logits[0, -1].double(), dim=-1)
    rows = 600
    for limit in (1, rows):  # 600 rows > 1: target alone; 600 rows <= 600: speculation
        generator = torch.Generator().manual_seed(limit)
        out = target.generate(
            ids.repeat(rows, 1),
            assistant_model=draft,
            verifier=ExactVerifier(),
            max_new_tokens=1,
            do_sample=True,
            top_k=0,
            generator=generator,
            return_dict_in_generate=True,
            **{KNOB: limit},
        )
        assert (out.speculation.disabled_by_batch_size is not None) == (limit == 1)
        seen = empirical(out.sequences[:, -1], VOCAB_SIZE)
        tv = 0.5 * float((seen - expected).abs().sum())
        assert tv < tv_bound(expected, rows), (limit, tv)


def test_seeded_calls_beyond_the_limit_repeat_and_leave_the_global_rng_alone(pair):
    target, draft = pair
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        out = target.generate(
            prompt(5, batch=3),
            assistant_model=draft,
            verifier=ExactVerifier(),
            max_new_tokens=5,
            do_sample=True,
            generator=torch.Generator().manual_seed(7),
        )
        runs.append((out, torch.rand(1)))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    torch.manual_seed(123)
    assert torch.equal(runs[0][1], torch.rand(1))  # the call drew nothing from the global generator


@pytest.mark.parametrize("value", [0, -1, 2.5, "8"])
def test_a_bad_limit_is_refused_by_name(pair, value):
    target, draft = pair
    with pytest.raises(ValueError, match=f"`{KNOB}` is {value!r}; use a batch size >= 1"):
        _stats(target, draft, 1, verifier=ExactVerifier(), **{KNOB: value})
    setattr(draft.generation_config, KNOB, value)
    with pytest.raises(ValueError, match=f"the draft's generation_config's `{KNOB}` is {value!r}"):
        _stats(target, draft, 1, verifier=ExactVerifier())


def test_the_limit_needs_speculative_decoding(pair):
    target, _ = pair
    with pytest.raises(ValueError, match=f"`{KNOB}` only applies to relaxed speculative decoding"):
        target.generate(prompt(5), max_new_tokens=2, **{KNOB: 4})


def test_a_saved_draft_keeps_its_limit(tmp_path):
    from tiny_models import make_model

    from diversed_hf import EagleDraft

    target = enable_diversed(make_model("llama", seed=1))
    draft = EagleDraft.for_target(target)
    setattr(draft.generation_config, KNOB, 2)
    draft.save_pretrained(tmp_path / "draft")
    loaded = EagleDraft.from_pretrained(tmp_path / "draft", target=target)
    assert getattr(loaded.generation_config, KNOB) == 2
    out = target.generate(
        prompt(5, batch=3), assistant_model=loaded, max_new_tokens=3, do_sample=False, return_dict_in_generate=True
    )
    assert out.speculation.disabled_by_batch_size == 2  # a feature draft's default is lossless: the rule applies


def test_rows_count_their_tokens_up_to_the_calls_end_of_sequence(pair):
    target, draft = pair
    ids = prompt(5, batch=3)
    first = target.generate(ids, max_new_tokens=1, do_sample=False)[:, -1]  # (3,) each row's first greedy token
    out = target.generate(
        ids,
        assistant_model=draft,
        verifier=ExactVerifier(),
        max_new_tokens=6,
        do_sample=False,
        eos_token_id=int(first[0]),
        return_dict_in_generate=True,
    )
    assert out.speculation.disabled_by_batch_size == 2 and out.speculation.num_generated[0] == 1
