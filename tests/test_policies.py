"""The "optimal" draft-length schedule: ``assistant_costs``, the cross-call cache, the estimator, validation."""

import gc
import weakref

import pytest
import torch
from tiny_models import left_padded_batch, make_pair, prompt

from diversed_hf import DraftCosts, ExactVerifier, clear_draft_statistics, enable_diversed, measured_draft_costs
from diversed_hf.drafting.length.costs import CostSamples, LinearVerifyCost
from diversed_hf.drafting.length.optimal import (
    _STATISTICS,
    OPTIMAL_MIN_POOLED_ROUNDS,
    OPTIMAL_PRIOR_ROUNDS,
    _pair_statistics,
)
from diversed_hf.verifiers import theory

OPTIMAL = dict(num_assistant_tokens_schedule="optimal", return_dict_in_generate=True)


@pytest.fixture
def pair():
    target, draft = make_pair("llama", noise=0.3)
    return enable_diversed(target), draft


def greedy(target, draft, input_ids, n=6, max_new_tokens=30, **kwargs):
    return target.generate(
        input_ids,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        num_assistant_tokens=n,
        **OPTIMAL,
        **kwargs,
    )


def test_passed_costs_skip_the_warm_up_and_keep_the_output_exact(pair):
    target, draft = pair
    input_ids = prompt(5)
    costly_drafts = DraftCosts(draft_step_seconds=1.0, verify_seconds=lambda n: 0.01 + 0.001 * n)
    short = greedy(target, draft, input_ids, assistant_costs=costly_drafts)
    assert torch.equal(short.sequences, target.generate(input_ids, do_sample=False, max_new_tokens=30))
    # the first round drafts N (nothing is known about acceptance yet), then one draft is always best: no warm-up
    assert short.speculation.draft_lengths[0][0] == 6 and bool((short.speculation.draft_lengths[0][1:] == 1).all())

    clear_draft_statistics(draft)
    free_drafts = DraftCosts(draft_step_seconds=1e-9, verify_seconds=[1.0] * 6)  # sampled: every position may accept
    long = target.generate(
        input_ids,
        assistant_model=draft,
        verifier=ExactVerifier(),
        do_sample=True,
        max_new_tokens=30,
        num_assistant_tokens=6,
        assistant_costs=free_drafts,
        generator=torch.Generator().manual_seed(0),
        **OPTIMAL,
    )
    assert long.speculation.draft_lengths[0][:3].tolist() == [6, 6, 6]  # no probe; 3 rounds emit < 29 tokens


def _first_round_prior(speculation, num_draft_tokens):
    """What the schedule pools about the rounds right after the prompt: the mean per-position term of the rows'
    first rounds (NaN where fewer than OPTIMAL_MIN_POOLED_ROUNDS rows drafted the position)."""
    betas = torch.stack([rounds[0] for rounds in speculation.position_acceptance]).double()[:, :num_draft_tokens]
    kept = torch.stack([rounds[0] for rounds in speculation.drafted_acceptance]).double()[:, :num_draft_tokens]
    reach = torch.cat([torch.ones_like(kept[:, :1]), kept[:, :-1].nan_to_num(0.0)], dim=1).cumprod(dim=1)
    terms, counts = (reach * betas).nan_to_num(0.0), (~betas.isnan()).sum(0)
    return torch.where(counts >= OPTIMAL_MIN_POOLED_ROUNDS, terms.sum(0) / counts, torch.nan)  # (N,)


def test_a_call_with_cached_costs_and_prior_skips_the_warm_up_and_starts_from_them(pair):
    target, draft = pair
    input_ids = prompt(5)
    assert measured_draft_costs(target, draft) is None
    # 32 rows drafting 6 (cheap drafts passed): the priors cover every position; the rounds are timed all the same
    rows = greedy(target, draft, input_ids.repeat(32, 1), assistant_costs=DraftCosts(1e-9, [1.0] * 6))
    assert all(int(lengths[0]) == 6 for lengths in rows.speculation.draft_lengths)
    costs = measured_draft_costs(target, draft)  # timed at batch 32 and below: the nearest batch size serves batch 1
    assert isinstance(costs, DraftCosts) and costs.draft_step_seconds > 0
    curve = costs.verify_curve(6)
    assert bool((curve > 0).all()) and bool((curve[1:] >= curve[:-1]).all())
    prior = _first_round_prior(rows.speculation, 6)
    assert not bool(prior.isnan().any())
    expected_first_length = int(theory.optimal_draft_length(prior[None], costs.draft_step_seconds, curve)[0])

    second = greedy(target, draft, input_ids)
    assert torch.equal(second.sequences, target.generate(input_ids, do_sample=False, max_new_tokens=30))
    lengths = second.speculation.draft_lengths[0]
    assert int(lengths[0]) == expected_first_length  # chosen in round 0 from the cache: no warm-up
    assert int(lengths[1]) == 1  # a probe: the pair has fewer than OPTIMAL_PROBES short rounds timed at batch 1
    assert int(lengths.max()) <= 6

    # the first round's prior decides it: with costly drafts, one token (a pair without that prior drafts N); the
    # second round may explore positions the later rounds' prior lacks, then one token again
    third = greedy(target, draft, input_ids, assistant_costs=DraftCosts(1.0, lambda n: 0.01)).speculation.draft_lengths[
        0
    ]
    assert int(third[0]) == 1 and bool((third[2:] == 1).all())


