"""Verifier math: hand-made cases, then statistical tests of the emitted distribution."""

import pytest
import torch
from tiny_models import empirical, tv_bound

from diversed_hf.heads.head import DiversedHead
from diversed_hf.verifiers import (
    CASCADE_RULES,
    BlockVerifier,
    ExactVerifier,
    HeadVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    ops,
    theory,
)

NEG = -1e4


def one_hot_probs(ids, vocab):
    logits = torch.full((*ids.shape, vocab), NEG)
    logits.scatter_(-1, ids.unsqueeze(-1), 10.0)
    return logits.softmax(-1)


def test_exact_accepts_agreeing_drafts_and_takes_bonus_from_target():
    draft_ids = torch.tensor([[2, 3, 1]])
    draft_probs = one_hot_probs(draft_ids, 5)
    target_probs = one_hot_probs(torch.tensor([[2, 3, 1, 4]]), 5)
    result = ExactVerifier()(draft_ids, draft_probs, target_probs, generator=torch.Generator().manual_seed(0))
    assert result.num_accepted.tolist() == [3]
    assert result.next_tokens.tolist() == [4]
    greedy = ExactVerifier()(draft_ids, draft_probs, target_probs, do_sample=False)
    assert greedy.num_accepted.tolist() == [3] and greedy.next_tokens.tolist() == [4]


def test_exact_rejects_at_first_disagreement_and_recovers_from_residual():
    draft_ids = torch.tensor([[2, 3, 1], [2, 0, 1]])
    draft_probs = one_hot_probs(draft_ids, 5)
    target_probs = one_hot_probs(torch.tensor([[2, 4, 1, 4], [2, 0, 3, 0]]), 5)
    result = ExactVerifier()(draft_ids, draft_probs, target_probs, generator=torch.Generator().manual_seed(0))
    assert result.num_accepted.tolist() == [1, 2]
    assert result.next_tokens.tolist() == [4, 3]
    assert torch.allclose(result.position_acceptance[0], torch.tensor([1.0, 0.0, 1.0]), atol=1e-4)


def test_zero_weight_accepts_everything_and_full_weight_is_exact():
    generator = torch.Generator().manual_seed(0)
    draft_probs = torch.rand(4, 3, 7, generator=generator).softmax(-1)
    target_probs = torch.rand(4, 4, 7, generator=generator).softmax(-1)
    draft_ids = torch.multinomial(draft_probs.flatten(0, 1), 1, generator=generator).view(4, 3)
    result = StaticEnsembleVerifier(0.0)(draft_ids, draft_probs, target_probs, generator=generator)
    assert result.num_accepted.tolist() == [3, 3, 3, 3]
    assert torch.allclose(result.position_acceptance, torch.ones(4, 3))
    exact = ExactVerifier().verification_probs(draft_probs, target_probs[:, :3])[0]
    static = StaticEnsembleVerifier(1.0).verification_probs(draft_probs, target_probs[:, :3])[0]
    assert torch.equal(exact, static)


def test_acceptance_probability_is_one_minus_w_tv():
    generator = torch.Generator().manual_seed(1)
    draft_probs = torch.rand(3, 2, 9, generator=generator).softmax(-1)
    target_probs = torch.rand(3, 3, 9, generator=generator).softmax(-1)
    draft_ids = torch.zeros(3, 2, dtype=torch.long)
    for weight in (0.0, 0.3, 1.0):
        result = StaticEnsembleVerifier(weight)(draft_ids, draft_probs, target_probs, generator=generator)
        expected = 1 - weight * ops.total_variation(target_probs[:, :2], draft_probs)
        assert torch.allclose(result.position_acceptance, expected, atol=1e-6)


def test_logits_mixing_is_the_geometric_pool():
    generator = torch.Generator().manual_seed(2)
    draft_logits, target_logits = torch.randn(2, 3, 11, generator=generator), torch.randn(2, 3, 11, generator=generator)
    weight = torch.rand(2, 3, generator=generator)
    pooled = ops.geometric_pool_probs(draft_logits.softmax(-1), target_logits.softmax(-1), weight)
    expected = (weight[..., None] * target_logits + (1 - weight[..., None]) * draft_logits).softmax(-1)
    assert torch.allclose(pooled, expected, atol=1e-6)


