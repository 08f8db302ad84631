"""transformers' model-free drafters in the batched loop: early exit (``assistant_early_exit``) and prompt lookup
(``prompt_lookup_num_tokens``) with every verifier (diversed_hf.drafting.drafters)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import (
    ARCHITECTURES,
    EOS_TOKEN_ID,
    VOCAB_SIZE,
    accepted_drafts,
    empirical,
    left_padded_batch,
    make_model,
    prompt,
    tv_bound,
)

from diversed_hf import DiversedHead, EarlyExitDraft, enable_diversed
from diversed_hf.drafting.drafters import lookup_continuations
from diversed_hf.verifiers import (
    BlockVerifier,
    ExactVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    ops,
)

LOOKUP = {"prompt_lookup_num_tokens": 3}
EARLY_EXIT = {"assistant_early_exit": 2, "num_assistant_tokens": 3}
DRAFTERS = {"lookup": LOOKUP, "early_exit": EARLY_EXIT}


def target_of(architecture: str = "llama"):
    return enable_diversed(make_model(architecture, num_layers=4))


def repeating_prompt(seed: int = 0) -> torch.Tensor:  # (1, 19): a phrase, again, and its start: lookup has matches
    phrase = prompt(8, seed=seed)
    return torch.cat([phrase, phrase, phrase[:, :3]], dim=1)


def test_lookup_continuations_follow_transformers_rule():
    tokens = torch.tensor([5, 6, 7, 8, 5, 6, 9, 5, 6])
    assert lookup_continuations(tokens, 2, 3).tolist() == [7, 8, 5]  # the first earlier "5 6"
    assert lookup_continuations(tokens, 2, 10).tolist() == [7, 8, 5, 6, 9, 5, 6]  # up to the row's end
    assert lookup_continuations(torch.tensor([1, 2, 3]), 2, 3).tolist() == []  # no n-gram recurs
    assert lookup_continuations(tokens, 2, 0).tolist() == []


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_greedy_exact_verification_is_the_targets_greedy_output(architecture, drafter):
    target = target_of(architecture)
    input_ids = repeating_prompt()
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=16)
    out = target.generate(
        input_ids,
        do_sample=False,
        max_new_tokens=16,
        verifier=ExactVerifier(),
        return_dict_in_generate=True,
        **DRAFTERS[drafter],
    )
    assert torch.equal(out.sequences, expected)
    assert int(out.speculation.num_drafted.sum()) > 0


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(1.0), BlockVerifier(ExactVerifier())])
def test_batches_equal_single_runs(drafter, verifier):
    target = target_of()
    rows, input_ids, attention_mask = left_padded_batch([5, 19, 11], seed=3)
    rows[1] = repeating_prompt(seed=4)[0]  # one row with lookup matches, the others with few
    input_ids[1] = rows[1]
    singles = [
        target.generate(row[None], do_sample=False, max_new_tokens=12, verifier=verifier, **DRAFTERS[drafter])
        for row in rows
    ]
    batch = target.generate(
        input_ids,
        attention_mask=attention_mask,
        do_sample=False,
        max_new_tokens=12,
        verifier=verifier,
        **DRAFTERS[drafter],
    )
    for i, single in enumerate(singles):
        assert torch.equal(batch[i, -12:], single[0, -12:])


def _first_tokens(target, verifier, input_ids, num_rows: int, **drafter) -> torch.Tensor:  # (num_rows,)
    return target.generate(
        input_ids.repeat(num_rows, 1),
        verifier=verifier,
        do_sample=True,
        max_new_tokens=3,
        generator=torch.Generator().manual_seed(0),
        **drafter,
    )[:, input_ids.shape[1]]


@pytest.mark.parametrize("weight", [1.0, 0.4])
@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_first_token_follows_the_declared_law(drafter, weight):
    """Lossless SD (``w = 1``) emits ``p_1``; a static ensemble ``w p_1 + (1 - w) q_1``, with ``q_1`` a point mass at
    the copied token (lookup) or the early-exit distribution."""
    target = target_of()
    input_ids = repeating_prompt(seed=2)
    verifier = ExactVerifier() if weight == 1.0 else StaticEnsembleVerifier(weight)
    num_rows = 4000
    tokens = _first_tokens(target, verifier, input_ids, num_rows, **DRAFTERS[drafter])
    with torch.no_grad():
        p1 = target(input_ids).logits[0, -1].softmax(-1).double()
        if drafter == "lookup":
            q1 = torch.zeros(VOCAB_SIZE, dtype=torch.float64)
            q1[int(lookup_continuations(input_ids[0], 2, 1)[0])] = 1.0
        else:
            q1 = EarlyExitDraft(target, 2)(input_ids).logits[0, -1].softmax(-1).double()
    declared = weight * p1 + (1 - weight) * q1
    observed = empirical(tokens, VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
@pytest.mark.parametrize(
    "relaxed", [StaticEnsembleVerifier(0.5), LenientVerifier(0.5), SpecCascadeVerifier("token_v2", 0.3)]
)
def test_relaxed_verifiers_accept_at_least_as_many_drafts(drafter, relaxed):
    target = target_of()
    input_ids = repeating_prompt(seed=5).repeat(32, 1)
    exact = accepted_drafts(target, input_ids, ExactVerifier(), **DRAFTERS[drafter])
    assert accepted_drafts(target, input_ids, relaxed, **DRAFTERS[drafter]) >= exact > 0


def test_heads_verify_early_exit_drafts_and_features_only_heads_verify_lookups():
    target = target_of()
    draft = EarlyExitDraft(target, 2)
    head = DiversedHead.for_pair(target, draft)
    out = target.generate(
        repeating_prompt(),
        diversed_head=head,
        max_new_tokens=8,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(0),
        **EARLY_EXIT,
    )
    assert out.speculation.target_weights[0].numel() == out.sequences.shape[1] - repeating_prompt().shape[1]
    features_only = DiversedHead.for_pair(target, draft, features=["tv", "draft_top1"], use_hidden_states=False)
    out = target.generate(
        repeating_prompt(), diversed_head=features_only, max_new_tokens=8, return_dict_in_generate=True, **LOOKUP
    )
    assert int(out.speculation.num_drafted.sum()) > 0


def test_a_head_on_the_targets_hidden_state_verifies_lookups_and_trains_on_lookup_rollouts(tmp_path):
    """Prompt lookup has no hidden state: its head reads the target's (draft_hidden_size 0) and distribution
    features; the trainer's rollouts propose the copied token as a point mass, or ``p_t`` itself without a match."""
    from test_training import head_params, trainer_for

    from diversed_hf.drafting.drafters import PromptLookup
    from diversed_hf.training.rollout import sample_from_mixture

    target = target_of()
    lookup = PromptLookup(3)
    head = DiversedHead.for_pair(target, lookup, features=["tv", "target_entropy", "target_top1"])
    assert head.config.draft_hidden_size == 0 and head.config.draft_model_id == "prompt-lookup:2"
    head.save_pretrained(tmp_path / "head")
    assert DiversedHead.from_pretrained(tmp_path / "head").config.draft_hidden_size == 0
    out = target.generate(
        repeating_prompt(),
        diversed_head=head,
        max_new_tokens=8,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(0),
        **LOOKUP,
    )
    assert int(out.speculation.num_drafted.sum()) > 0
    assert out.speculation.target_weights[0].numel() == 8
    input_ids = torch.cat([repeating_prompt(seed=1), prompt(19, seed=2)])  # a row with matches, one without many
    rollout = sample_from_mixture(target, lookup, head, input_ids, max_new_tokens=4)
    assert rollout.draft_hidden.shape == (2, 4, 0)
    copied = lookup_continuations(input_ids[0], 2, 1)
    assert float(rollout.draft_token_probs[0, 0]) == float(rollout.completion_ids[0, 0] == copied[0])  # a point mass
    trainer = trainer_for(tmp_path, target=target, draft=lookup, head=head, max_steps=1)
    before = head_params(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in head_params(trainer.model).items())
    with pytest.raises(ValueError, match="reads the target's hidden state alone"):
        target.generate(repeating_prompt(), diversed_head=head, max_new_tokens=4, **EARLY_EXIT)