def test_cached_batched_calls_stay_exact():
    target, draft = make_pair("qwen3", noise=0.3)
    enable_diversed(target)
    rows, input_ids, attention_mask = left_padded_batch([4, 9, 6])
    for call in range(3):  # warm-up, probe, fully cached
        output = greedy(target, draft, input_ids, attention_mask=attention_mask, max_new_tokens=20)
        for b, row in enumerate(rows):
            alone = target.generate(row[None], do_sample=False, max_new_tokens=20)
            assert torch.equal(output.sequences[b, -20:], alone[0, -20:]), (call, b)
    assert measured_draft_costs(target, draft, batch_size=3) is not None


def test_the_cache_belongs_to_the_models_and_can_be_cleared():
    target, draft = make_pair("llama", noise=0.3)
    enable_diversed(target)
    attributes = set(vars(draft))
    greedy(target, draft, prompt(5), max_new_tokens=12)
    assert measured_draft_costs(target, draft) is not None
    assert set(vars(draft)) == attributes  # nothing stored on the model
    other_target, _ = make_pair("llama", noise=0.3)
    assert measured_draft_costs(other_target, draft) is None  # keyed by the pair
    clear_draft_statistics(draft)
    assert measured_draft_costs(target, draft) is None
    assert greedy(target, draft, prompt(5), max_new_tokens=12).speculation.draft_lengths[0][:3].tolist() == [6, 6, 1]
    reference = weakref.ref(draft)
    del draft
    gc.collect()
    assert reference() is None  # the cache does not keep the draft alive; its entry went with it
    assert all(key is not None for key in _STATISTICS.keys())


def test_cost_fit_takes_the_shape_from_pairs_of_rounds_and_the_scale_from_recent_ones():
    def round_seconds(n, load):  # drafting 1 ms per step + 0.5 ms; the rest 12 ms + 0.3 ms per draft; both times load
        return load * (0.0005 + 0.001 * n), load * (0.012 + 0.0003 * n)

    samples = CostSamples()
    samples.add(12, *round_seconds(12, 1.0))
    one_length = samples.fit()  # one length timed: drafting proportional to n, the rest constant
    assert one_length.draft_step_seconds == pytest.approx(0.0125 / 12) and one_length.verify_seconds(
        3
    ) == pytest.approx(0.0156)
    for load in (1.0, 1.5, 0.8):  # probes (1 draft, then 12) timed under loads that change between calls
        samples.add(1, *round_seconds(1, load), previous=(12, *round_seconds(12, load)))
        samples.add(12, *round_seconds(12, load), previous=(1, *round_seconds(1, load)))
    for _ in range(80):  # then the machine runs twice as slow: the scale follows, the shape stays
        samples.add(12, *round_seconds(12, 2.0), previous=(12, *round_seconds(12, 2.0)))
    fitted = samples.fit()
    assert isinstance(fitted.verify_seconds, LinearVerifyCost)
    assert fitted.draft_step_seconds == pytest.approx(0.002)
    for n in (1, 4, 12):
        assert fitted.verify_seconds(n) == pytest.approx(2.0 * (0.0005 + 0.012 + 0.0003 * n))
    assert samples.count_pairs(6) == 6


