"""Block verification (docs/method.md §2, "Block verification"): the exact law of a round by enumeration, the
implementation against an independent reference, sampled laws (verifier and ``generate`` on tiny models), the
expected-tokens theory, the paired comparison with token-wise verification, greedy equivalence and arguments."""

import itertools
import math

import pytest
import torch
from tiny_models import empirical, make_model, make_pair, prompt, tv_bound

from diversed_hf import enable_diversed
from diversed_hf.heads.head import DiversedHead, DiversedHeadConfig
from diversed_hf.verifiers import (
    BlockVerifier,
    ExactVerifier,
    HeadVerifier,
    LenientVerifier,
    StaticEnsembleVerifier,
    block,
    ops,
    theory,
)

VERIFIERS = [ExactVerifier(), StaticEnsembleVerifier(0.4)]


def markov_tables(num_draft, vocab, seed, scale=2.0):
    """q_t(. | x_{t-1}) and p_t(. | x_{t-1}) per position t: a small context-dependent pair, enumerable."""
    generator = torch.Generator().manual_seed(seed)
    draft = (scale * torch.randn(num_draft, vocab, vocab, generator=generator, dtype=torch.float64)).softmax(-1)
    target = (scale * torch.randn(num_draft + 1, vocab, vocab, generator=generator, dtype=torch.float64)).softmax(-1)
    return draft, target  # (N, prev, vocab), (N + 1, prev, vocab)


def mixture(verifier, draft, target):
    """pi written out here (not through the library): p for SD, w p + (1 - w) q for a static ensemble; lossy SD's
    declared distribution ``q a + (1 - beta) r`` from the library (what block verification of it verifies against)."""
    if isinstance(verifier, LenientVerifier):
        return verifier.verification_probs(draft, target)[0]
    weight = getattr(verifier, "target_weight", 1.0)
    return weight * target + (1 - weight) * draft


def reference_round(block_ids, draft_rows, verify_rows, bonus_row, *, naive_residual=False):
    """Exact law of ``(tau, next token)`` for one drafted block, from Sun et al.'s rule in plain Python floats.

    ``draft_rows[t]``, ``verify_rows[t]``: q and pi at position t + 1 given the drafted prefix; ``bonus_row``: p after
    the block. ``naive_residual`` recovers from token-wise SD's ``norm(max(0, pi - q))`` instead (a wrong rule).
    """
    length, vocab = len(block_ids), len(bonus_row)
    rho = [1.0]
    for t, x in enumerate(block_ids):
        rho.append(min(1.0, rho[-1] * verify_rows[t][x] / draft_rows[t][x]))

    def excess(t):
        scale = 1.0 if naive_residual else rho[t]
        return [max(0.0, scale * verify_rows[t][x] - draft_rows[t][x]) for x in range(vocab)]

    stop = []
    for t in range(length + 1):
        if t == length:
            stop.append(rho[t])
        else:
            e = sum(max(0.0, rho[t] * verify_rows[t][x] - draft_rows[t][x]) for x in range(vocab))
            stop.append(1.0 if t == 0 else (e / (e + (1.0 - rho[t])) if e > 0 else 0.0))
    law, survive = {}, 1.0
    for t in range(length, -1, -1):
        here, survive = survive * stop[t], survive * (1.0 - stop[t])
        if here <= 1e-15:
            continue
        after = list(bonus_row) if t == length else excess(t)
        total = sum(after)
        if total == 0:  # pi = q from here on: the round stops here only by float rounding
            assert here < 1e-9, (t, here)
            continue
        for y in range(vocab):
            law[(t, y)] = law.get((t, y), 0.0) + here * after[y] / total
    return law


def round_law(verifier, draft, target, num_draft, vocab, *, naive_residual=False):
    """Law of one round's output ``(x_1..x_tau, y)``: every block enumerated, weighted by ``Q(block)``."""
    verify = mixture(verifier, draft, target[:num_draft])  # (N, prev, vocab)
    law = {}
    for block_ids in itertools.product(range(vocab), repeat=num_draft):
        previous, chance = [0] + list(block_ids), 1.0
        for t, x in enumerate(block_ids):
            chance *= float(draft[t, previous[t], x])
        rows = lambda table: [table[t, previous[t]].tolist() for t in range(num_draft)]  # noqa: E731
        outcome = reference_round(
            block_ids,
            rows(draft),
            rows(verify),
            target[num_draft, previous[-1]].tolist(),
            naive_residual=naive_residual,
        )
        for (tau, y), mass in outcome.items():
            key = tuple(block_ids[:tau]) + (y,)
            law[key] = law.get(key, 0.0) + chance * mass
    return law