def test_early_exit_drafts_in_training_rollouts():
    from diversed_hf.training.rollout import sample_from_mixture

    target = target_of()
    draft = EarlyExitDraft(target, 1)
    head = DiversedHead.for_pair(target, draft)
    _, input_ids, attention_mask = left_padded_batch([4, 7], seed=1)
    rollout = sample_from_mixture(target, draft, head, input_ids, attention_mask, max_new_tokens=5)
    assert rollout.completion_ids.shape == (2, 5)
    assert rollout.draft_hidden.shape[-1] == target.config.hidden_size
    assert sum(p.numel() for p in draft.parameters()) == 0  # the target's weights, not the draft's


def test_the_trainer_trains_a_head_for_an_early_exit_draft(tmp_path):
    from test_training import head_params, trainer_for

    from diversed_hf.training.checkpoint import model_fingerprint

    target = target_of()
    draft = EarlyExitDraft(target, 2)
    assert model_fingerprint(draft) != model_fingerprint(EarlyExitDraft(target, 1))  # a resume checks the exit layer
    trainer = trainer_for(tmp_path, target=target, draft=draft, max_steps=1)
    before = head_params(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in head_params(trainer.model).items())


def test_a_forbidden_copied_token_is_never_emitted():
    """The lookup would copy EOS, which ``min_new_tokens`` forbids: with ``w = 0`` (emit the draft) the copy is cut
    there, so EOS does not appear before the minimum."""
    target = target_of()
    phrase = prompt(6, seed=9)
    eos = torch.tensor([[EOS_TOKEN_ID]])
    input_ids = torch.cat([phrase, eos, phrase], dim=1)  # the phrase was followed by EOS once
    out = target.generate(
        input_ids,
        verifier=StaticEnsembleVerifier(0.0),
        do_sample=True,
        min_new_tokens=6,
        max_new_tokens=8,
        eos_token_id=EOS_TOKEN_ID,
        generator=torch.Generator().manual_seed(0),
        **LOOKUP,
    )
    assert EOS_TOKEN_ID not in out[0, input_ids.shape[1] : input_ids.shape[1] + 6].tolist()


def test_bad_drafter_arguments_are_refused_before_any_forward():
    target = target_of()
    draft = make_model("llama", num_layers=1, seed=3)
    hidden_head = DiversedHead.for_pair(target, draft)
    cases = [
        (dict(assistant_model=draft, verifier=ExactVerifier(), **LOOKUP), "pass one of them"),
        (dict(verifier=ExactVerifier(), assistant_early_exit=4), r"\[1, 3\]"),
        (dict(verifier=ExactVerifier(), assistant_early_exit=0), r"\[1, 3\]"),
        (dict(verifier=ExactVerifier(), prompt_lookup_num_tokens=0), "positive integer"),
        (dict(verifier=ExactVerifier(), num_assistant_tokens=4, **LOOKUP), "does not apply to prompt lookup"),
        (dict(diversed_head=hidden_head, **LOOKUP), "hidden states"),
        (dict(verifier=ExactVerifier(), num_assistant_tokens_schedule="heuristic", **LOOKUP), "without a confidence"),
        (dict(verifier=ExactVerifier()), "needs a drafter"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            target.generate(repeating_prompt(), max_new_tokens=4, **kwargs)