def test_the_prior_is_shrunk_toward_the_rows_own_rounds():
    from diversed_hf.drafting.length.optimal import OptimalSchedule

    draft = torch.nn.Linear(1, 1)
    _pair_statistics(draft, None).pool("setting", torch.tensor([32.0, 0.0]), torch.tensor([32.0, 32.0]))  # prior 1, 0
    schedule = OptimalSchedule(draft, 2, setting="setting", costs=DraftCosts(1e-3, [1.0, 1.0]))
    schedule.start(1, torch.device("cpu"))
    ones = torch.ones(1, 2)
    for _ in range(9):  # the row accepts everything at position 2: 8 later rounds of its own against 8 of prior
        schedule.observe(ones, ones, torch.tensor([2]), None)
    own = 8.0 / (8 + OPTIMAL_PRIOR_ROUNDS)
    assert schedule.estimates()[0].tolist() == pytest.approx([1.0, own])


def test_the_first_round_has_its_own_prior():
    from diversed_hf.drafting.length.optimal import OptimalSchedule, _first_round

    draft = torch.nn.Linear(1, 1)
    statistics = _pair_statistics(draft, None)
    statistics.pool(
        _first_round("setting"), torch.full((4,), 32.0), torch.full((4,), 32.0)
    )  # right after the prompt: 1
    statistics.pool("setting", torch.zeros(4), torch.full((4,), 32.0))  # later rounds: 0
    schedule = OptimalSchedule(draft, 4, setting="setting", costs=DraftCosts(0.1, [1.0] * 4))
    assert schedule.start(2, torch.device("cpu")).tolist() == [4, 4]  # every draft accepted: draft N
    zeros = torch.zeros(2, 4)
    schedule.observe(zeros, zeros, torch.tensor([4, 4]), None)  # the first round is not the rows' own data here
    assert schedule.lengths().tolist() == [1, 1]
    schedule.finish()
    assert statistics.prior(_first_round("setting"), 4).tolist() == pytest.approx([32 / 34] * 4)  # (32 + 0) / (32 + 2)
    assert statistics.prior("setting", 4).tolist() == [0.0] * 4


def test_the_stopping_rule_charges_each_draft_at_the_pairs_rate():
    from diversed_hf.drafting.length.optimal import OPTIMAL_MIN_CALIBRATION, OptimalSchedule, StoppingRule

    draft = torch.nn.Linear(1, 1)
    statistics = _pair_statistics(draft, None)
    costs = DraftCosts(1.0, [2.0, 2.5, 3.0, 3.5])  # a round of n drafts costs n + 2 + (n - 1) / 2: 3, 4.5, 6, 7.5
    schedule = OptimalSchedule(draft, 4, setting="setting", costs=costs)
    assert schedule.start(1, torch.device("cpu")).tolist() == [4] and schedule.rule is None  # nothing pooled yet

    bins = len(schedule.edges) + 1
    # drafts the draft is sure of (last bin) always pass, unsure ones (first bin) never: mean 0.5
    sums, counts = torch.zeros(bins, dtype=torch.float64), torch.zeros(bins, dtype=torch.float64)
    sums[-1], counts[-1], counts[0] = OPTIMAL_MIN_CALIBRATION, OPTIMAL_MIN_CALIBRATION, OPTIMAL_MIN_CALIBRATION
    statistics.pool_calibration("setting", sums, counts)
    # 20 rounds of 2 drafts emitting 3 tokens per row (cost 4.5 each): 2 / 3 token per unit of cost
    statistics.pool_rate(("setting", "cpu", 1), torch.tensor([0.0, 0.0, 60.0]), torch.tensor([0.0, 0.0, 20.0]))
    schedule = OptimalSchedule(draft, 4, setting="setting", costs=costs)
    assert schedule.start(1, torch.device("cpu")).tolist() == [4]  # the rule stops rows within the round
    rule = schedule.rule
    assert isinstance(rule, StoppingRule) and rule.mean_acceptance == pytest.approx(0.5)
    assert rule.thresholds.tolist() == pytest.approx([2 / 3 * 1.5] * 3)  # rate x (c + c_verify(k + 1) - c_verify(k))
    reach = rule.update_reach(torch.ones(2), torch.tensor([0.999, 0.05]))  # sure, unsure
    assert reach.tolist() == pytest.approx([(OPTIMAL_MIN_CALIBRATION + 4) / (OPTIMAL_MIN_CALIBRATION + 8), 4 / 264])

    def alone(rule, step):  # each row as a batch of its own
        return [
            bool(rule.keep_drafting_batch(reach[b : b + 1], torch.ones(1, dtype=torch.bool), step)) for b in range(2)
        ]

    # a sure row's next draft adds about 0.5 token, less than the 1 token its cost is worth at this rate: both stop
    assert alone(rule, 0) == [False, False]
    cheap = StoppingRule(rule.edges, rule.acceptance, 0.5, torch.full((3,), 0.25))  # drafts four times cheaper
    assert alone(cheap, 0) == [True, False]
    assert alone(cheap, 3) == [False, False]  # N drafts: the round is full
    # a batch decides on the rows still drafting: the unsure row, already stopped, does not hold the sure one back
    assert bool(cheap.keep_drafting_batch(reach, torch.tensor([True, False]), 0))
    # one row: the same rule on Python floats (what drafting uses at batch 1)
    for confidence, tensor_reach in zip((0.999, 0.05), reach.tolist()):
        scalar_reach = cheap.update_reach_scalar(1.0, confidence)
        assert scalar_reach == pytest.approx(tensor_reach)
        assert [cheap.keep_drafting_scalar(scalar_reach, step) for step in (0, 3)] == [confidence > 0.5, False]