def completed_law_tv(verifier, draft, target, law):
    """TV between the round's output completed by pi's own law and pi's law of N + 1 tokens (p at the bonus)."""
    num_draft, vocab = draft.shape[0], draft.shape[-1]
    verify = mixture(verifier, draft, target[:num_draft])

    def step(t, previous, x):  # pi at drafted positions, p at position N + 1
        return float(verify[t, previous, x]) if t < num_draft else float(target[t, previous, x])

    tv = 0.0
    for sequence in itertools.product(range(vocab), repeat=num_draft + 1):
        previous = [0] + list(sequence)
        declared = math.prod(step(t, previous[t], sequence[t]) for t in range(num_draft + 1))
        emitted = 0.0
        for length in range(1, num_draft + 2):
            rest = math.prod(step(t, previous[t], sequence[t]) for t in range(length, num_draft + 1))
            emitted += law.get(tuple(sequence[:length]), 0.0) * rest
        tv += 0.5 * abs(declared - emitted)
    return tv


@pytest.mark.parametrize("verifier", VERIFIERS + [LenientVerifier(0.5)], ids=repr)
@pytest.mark.parametrize("num_draft, vocab, seed", [(2, 3, 0), (3, 3, 1), (3, 4, 2)])
def test_the_emitted_law_is_pis_exactly_by_enumeration(verifier, num_draft, vocab, seed):
    draft, target = markov_tables(num_draft, vocab, seed)
    law = round_law(verifier, draft, target, num_draft, vocab)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert completed_law_tv(verifier, draft, target, law) < 1e-12
    if verifier in VERIFIERS:  # the test has teeth: token-wise SD's residual at the stop gives another law
        wrong = round_law(verifier, draft, target, num_draft, vocab, naive_residual=True)
        assert completed_law_tv(verifier, draft, target, wrong) > 1e-4


def test_the_implementation_matches_the_reference_rule():
    """block.stop_probabilities and block.block_residual against the plain-Python rule, rows of different lengths."""
    generator = torch.Generator().manual_seed(5)
    batch, num_draft, vocab = 64, 4, 5
    draft_probs = (2 * torch.randn(batch, num_draft, vocab, generator=generator, dtype=torch.float64)).softmax(-1)
    verify_probs = (2 * torch.randn(batch, num_draft, vocab, generator=generator, dtype=torch.float64)).softmax(-1)
    bonus_probs = torch.rand(batch, vocab, generator=generator, dtype=torch.float64).softmax(-1)
    draft_ids = torch.multinomial(draft_probs.flatten(0, 1), 1, generator=generator).view(batch, num_draft)
    draft_lengths = torch.randint(0, num_draft + 1, (batch,), generator=generator)
    weights = block.running_weights(draft_ids, draft_probs, verify_probs)  # (batch, N + 1)
    stop = block.stop_probabilities(weights, draft_probs, verify_probs, draft_lengths)  # (batch, N + 1)
    for b in range(batch):
        length = int(draft_lengths[b])
        law = reference_round(
            draft_ids[b, :length].tolist(), draft_probs[b].tolist(), verify_probs[b].tolist(), bonus_probs[b].tolist()
        )
        survive = 1.0
        for t in range(length, -1, -1):  # P(tau = t) from the implementation's h against the reference's
            mass = survive * float(stop[b, t])
            survive *= 1.0 - float(stop[b, t])
            assert mass == pytest.approx(sum(v for (tau, _), v in law.items() if tau == t), abs=1e-12)
            if t < length and mass > 1e-12:
                residual = block.block_residual(
                    weights[b, t : t + 1], draft_probs[b, t : t + 1], verify_probs[b, t : t + 1]
                )
                expected = torch.tensor([law.get((t, y), 0.0) / mass for y in range(vocab)], dtype=torch.float64)
                assert torch.allclose(residual[0], expected, atol=1e-12)
        assert float(stop[b, length + 1 :].abs().sum()) == 0.0  # positions past the row's drafts never stop