def _fixed_round(num_rows, num_draft, vocab, seed, temperature=1.0, top_k=None):
    """Distributions fixed per position (the same in every row) and drafts sampled from them."""
    generator = torch.Generator().manual_seed(seed)
    draft_logits = torch.randn(num_draft, vocab, generator=generator) * 1.5 / temperature
    target_logits = torch.randn(num_draft + 1, vocab, generator=generator) * 1.5 / temperature
    if top_k is not None:
        for logits in (draft_logits, target_logits):
            kth = logits.topk(top_k, dim=-1).values[..., -1:]
            logits.masked_fill_(logits < kth, float("-inf"))
    draft_probs = draft_logits.softmax(-1).expand(num_rows, -1, -1).contiguous()
    target_probs = target_logits.softmax(-1).expand(num_rows, -1, -1).contiguous()
    draft_ids = torch.multinomial(draft_probs.flatten(0, 1), 1, generator=generator).view(num_rows, num_draft)
    return draft_ids, draft_probs, target_probs


def _random_head(d_draft=6, d_target=5, seed=0):
    head = DiversedHead(draft_hidden_size=d_draft, target_hidden_size=d_target, architecture="mlp", mlp_hidden_size=8)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return head


VERIFIERS = [
    ExactVerifier(),
    StaticEnsembleVerifier(0.0),
    StaticEnsembleVerifier(0.3),
    StaticEnsembleVerifier(1.0),
    StaticEnsembleVerifier(0.3, mixing="logits"),
    LenientVerifier(0.5),
    *[SpecCascadeVerifier(rule, alpha) for rule in CASCADE_RULES for alpha in (0.3,)],
    "head",
]