def test_the_round_after_the_prompt_has_its_own_calibration():
    from diversed_hf.drafting.length.optimal import OPTIMAL_MIN_CALIBRATION, OptimalSchedule, _first_round

    draft = torch.nn.Linear(1, 1)
    statistics = _pair_statistics(draft, None)
    bins = 12
    statistics.pool_calibration(
        "setting", torch.zeros(bins, dtype=torch.float64), torch.full((bins,), 32.0, dtype=torch.float64)
    )
    statistics.pool_calibration(
        _first_round("setting"),
        torch.full((bins,), OPTIMAL_MIN_CALIBRATION, dtype=torch.float64),
        torch.full((bins,), OPTIMAL_MIN_CALIBRATION, dtype=torch.float64),
    )
    statistics.pool_rate(("setting", "cpu", 1), torch.tensor([0.0, 0.0, 60.0]), torch.tensor([0.0, 0.0, 20.0]))
    schedule = OptimalSchedule(draft, 4, setting="setting", costs=DraftCosts(1.0, [2.0] * 4))
    schedule.start(1, torch.device("cpu"))
    assert schedule.rule.mean_acceptance == 1.0  # right after the prompt every draft was accepted
    ones = torch.ones(1, 4)
    schedule.observe(
        ones, ones, torch.tensor([4]), None, confidence=torch.full((1, 4), 0.5), num_matches=torch.tensor([4])
    )
    assert schedule.rule.mean_acceptance == 0.0  # later rounds: none was
    schedule.finish()  # the round pooled into the first round's calibration, not the later rounds'
    assert float(statistics.calibration["setting"][1].sum()) == 32.0 * bins
    assert float(statistics.calibration[_first_round("setting")][1].sum()) == OPTIMAL_MIN_CALIBRATION * bins + 4


def _scale_pooled_statistics(target, draft, factor):
    """Multiply every pooled count (acceptance, calibration, rate) by ``factor``: the estimates stay, as if
    ``factor`` times as many calls had been seen (so one warm-up call is enough to switch the rule on)."""
    statistics = _pair_statistics(draft, target)
    for table in (statistics.acceptance, statistics.calibration, statistics.rates):
        for key, (values, counts) in list(table.items()):
            table[key] = (values * factor, counts * factor)


def test_under_the_stopping_rule_greedy_output_stays_exact_batched_and_alone(pair):
    target, draft = pair
    rows, input_ids, attention_mask = left_padded_batch([4, 9, 6])
    costs = DraftCosts(
        0.5, [3.0] * 6
    )  # a draft costs 0.5 against 3 units of verification: worth it when likely accepted
    # a batch (the rule on tensors), then one row (on Python floats); the rate is kept per batch size
    for batch, mask in ((input_ids, attention_mask), (rows[1][None], None)):
        greedy(target, draft, batch, attention_mask=mask, assistant_costs=costs)
        _scale_pooled_statistics(target, draft, 64)
        output = greedy(target, draft, batch, attention_mask=mask, assistant_costs=costs)
        for b in range(batch.shape[0]):
            row = rows[b] if batch.shape[0] > 1 else rows[1]
            alone = target.generate(row[None], do_sample=False, max_new_tokens=30)
            assert torch.equal(output.sequences[b, -30:], alone[0, -30:])
        lengths = torch.cat([r[:-1] for r in output.speculation.draft_lengths])  # the last round may hit the budget
        assert int(lengths.min()) < int(lengths.max())  # rows stop at lengths the confidence of their drafts decides


