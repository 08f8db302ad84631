"""Multi-token prediction (``use_mtp=True``) in the batched loop with every verifier (diversed_hf.drafting.mtp), on a tiny
Mellum checkpoint that ships one sliding-window MTP layer."""

from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB_SIZE, accepted_drafts, empirical, left_padded_batch, make_mtp_model, prompt, tv_bound

from diversed_hf import DiversedHead, MtpDraft, enable_diversed
from diversed_hf.verifiers import (
    BlockVerifier,
    ExactVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    ops,
)


def _transformers_loads_mellum_mtp() -> bool:
    from transformers import MellumForCausalLM

    return bool(MellumForCausalLM._keys_to_ignore_on_load_unexpected)


pytestmark = pytest.mark.skipif(
    not _transformers_loads_mellum_mtp(), reason="this transformers release does not load Mellum's MTP layer"
)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return enable_diversed(make_mtp_model(tmp_path_factory.mktemp("mellum-mtp")))


@pytest.mark.parametrize("num_tokens", [None, 3])  # the checkpoint's one token a round; three, reusing the layer
def test_greedy_exact_verification_is_the_targets_greedy_output(target, num_tokens):
    input_ids = prompt(10, seed=1)  # longer than the MTP layer's sliding window (6) once it generates
    expected = target.generate(input_ids, do_sample=False, max_new_tokens=16)
    assert torch.equal(target.generate(input_ids, do_sample=False, max_new_tokens=16, use_mtp=True), expected)
    out = target.generate(
        input_ids,
        do_sample=False,
        max_new_tokens=16,
        use_mtp=True,
        num_assistant_tokens=num_tokens,
        verifier=ExactVerifier(),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert out.speculation.num_draft_tokens == (num_tokens or 1)  # transformers' default: num_mtp_layers a round


@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(0.5), BlockVerifier(ExactVerifier())])
def test_batches_equal_single_runs(target, verifier):
    rows, input_ids, attention_mask = left_padded_batch([5, 12, 9], seed=3)
    kwargs = dict(do_sample=False, max_new_tokens=10, use_mtp=True, num_assistant_tokens=2, verifier=verifier)
    singles = [target.generate(row[None], **kwargs) for row in rows]
    batch = target.generate(input_ids, attention_mask=attention_mask, **kwargs)
    for i, single in enumerate(singles):
        assert torch.equal(batch[i, -10:], single[0, -10:])


@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_first_token_follows_the_declared_law(target, weight):
    """Lossless SD emits ``p_1``; a static ensemble ``w p_1 + (1 - w) q_1``, with ``q_1`` the MTP layer's
    distribution after the target's pass over the prompt."""
    input_ids = prompt(9, seed=2)
    verifier = ExactVerifier() if weight == 1.0 else StaticEnsembleVerifier(weight)
    num_rows = 4000
    tokens = target.generate(
        input_ids.repeat(num_rows, 1),
        verifier=verifier,
        use_mtp=True,
        do_sample=True,
        max_new_tokens=3,
        generator=torch.Generator().manual_seed(0),
    )[:, input_ids.shape[1]]
    with torch.no_grad():
        out = target(input_ids[:, :-1], output_hidden_states=True)
        p1 = target(input_ids).logits[0, -1].softmax(-1).double()
        draft = MtpDraft(target, target_mtp(target))
        features = torch.cat([torch.zeros_like(out.hidden_states[-1][:, :1]), out.hidden_states[-1]], dim=1)
        q1 = draft(input_ids, target_hidden=features).logits[0, -1].softmax(-1).double()
    declared = weight * p1 + (1 - weight) * q1
    observed = empirical(tokens, VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


def target_mtp(target):
    from diversed_hf import compat

    return compat.load_mtp_model(target)


@pytest.mark.parametrize(
    "relaxed", [StaticEnsembleVerifier(0.5), LenientVerifier(0.5), SpecCascadeVerifier("token_v2", 0.3)]
)
def test_relaxed_verifiers_accept_at_least_as_many_drafts(target, relaxed):
    input_ids = prompt(8, seed=5).repeat(32, 1)
    exact = accepted_drafts(target, input_ids, ExactVerifier(), use_mtp=True, num_assistant_tokens=2)
    assert accepted_drafts(target, input_ids, relaxed, use_mtp=True, num_assistant_tokens=2) >= exact > 0


def test_heads_verify_mtp_drafts_and_train_on_its_rollouts(target):
    from diversed_hf.training.rollout import sample_from_mixture

    draft = MtpDraft(target)
    head = DiversedHead.for_pair(target, draft)
    input_ids = prompt(8, seed=6)
    out = target.generate(
        input_ids,
        diversed_head=head,
        use_mtp=True,
        max_new_tokens=8,
        output_target_weights=True,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert out.speculation.target_weights[0].numel() == out.sequences.shape[1] - input_ids.shape[1]
    _, input_ids, attention_mask = left_padded_batch([4, 7], seed=1)
    rollout = sample_from_mixture(target, draft, head, input_ids, attention_mask, max_new_tokens=5)
    assert rollout.completion_ids.shape == (2, 5)
    assert rollout.draft_hidden.shape[-1] == target.config.hidden_size


def test_mtp_is_refused_before_any_forward_where_it_cannot_run(target, tmp_path):
    from tiny_models import make_model

    plain = enable_diversed(make_model("llama"))
    calls = []
    hook = plain.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match="`use_mtp=True` needs a checkpoint.*num_mtp_layers=None"):
            plain.generate(prompt(5), max_new_tokens=4, use_mtp=True, verifier=ExactVerifier())
    finally:
        hook.remove()
    assert not calls
    draft = make_model("llama", seed=3)
    with pytest.raises(ValueError, match="pass one of them"):
        target.generate(prompt(5), max_new_tokens=4, use_mtp=True, assistant_model=draft, verifier=ExactVerifier())
    with pytest.raises(ValueError, match="drafts only for the checkpoint"):
        MtpDraft(target, target_mtp(target)).attach_target(plain)