@pytest.mark.parametrize("verifier", VERIFIERS, ids=lambda v: v if isinstance(v, str) else repr(v))
@pytest.mark.parametrize("setting", [dict(), dict(temperature=0.6, top_k=5)], ids=["t1", "t0.6-topk5"])
def test_emitted_tokens_follow_the_declared_distribution(verifier, setting):
    num_rows, num_draft, vocab = 40_000, 3, 8
    draft_ids, draft_probs, target_probs = _fixed_round(num_rows, num_draft, vocab, seed=3, **setting)
    kwargs = {}
    if verifier == "head":
        verifier = HeadVerifier(_random_head())
        generator = torch.Generator().manual_seed(4)
        # Two kinds of context: w differs between rows and between positions.
        draft_hidden = torch.randn(2, num_draft, 6, generator=generator).repeat(num_rows // 2, 1, 1)
        target_hidden = torch.randn(2, num_draft + 1, 5, generator=generator).repeat(num_rows // 2, 1, 1)
        kwargs = dict(draft_hidden=draft_hidden, target_hidden=target_hidden)
    result = verifier(draft_ids, draft_probs, target_probs, generator=torch.Generator().manual_seed(5), **kwargs)
    declared, weight = verifier.verification_probs(
        draft_probs,
        target_probs[:, :num_draft],
        draft_hidden=kwargs.get("draft_hidden"),
        target_hidden=None if not kwargs else kwargs["target_hidden"][:, :num_draft],
    )  # (rows, N, vocab)
    if weight is not None and isinstance(verifier, HeadVerifier):
        assert weight[0].std() > 0.01 and (weight[0] - weight[1]).abs().max() > 0.01, "head weights should vary"
    emitted = torch.cat([draft_ids, torch.zeros(num_rows, 1, dtype=torch.long)], dim=1)
    emitted.scatter_(1, result.num_accepted[:, None], result.next_tokens[:, None])
    for position in range(num_draft + 1):
        reached = result.num_accepted >= position  # rows that emitted a token at this position
        groups = [reached & (torch.arange(num_rows) % 2 == g) for g in range(2)] if kwargs else [reached]
        for rows in groups:
            if rows.sum() < 2000:
                continue
            if position < num_draft:
                expected = declared[rows.nonzero()[0, 0], position]
            else:  # bonus token: from the target
                expected = target_probs[0, num_draft]
            observed = empirical(emitted[rows, position], vocab)
            tv = ops.total_variation(observed, expected.double())
            assert tv < tv_bound(expected, int(rows.sum())), (position, float(tv))
    # The declared acceptance probability matches the observed one at the first position.
    observed_rate = (result.num_accepted >= 1).double().mean()
    assert abs(observed_rate - result.position_acceptance[:, 0].double().mean()) < 0.02


def test_seeded_verification_is_reproducible():
    draft_ids, draft_probs, target_probs = _fixed_round(64, 4, 10, seed=7)
    first = StaticEnsembleVerifier(0.4)(
        draft_ids, draft_probs, target_probs, generator=torch.Generator().manual_seed(9)
    )
    second = StaticEnsembleVerifier(0.4)(
        draft_ids, draft_probs, target_probs, generator=torch.Generator().manual_seed(9)
    )
    assert torch.equal(first.num_accepted, second.num_accepted)
    assert torch.equal(first.next_tokens, second.next_tokens)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: StaticEnsembleVerifier(1.5), "target_weight"),
        (lambda: StaticEnsembleVerifier(-0.1), "target_weight"),
        (lambda: LenientVerifier(0.0), "lenience"),
        (lambda: LenientVerifier(2.0), "lenience"),
        (lambda: SpecCascadeVerifier("bogus", 0.1), "rule"),
        (lambda: SpecCascadeVerifier("opt", 1.5), "alpha"),
        (lambda: StaticEnsembleVerifier(0.5, mixing="geometric"), "mixing"),
    ],
)
def test_bad_verifier_arguments_raise_naming_the_argument(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_head_verifier_requires_a_head():
    with pytest.raises(TypeError, match="DiversedHead"):
        HeadVerifier(object())


def test_sample_never_draws_zero_mass_tokens_and_matches_the_law():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.8, 0.0], [3.0, 0.0, 0.0, 0.0, 1.0]])  # second row unnormalised
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([ops.sample(probs, generator) for _ in range(20_000)])  # (n, 2)
    for row in range(2):
        expected = probs[row] / probs[row].sum()
        observed = empirical(draws[:, row], 5)
        assert (observed[expected == 0] == 0).all()
        assert ops.total_variation(observed, expected.double()) < tv_bound(expected, 20_000)


# Bad input: clear errors, never a silent wrong result ----------------------------------------------


def _round(batch=2, num_draft=3, vocab=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    draft_probs = torch.rand(batch, num_draft, vocab, generator=generator).softmax(-1)
    target_probs = torch.rand(batch, num_draft + 1, vocab, generator=generator).softmax(-1)
    draft_ids = draft_probs.argmax(-1)
    return draft_ids, draft_probs, target_probs


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda ids, q, p: (ids.float(), q, p), TypeError, "`draft_ids` must hold integer token ids"),
        (lambda ids, q, p: (ids + 10, q, p), ValueError, r"`draft_ids` must be token ids in \[0, 5\)"),
        (lambda ids, q, p: (ids, q[:, :2], p), ValueError, "`draft_probs` must have shape"),
        (lambda ids, q, p: (ids, q, p[..., :4]), ValueError, "`target_probs` must have shape"),
        (lambda ids, q, p: (ids, q, p[:, :3]), ValueError, "`target_probs` must have shape"),
        (lambda ids, q, p: (ids, q.log(), p), ValueError, "`draft_probs` holds negative values"),
        (lambda ids, q, p: (ids, q, p * 2), ValueError, "`target_probs` must sum to 1"),
        (lambda ids, q, p: (ids, q, p.masked_fill(p > 0.2, float("nan"))), ValueError, "`target_probs` holds NaN"),
    ],
)
def test_direct_calls_validate_their_arguments(change, error, match):
    draft_ids, draft_probs, target_probs = change(*_round())
    with pytest.raises(error, match=match):
        ExactVerifier()(draft_ids, draft_probs, target_probs)


