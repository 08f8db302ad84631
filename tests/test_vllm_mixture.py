"""The vLLM plugin's verification round (``vllm_plugin.mixture``, torch only): each request by its own rule, heads
reading hidden states, checked against the project's verifiers in the main suite (no vLLM needed)."""

import torch
from tiny_models import empirical, tv_bound

from diversed_hf import DiversedHead
from diversed_hf.verifiers import HeadVerifier, StaticEnsembleVerifier
from diversed_hf.vllm_plugin.mixture import mixture_rejection_sample, mixture_verification

VOCAB, D_DRAFT, D_TARGET = 8, 4, 6


def hidden_head() -> HeadVerifier:
    torch.manual_seed(0)
    head = DiversedHead(draft_hidden_size=D_DRAFT, target_hidden_size=D_TARGET, features=["tv", "target_top1"])
    with torch.no_grad():
        head.net[-1].weight.normal_(std=3.0)  # w_t moves with the hidden states
    head.requires_grad_(False)
    return HeadVerifier(head)


def round_inputs(num_draft_tokens, seed=1):
    generator = torch.Generator().manual_seed(seed)
    total = sum(num_draft_tokens)
    draft_probs = torch.rand(total, VOCAB, generator=generator).pow(3).softmax(-1)  # (T, V)
    target_logits = 3 * torch.randn(total, VOCAB, generator=generator)  # (T, V)
    draft_hidden = torch.randn(total, D_DRAFT, generator=generator)  # (T, d_q)
    target_hidden = torch.randn(total, D_TARGET, generator=generator)  # (T, d_p)
    return draft_probs, target_logits, draft_hidden, target_hidden


def test_a_mixed_batch_verifies_each_request_by_its_own_rule():
    head, static, lossless = hidden_head(), StaticEnsembleVerifier(0.3), StaticEnsembleVerifier(1.0)
    counts = [2, 3, 0, 1, 3]
    verifiers = [head, static, lossless, lossless, head]
    draft_probs, target_logits, draft_hidden, target_hidden = round_inputs(counts)
    target_probs = target_logits.softmax(-1)
    verify_probs, residual = mixture_verification(
        verifiers, counts, draft_probs, target_probs, draft_hidden, target_hidden
    )  # (T, V), (T, V)
    start = 0
    for verifier, count in zip(verifiers, counts):
        rows = slice(start, start + count)
        hidden = {}
        if verifier.requires_hidden_states:
            hidden = dict(draft_hidden=draft_hidden[None, rows], target_hidden=target_hidden[None, rows])
        alone, _ = verifier.verification_probs(draft_probs[None, rows], target_probs[None, rows], **hidden)
        torch.testing.assert_close(verify_probs[rows], alone[0])
        torch.testing.assert_close(
            residual[rows], verifier.residual_probs(draft_probs[rows], target_probs[rows], alone[0])
        )
        start += count
    head_rows = torch.cat([torch.arange(0, 2), torch.arange(6, 9)])
    with torch.no_grad():
        weights = head.target_weights(
            draft_probs[None, head_rows],
            target_probs[None, head_rows],
            draft_hidden=draft_hidden[None, head_rows],
            target_hidden=target_hidden[None, head_rows],
        )
    assert float(weights.max() - weights.min()) > 0.2, "the head's weight must move with its inputs"


def test_greedy_rounds_equal_the_projects_verifier_per_request():
    head, static = hidden_head(), StaticEnsembleVerifier(0.2)
    counts, verifiers = [3, 3, 2], [head, static, head]
    draft_probs, target_logits, draft_hidden, target_hidden = round_inputs(counts, seed=4)
    draft_ids = draft_probs.argmax(-1)  # (T,) greedy drafting
    bonus = torch.tensor([[5], [6], [7]])
    output = mixture_rejection_sample(
        verifiers,
        draft_ids,
        counts,
        3,
        draft_probs,
        target_logits,
        bonus,
        torch.ones(3, dtype=torch.bool),
        torch.rand(8),
        torch.ones(3, VOCAB),
        draft_hidden=draft_hidden,
        target_hidden=target_hidden,
    )  # (3, 4)
    start = 0
    for row, (verifier, count) in enumerate(zip(verifiers, counts)):
        rows = slice(start, start + count)
        target_probs = torch.cat(
            [target_logits[rows].softmax(-1), torch.nn.functional.one_hot(bonus[row], VOCAB).float()]
        )
        result = verifier(
            draft_ids[None, rows],
            draft_probs[None, rows],
            target_probs[None],
            draft_hidden=draft_hidden[None, rows],
            target_hidden=torch.cat([target_hidden[rows], target_hidden[rows][:1]])[None],
            do_sample=False,
        )
        accepted = int(result.num_accepted[0])
        expected = draft_ids[rows][:accepted].tolist() + [int(result.next_tokens[0])]
        emitted = output[row][output[row] >= 0].tolist()
        assert emitted == expected, (row, emitted, expected)
        start += count


def test_sampled_tokens_follow_each_requests_mixture():
    """One drafted position per request, replicated: the token emitted there follows that request's ``nu``."""
    head, static, lossless = hidden_head(), StaticEnsembleVerifier(0.25), StaticEnsembleVerifier(1.0)
    rules = [head, static, lossless]
    draft_probs, target_logits, draft_hidden, target_hidden = round_inputs([1, 1, 1], seed=7)
    repeats = 20000
    verifiers = rules * repeats
    torch.manual_seed(0)
    q = draft_probs.repeat(repeats, 1)  # (3R, V)
    draft_ids = torch.multinomial(q, 1).squeeze(-1)  # (3R,) drafted from q
    output = mixture_rejection_sample(
        verifiers,
        draft_ids,
        [1] * len(verifiers),
        1,
        q,
        target_logits.repeat(repeats, 1),
        torch.zeros(len(verifiers), 1, dtype=torch.long),
        torch.zeros(len(verifiers), dtype=torch.bool),
        torch.rand(len(verifiers)),
        torch.empty(len(verifiers), VOCAB).exponential_(),
        draft_hidden=draft_hidden.repeat(repeats, 1),
        target_hidden=target_hidden.repeat(repeats, 1),
    )  # (3R, 2)
    first = output[:, 0].long().view(repeats, 3)  # (R, 3)
    target_probs = target_logits.softmax(-1)
    for index, verifier in enumerate(rules):
        hidden = dict(
            draft_hidden=draft_hidden[None, index : index + 1], target_hidden=target_hidden[None, index : index + 1]
        )
        expected, _ = verifier.verification_probs(
            draft_probs[None, index : index + 1],
            target_probs[None, index : index + 1],
            **(hidden if verifier.requires_hidden_states else {}),
        )
        expected = expected[0, 0].double()
        bound = tv_bound(expected, repeats)
        observed = empirical(first[:, index], VOCAB)
        assert 0.5 * float((observed - expected).abs().sum()) < bound, index
    static_nu = 0.25 * target_probs[1] + 0.75 * draft_probs[1]
    assert 0.5 * float((static_nu - target_probs[1]).abs().sum()) > 2 * tv_bound(static_nu.double(), repeats)