def simulate(verifier, draft, target, num_rounds, seed, draft_lengths=None):
    """Draft ``num_rounds`` blocks from the tables and verify them in one batched call; returns (result, draft_ids)."""
    num_draft = draft.shape[0]
    generator = torch.Generator().manual_seed(seed)
    previous = torch.zeros(num_rounds, dtype=torch.long)
    ids, draft_probs, target_probs = [], [], []
    for t in range(num_draft + 1):
        target_probs.append(target[t, previous])
        if t < num_draft:
            draft_probs.append(draft[t, previous])
            ids.append(torch.multinomial(draft_probs[-1], 1, generator=generator).squeeze(-1))
            previous = ids[-1]
    draft_ids = torch.stack(ids, 1)  # (R, N); a row counting L drafts takes its bonus from p_{L+1}(. | x_L)
    result = verifier(
        draft_ids,
        torch.stack(draft_probs, 1),
        torch.stack(target_probs, 1),
        generator=generator,
        draft_lengths=draft_lengths,
    )
    return result, draft_ids


@pytest.mark.parametrize("verifier", VERIFIERS, ids=repr)
def test_sampled_rounds_follow_the_exact_round_law(verifier):
    num_draft, vocab, num_rounds = 3, 3, 40_000
    draft, target = markov_tables(num_draft, vocab, seed=3)
    law = round_law(verifier, draft, target, num_draft, vocab)
    result, draft_ids = simulate(BlockVerifier(verifier), draft, target, num_rounds, seed=4)
    keys = sorted(law)
    index = {key: i for i, key in enumerate(keys)}
    outputs = [
        tuple(ids[:tau]) + (y,)
        for ids, tau, y in zip(draft_ids.tolist(), result.num_accepted.tolist(), result.next_tokens.tolist())
    ]
    observed = empirical(torch.tensor([index[o] for o in outputs]), len(keys))
    expected = torch.tensor([law[key] for key in keys], dtype=torch.float64)
    assert float(ops.total_variation(observed, expected)) < tv_bound(expected, num_rounds)


def test_rows_count_their_own_drafts():
    """Per-row draft lengths: a row with L drafts is a block of L (the bonus follows its last counted draft)."""
    num_draft, vocab = 3, 3
    draft, target = markov_tables(num_draft, vocab, seed=6)
    lengths = torch.tensor([0, 1, 2, 3]).repeat(2000)
    result, _ = simulate(BlockVerifier(ExactVerifier()), draft, target, lengths.numel(), seed=7, draft_lengths=lengths)
    assert bool((result.num_accepted <= lengths).all())
    assert bool((result.num_accepted[lengths == 0] == 0).all())
    for length in (1, 2, 3):  # E[tau] of a block of `length` drafts, exact, against the sampled mean
        law = round_law(ExactVerifier(), draft[:length], target[: length + 1], length, vocab)
        exact = sum((len(key) - 1) * mass for key, mass in law.items())  # a key is (x_1..x_tau, y)
        sampled = result.num_accepted[lengths == length].double()
        assert abs(float(sampled.mean()) - exact) < 5 * float(sampled.std()) / math.sqrt(sampled.numel()) + 1e-9


def test_two_draft_example_of_the_paper():
    """q = (2/3, 1/3), p = (1/3, 2/3) at both positions: 11/9 accepted drafts per round against token-wise 10/9."""
    draft_probs = torch.tensor([[2 / 3, 1 / 3]] * 2, dtype=torch.float64)
    target_probs = torch.tensor([[1 / 3, 2 / 3]] * 2, dtype=torch.float64)
    assert theory.block_tokens_per_round(draft_probs, target_probs) == pytest.approx(1 + 11 / 9, abs=1e-12)
    token_wise = theory.beta_product_tokens_per_round(torch.full((1, 2), 2 / 3, dtype=torch.float64))
    assert float(token_wise) == pytest.approx(1 + 10 / 9, abs=1e-12)
    num_rounds = 100_000
    generator = torch.Generator().manual_seed(0)
    draft_ids = torch.multinomial(draft_probs[0], 2 * num_rounds, replacement=True, generator=generator).view(-1, 2)
    result = BlockVerifier(ExactVerifier())(
        draft_ids,
        draft_probs.expand(num_rounds, 2, 2),
        torch.cat([target_probs, target_probs[:1]]).expand(num_rounds, 3, 2),
        generator=generator,
    )
    tokens = (result.num_accepted + 1).double()
    assert abs(float(tokens.mean()) - (1 + 11 / 9)) < 5 * float(tokens.std()) / math.sqrt(num_rounds)