def test_draft_lengths_and_zero_probability_drafts_are_checked():
    draft_ids, draft_probs, target_probs = _round()
    with pytest.raises(ValueError, match=r"`draft_lengths` must lie in \[0, N\] = \[0, 3\]"):
        ExactVerifier()(draft_ids, draft_probs, target_probs, draft_lengths=torch.tensor([1, 4]))
    with pytest.raises(TypeError, match="`draft_lengths` must hold integers"):
        ExactVerifier()(draft_ids, draft_probs, target_probs, draft_lengths=torch.tensor([1.0, 2.0]))
    draft_probs = draft_probs.clone()
    draft_probs[0, 0] = 0.0
    draft_probs[0, 0, (draft_ids[0, 0] + 1) % 5] = 1.0
    with pytest.raises(ValueError, match=r"`draft_ids\[0, 0\]`.*has probability 0"):
        ExactVerifier()(draft_ids, draft_probs, target_probs)


@pytest.mark.parametrize("do_sample", [True, False])
@pytest.mark.parametrize(
    "make", [ExactVerifier, lambda: StaticEnsembleVerifier(0.5), lambda: BlockVerifier(StaticEnsembleVerifier(0.5))]
)
def test_placeholder_ids_after_a_rows_drafts_are_ignored(make, do_sample):
    """vLLM pads the slots after each request's drafts with -1: ids beyond ``draft_lengths`` are not checked and
    not read (the round equals one with valid filler there); ids within it still are."""
    draft_ids, draft_probs, target_probs = _round()
    lengths = torch.tensor([2, 1])
    padded = draft_ids.clone()
    padded[0, 2:], padded[1, 1:] = -1, -1
    filled = draft_ids.clone()
    filled[0, 2:], filled[1, 1:] = 0, 0
    rounds = [
        make()(
            ids,
            draft_probs,
            target_probs,
            draft_lengths=lengths,
            do_sample=do_sample,
            generator=torch.Generator().manual_seed(3),
        )
        for ids in (padded, filled)
    ]
    assert torch.equal(rounds[0].num_accepted, rounds[1].num_accepted)
    assert torch.equal(rounds[0].next_tokens, rounds[1].next_tokens)
    padded[1, 0] = -1  # within row 1's length: refused
    with pytest.raises(ValueError, match=r"`draft_ids` must be token ids in \[0, 5\).*first `draft_lengths`"):
        make()(padded, draft_probs, target_probs, draft_lengths=lengths)


def test_constructors_check_types_before_ranges():
    with pytest.raises(TypeError, match="`target_weight` must be a number"):
        StaticEnsembleVerifier("0.5")
    with pytest.raises(TypeError, match="`lenience` must be a number"):
        LenientVerifier(None)
    with pytest.raises(TypeError, match="`alpha` must be a number"):
        SpecCascadeVerifier("opt", "0.1")


def test_numpy_scalars_are_numbers():
    """`np.float32(0.5)` used to be refused as "not a number"; the field is stored as a Python float."""
    np = pytest.importorskip("numpy")
    verifier = StaticEnsembleVerifier(np.float32(0.5))
    assert verifier == StaticEnsembleVerifier(0.5) and type(verifier.target_weight) is float
    assert LenientVerifier(np.float64(0.3)).lenience == 0.3
    assert SpecCascadeVerifier("opt", np.float32(0.25)).alpha == 0.25
    with pytest.raises(TypeError, match="`target_weight` must be a number"):
        StaticEnsembleVerifier(np.bool_(True))