def test_sampled_law_is_the_targets_under_the_stopping_rule(pair):
    """The rule stops a batch after one draft or lets it draft two, from the draft's confidence in the rows' first
    tokens: with ExactVerifier the third token still follows p. Batches of 4 rows, so the decision varies."""
    from tiny_models import VOCAB_SIZE, empirical, tv_bound

    from diversed_hf.verifiers import ops

    target, draft = make_pair("llama", noise=0.5)
    enable_diversed(target)
    input_ids, batch_size, num_calls = prompt(6, seed=5), 4, 750
    costs = DraftCosts(0.8, [2.0, 2.0])  # a second draft costs 0.8 against a round of 2.8
    generator = torch.Generator().manual_seed(0)

    def sample():
        return target.generate(
            input_ids.repeat(batch_size, 1),
            assistant_model=draft,
            verifier=ExactVerifier(),
            do_sample=True,
            max_new_tokens=3,
            num_assistant_tokens=2,
            generator=generator,
            assistant_costs=costs,
            **OPTIMAL,
        )

    sample()
    _scale_pooled_statistics(target, draft, 256)
    outputs = [sample() for _ in range(num_calls)]
    first_round = torch.stack([lengths[0] for output in outputs for lengths in output.speculation.draft_lengths])
    assert 0.05 < float((first_round == 1).double().mean()) < 0.95  # the rule stopped some batches, not all
    with torch.no_grad():
        first = target(input_ids).logits[0, -1].softmax(-1).double()  # (V,) p(x1)
        two = torch.cat([input_ids.repeat(VOCAB_SIZE, 1), torch.arange(VOCAB_SIZE)[:, None]], dim=1)  # (V, L + 1)
        second = target(two).logits[:, -1].softmax(-1).double()  # (V, V) p(x2 | x1)
        three = torch.cat(
            [two.repeat_interleave(VOCAB_SIZE, 0), torch.arange(VOCAB_SIZE).repeat(VOCAB_SIZE)[:, None]], 1
        )
        third = target(three).logits[:, -1].softmax(-1).double()  # (V * V, V) p(x3 | x1, x2)
    declared = (first[:, None] * second).reshape(-1) @ third  # (V,) marginal law of the third token
    observed = empirical(torch.cat([output.sequences[:, -1] for output in outputs]), VOCAB_SIZE)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, batch_size * num_calls)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(assistant_costs=DraftCosts(1e-3, [0.01] * 6)),
            ValueError,
            'read only by `num_assistant_tokens_schedule="optimal"`',
        ),
        (dict(assistant_costs={"draft_step_seconds": 1e-3}, **OPTIMAL), TypeError, "`assistant_costs` must be a"),
        (
            dict(assistant_costs=DraftCosts(1e-3, [0.01] * 3), **OPTIMAL),
            ValueError,
            r"needs one entry per draft length",
        ),
        (dict(assistant_costs=DraftCosts(1e-3, lambda n: 0.01 - 0.003 * n), **OPTIMAL), ValueError, "finite and > 0"),
        (dict(assistant_costs=DraftCosts(1e-3, lambda n: "fast"), **OPTIMAL), TypeError, "must return a number"),
    ],
)
def test_bad_assistant_costs_are_refused_before_generating(pair, kwargs, error, match):
    target, draft = pair
    with pytest.raises(error, match=match):
        target.generate(
            prompt(4),
            assistant_model=draft,
            verifier=ExactVerifier(),
            max_new_tokens=4,
            num_assistant_tokens=6,
            **kwargs,
        )
    assert measured_draft_costs(target, draft) is None  # nothing ran


@pytest.mark.parametrize(
    "fields, error, match",
    [
        (
            dict(draft_step_seconds=0.0, verify_seconds=[1.0]),
            ValueError,
            r"`DraftCosts.draft_step_seconds` must be a finite",
        ),
        (dict(draft_step_seconds=float("nan"), verify_seconds=[1.0]), ValueError, "draft_step_seconds"),
        (dict(draft_step_seconds=True, verify_seconds=[1.0]), ValueError, "draft_step_seconds"),
        (
            dict(draft_step_seconds=1e-3, verify_seconds="fast"),
            TypeError,
            r"`DraftCosts.verify_seconds` must be a callable",
        ),
        (dict(draft_step_seconds=1e-3, verify_seconds=[]), TypeError, "non-empty"),
    ],
)
def test_draft_costs_check_their_fields(fields, error, match):
    with pytest.raises(error, match=match):
        DraftCosts(**fields)


def test_assistant_costs_without_a_verifier_is_an_error(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="`assistant_costs` only applies to relaxed speculative decoding"):
        target.generate(prompt(4), assistant_model=draft, max_new_tokens=4, assistant_costs=DraftCosts(1e-3, [0.01]))