@pytest.mark.parametrize("seed", range(4))
def test_theory_for_position_distributions_matches_simulation_and_beats_token_wise(seed):
    generator = torch.Generator().manual_seed(seed)
    num_draft, vocab, num_rounds = 4, 5, 40_000
    draft_probs = (2 * torch.randn(num_draft, vocab, generator=generator, dtype=torch.float64)).softmax(-1)
    target_probs = (2 * torch.randn(num_draft + 1, vocab, generator=generator, dtype=torch.float64)).softmax(-1)
    exact = theory.block_tokens_per_round(draft_probs, target_probs[:num_draft])
    betas = torch.minimum(draft_probs, target_probs[:num_draft]).sum(-1)[None]  # (1, N)
    assert exact >= float(theory.beta_product_tokens_per_round(betas)) - 1e-12
    draft_ids = torch.stack(
        [
            torch.multinomial(draft_probs[t], num_rounds, replacement=True, generator=generator)
            for t in range(num_draft)
        ],
        1,
    )
    result = BlockVerifier(ExactVerifier())(
        draft_ids, draft_probs.expand(num_rounds, -1, -1), target_probs.expand(num_rounds, -1, -1), generator=generator
    )
    tokens = (result.num_accepted + 1).double()
    assert abs(float(tokens.mean()) - exact) < 5 * float(tokens.std()) / math.sqrt(num_rounds)
    # the library's estimator on block rounds (factors rho_t / rho_{t-1}, beta given the prefix) is unbiased too
    estimate = theory.expected_tokens_per_round(result.position_acceptance, result.drafted_acceptance, per_round=True)
    assert abs(float(estimate.mean()) - exact) < 5 * float(estimate.std()) / math.sqrt(num_rounds) + 1e-9
    assert estimate.std() <= tokens.std()
    with pytest.raises(ValueError, match="`max_states`=3"):
        theory.block_tokens_per_round(draft_probs, target_probs[:num_draft], max_states=3)
    with pytest.raises(ValueError, match="one shape"):
        theory.block_tokens_per_round(draft_probs, target_probs)


@pytest.mark.parametrize("verifier", VERIFIERS, ids=repr)
def test_block_keeps_at_least_as_many_drafts_as_token_wise_paired(verifier):
    """Same drafted blocks (same seed) through both rules: exact expectations by enumeration, and sampled means."""
    num_draft, vocab = 4, 4
    draft, target = markov_tables(num_draft, vocab, seed=8)
    block_mean = sum(
        (len(key) - 1) * mass for key, mass in round_law(verifier, draft, target, num_draft, vocab).items()
    )
    token_result, _ = simulate(verifier, draft, target, 40_000, seed=9)
    block_result, _ = simulate(BlockVerifier(verifier), draft, target, 40_000, seed=9)
    token_estimate = theory.expected_tokens_per_round(token_result.position_acceptance, token_result.drafted_acceptance)
    assert block_mean + 1 > float(token_estimate) + 0.01  # a real gain here, not a tie
    difference = (block_result.num_accepted - token_result.num_accepted).double()  # paired by drafted block
    assert float(difference.mean()) > -3 * float(difference.std()) / math.sqrt(difference.numel())
    assert abs(float(block_result.num_accepted.double().mean()) - block_mean) < 0.03


def test_greedy_block_verification_is_token_wise():
    generator = torch.Generator().manual_seed(1)
    draft_probs = (3 * torch.randn(8, 4, 6, generator=generator)).softmax(-1)
    target_probs = (3 * torch.randn(8, 5, 6, generator=generator)).softmax(-1)
    draft_ids = draft_probs.argmax(-1)
    draft_ids[::2, 1] = target_probs[::2, 1].argmax(-1)  # some rows agree further
    for verifier in VERIFIERS:
        ours = BlockVerifier(verifier)(draft_ids, draft_probs, target_probs, do_sample=False)
        theirs = verifier(draft_ids, draft_probs, target_probs, do_sample=False)
        assert torch.equal(ours.num_accepted, theirs.num_accepted) and torch.equal(ours.next_tokens, theirs.next_tokens)