class _CustomVerifier(ExactVerifier):
    """A rule written outside the library: ``verification_probs`` returns what ``make`` builds from ``p``."""

    def __init__(self, make):
        object.__setattr__(self, "make", make)

    def verification_probs(self, draft_probs, target_probs, **context):
        return self.make(draft_probs, target_probs)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda q, p: (p.masked_fill(p > 0.2, float("nan")), None), ValueError, "NaN or infinite values"),
        (lambda q, p: (5 * p, None), ValueError, r"values summing to 5, not 1"),
        (lambda q, p: (p + torch.tensor([-0.5, 0.5, 0.0, 0.0, 0.0]), None), ValueError, "negative values"),
        (lambda q, p: (p[:, :1], None), ValueError, r"`verify_probs` of shape \(batch, N, vocab\) = \(2, 3, 5\)"),
        (lambda q, p: (p, p[..., 0, None]), ValueError, r"`target_weight` of shape \(batch, N\) = \(2, 3\)"),
        (lambda q, p: p, TypeError, r"must return a pair `\(verify_probs, target_weight\)`"),
    ],
    ids=["nan", "unnormalised", "negative", "shape", "weight-shape", "not-a-pair"],
)
@pytest.mark.parametrize("do_sample", [True, False], ids=["sampled", "greedy"])
def test_a_custom_verifiers_bad_output_is_blamed_on_the_verifier(make, error, match, do_sample):
    """NaN used to give pad ids under greedy decoding and `5 * p` to raise acceptance silently; the error names the
    verifier's class (not the logits), whether or not the round's inputs are validated."""
    draft_ids, draft_probs, target_probs = _round()
    verifier = _CustomVerifier(make)
    for validate in (True, False):
        with pytest.raises(error, match=rf"_CustomVerifier\.verification_probs`.*{match}|{match}.*_CustomVerifier"):
            verifier(draft_ids, draft_probs, target_probs, do_sample=do_sample, validate=validate)
    ok = _CustomVerifier(lambda q, p: (0.5 * p + 0.5 * q, None))  # a mixture passes
    assert ok(draft_ids, draft_probs, target_probs, do_sample=do_sample).num_accepted.shape == (2,)


def test_sample_refuses_rows_without_mass_and_never_returns_an_out_of_range_id():
    with pytest.raises(ValueError, match=r"rows \[1\] .* no finite positive mass"):
        ops.sample(torch.tensor([[0.5, 0.5], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="no finite positive mass"):
        ops.sample(torch.tensor([[float("nan"), 1.0]]))
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        probs = torch.rand(4, 7, generator=generator)
        assert int(ops.sample(probs, generator).max()) < 7


def test_head_verifier_refuses_non_finite_heads_and_weights():
    head = DiversedHead(draft_hidden_size=4, target_hidden_size=6)
    with torch.no_grad():
        head.net[0].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or infinite values in its parameter `net.0.weight`"):
        HeadVerifier(head)
    head = DiversedHead(draft_hidden_size=4, target_hidden_size=6)
    verifier = HeadVerifier(head)
    draft_ids, draft_probs, target_probs = _round(batch=1, num_draft=2)
    hidden = dict(draft_hidden=torch.full((1, 2, 4), float("inf")), target_hidden=torch.zeros(1, 3, 6))
    with torch.no_grad():
        head.net[0].weight.fill_(1.0)  # inf * 1 -> w = sigmoid(inf) = 1 is fine; inf - inf is NaN
        head.net[0].weight[0, 1] = -1.0
    with pytest.raises(ValueError, match=r"target weights outside \[0, 1\] \(or NaN\)"):
        verifier(draft_ids, draft_probs, target_probs, **hidden)


def test_typical_acceptance_by_hand():
    from diversed_hf import TypicalAcceptanceVerifier

    # p = (0.7, 0.2, 0.1): H = 0.8018, alpha exp(-H) = 0.3 * 0.4485 = 0.1346; bar = min(0.09, 0.1346) = 0.09
    target_probs = torch.tensor([[[0.7, 0.2, 0.1]]])
    draft_probs = torch.tensor([[[0.2, 0.3, 0.5]]])
    verifier = TypicalAcceptanceVerifier()
    assert verifier.token_acceptance(draft_probs, target_probs, None).tolist() == [[[1.0, 1.0, 1.0]]]
    strict = TypicalAcceptanceVerifier(posterior_threshold=0.5)
    # bar = min(0.5, 0.1346) = 0.1346: token 2 (p = 0.1) is rejected
    assert strict.token_acceptance(draft_probs, target_probs, None).tolist() == [[[1.0, 1.0, 0.0]]]
    emitted, weight = strict.verification_probs(draft_probs, target_probs)
    torch.testing.assert_close(emitted, torch.tensor([[[0.2 + 0.5, 0.3, 0.0]]]))  # rejected mass goes to argmax p
    assert weight is None
    tradeoff = theory.single_step_tradeoff(strict, draft_probs[0, 0], target_probs[0, 0])
    assert float(tradeoff.rejection) == pytest.approx(0.5)
    assert float(tradeoff.gap) >= -1e-6  # on or above the front, like every rule
    with pytest.raises(TypeError, match="`posterior_threshold` must be a number"):
        TypicalAcceptanceVerifier(posterior_threshold="0.09")
    with pytest.raises(ValueError, match="`posterior_alpha` must be a number in \\(0, 1\\]"):
        TypicalAcceptanceVerifier(posterior_alpha=0.0)


def test_typical_acceptance_emits_its_declared_law_in_a_round():
    from diversed_hf import TypicalAcceptanceVerifier

    generator = torch.Generator().manual_seed(0)
    draft_probs = torch.rand(1, 1, 6, generator=generator).softmax(-1) ** 1
    target_probs = (3 * torch.rand(1, 2, 6, generator=generator)).softmax(-1)
    verifier = TypicalAcceptanceVerifier(posterior_threshold=0.2, posterior_alpha=1.0)
    declared, _ = verifier.verification_probs(draft_probs, target_probs[:, :1])
    num_rows = 20000
    draft_ids = torch.multinomial(draft_probs[0, 0], num_rows, replacement=True, generator=generator)[:, None]
    result = verifier(
        draft_ids, draft_probs.expand(num_rows, -1, -1), target_probs.expand(num_rows, -1, -1), generator=generator
    )
    first = torch.where(result.num_accepted > 0, draft_ids[:, 0], result.next_tokens)
    observed = empirical(first, 6)
    assert float(ops.total_variation(observed, declared[0, 0].double())) < tv_bound(declared[0, 0], num_rows)


@pytest.mark.parametrize("verifier", VERIFIERS, ids=lambda v: v if isinstance(v, str) else repr(v))
@pytest.mark.parametrize("do_sample", [True, False])
def test_zero_placeholder_rows_of_slots_draft_lengths_excludes_are_ignored(verifier, do_sample):
    """vLLM pads the slots a row does not draft with zero rows; only the slots that count are checked, and the
    result equals the one with real distributions there."""
    draft_ids, draft_probs, target_probs = _round(batch=3, num_draft=4, vocab=6, seed=7)
    lengths = torch.tensor([1, 4, 0])
    placeholder_q, placeholder_p = draft_probs.clone(), target_probs.clone()
    for row, length in enumerate(lengths.tolist()):
        placeholder_q[row, length:] = 0.0
        placeholder_p[row, length + 1 :] = 0.0
    kwargs = {}
    if verifier == "head":
        verifier = HeadVerifier(_random_head())
        generator = torch.Generator().manual_seed(1)
        kwargs = dict(
            draft_hidden=torch.randn(3, 4, 6, generator=generator),
            target_hidden=torch.randn(3, 5, 5, generator=generator),
        )
    results = [
        verifier(
            draft_ids,
            q,
            p,
            draft_lengths=lengths,
            do_sample=do_sample,
            generator=torch.Generator().manual_seed(2),
            **kwargs,
        )
        for q, p in ((draft_probs, target_probs), (placeholder_q, placeholder_p))
    ]
    assert torch.equal(results[0].num_accepted, results[1].num_accepted)
    assert torch.equal(results[0].next_tokens, results[1].next_tokens)
    with pytest.raises(ValueError, match="`draft_probs` must sum to 1"):  # a slot that counts is still checked
        verifier(draft_ids, placeholder_q, placeholder_p, draft_lengths=lengths + torch.tensor([1, 0, 0]), **kwargs)