def test_generate_with_tiny_models_emits_pis_two_token_law():
    """The first two tokens of ``generate`` (vocabulary 6, N = 2) follow pi's autoregressive law: SD and a static
    ensemble, block-verified. With 40,000 rows a TV of 0.03 is outside the bound."""
    vocab, num_rows = 6, 40_000
    target = make_model(vocab_size=vocab, seed=3)
    draft = make_model(vocab_size=vocab, seed=4)
    for model in (target, draft):
        model.generation_config.eos_token_id = None
    enable_diversed(target)
    input_ids = prompt(4, seed=2) % (vocab - 3) + 3
    with torch.no_grad():
        every_first = torch.cat([input_ids.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)  # (V, L + 1)
        first = [m(input_ids).logits[0, -1].softmax(-1).double() for m in (target, draft)]  # (V,) p, q
        second = [m(every_first).logits[:, -1].softmax(-1).double() for m in (target, draft)]  # (V, V)
    laws = []
    for verifier in VERIFIERS:
        weight = getattr(verifier, "target_weight", 1.0)
        declared = (
            (weight * first[0] + (1 - weight) * first[1])[:, None] * (weight * second[0] + (1 - weight) * second[1])
        ).flatten()  # (V * V,)
        laws.append(declared)
        output = target.generate(
            input_ids.repeat(num_rows, 1),
            assistant_model=draft,
            verifier=BlockVerifier(verifier),
            do_sample=True,
            max_new_tokens=3,
            num_assistant_tokens=2,
            generator=torch.Generator().manual_seed(0),
            return_dict_in_generate=True,
        )
        new = output.sequences[:, input_ids.shape[1] :]
        observed = empirical(new[:, 0] * vocab + new[:, 1], vocab * vocab)
        bound = tv_bound(declared, num_rows)
        assert bound < 0.03 and float(ops.total_variation(observed, declared)) < bound
        assert output.speculation.total_accepted > 0
    assert float(ops.total_variation(*laws)) > 0.03  # the two laws are told apart at this sample size


def test_generate_keyword_and_its_errors():
    target, draft = make_pair("llama", noise=0.3)
    enable_diversed(target)
    head = DiversedHead(DiversedHeadConfig(draft_hidden_size=32, target_hidden_size=32))
    common = dict(
        assistant_model=draft,
        do_sample=True,
        max_new_tokens=6,
        generator=torch.Generator().manual_seed(0),
        return_dict_in_generate=True,
    )
    by_keyword = target.generate(prompt(5), diversed_head=head, block_verification=True, **common)
    common["generator"] = torch.Generator().manual_seed(0)
    by_verifier = target.generate(prompt(5), verifier=BlockVerifier(HeadVerifier(head)), **common)
    assert torch.equal(by_keyword.sequences, by_verifier.sequences)
    with pytest.raises(TypeError, match="`block_verification` must be True or False, got 'yes'"):
        target.generate(prompt(5), verifier=ExactVerifier(), block_verification="yes", **common)
    with pytest.raises(ValueError, match="`block_verification`.*only applies"):
        target.generate(prompt(5), block_verification=True, max_new_tokens=2)
    wrong = DiversedHead(draft_hidden_size=17, target_hidden_size=23)  # the pair is checked through the wrapper too
    with pytest.raises(ValueError, match=r"draft 17, target 23.*draft 32, target 32"):
        target.generate(prompt(4), assistant_model=draft, verifier=BlockVerifier(HeadVerifier(wrong)))
    with pytest.raises(TypeError, match="`base` must be a token-wise Verifier"):
        BlockVerifier(BlockVerifier(ExactVerifier()))
    with pytest.raises(TypeError, match="`base` must be a token-wise Verifier"):
        BlockVerifier("exact")
    assert BlockVerifier(LenientVerifier(0.5)) == BlockVerifier(LenientVerifier(0.5))  # frozen: compares by value
