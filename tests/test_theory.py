"""Theory (docs/method.md §6): the tokens-per-round estimators against Monte Carlo simulation of speculative rounds,
the i.i.d. and speedup formulas, and the single-step Pareto front."""

import math

import pytest
import torch

from diversed_hf.verifiers import (
    CASCADE_RULES,
    ExactVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    Verifier,
    ops,
    theory,
)


def random_probs(*shape, generator, scale=2.0):
    return (scale * torch.randn(*shape, generator=generator, dtype=torch.float64)).softmax(-1)


# ------------------------------------------------------------------------------------------------
# A context-dependent "language model": the distributions at draft position t depend on the token
# drafted at t - 1 (a Markov chain per position). Small enough to enumerate exactly.


def markov_tables(num_draft, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    draft_table = random_probs(num_draft, vocab, vocab, generator=generator)  # (N, prev, vocab) q_t(. | x_{t-1})
    target_table = random_probs(num_draft + 1, vocab, vocab, generator=generator)  # (N + 1, prev, vocab)
    return draft_table, target_table


def exact_by_enumeration(verifier, draft_table, target_table, start_token=0):
    """E[T_N] = 1 + sum_k P(first k accepted), with P(first k accepted) = sum_{x_1..x_k} prod q_t(x_t) a_t(x_t),
    computed by a forward recursion over the previous token; and the beta-product form 1 + sum_k E[prod beta_t]."""
    num_draft, vocab, _ = draft_table.shape
    verify, _ = verifier.verification_probs(draft_table, target_table[:num_draft])  # (N, prev, vocab)
    acceptance = verifier.token_acceptance(draft_table, target_table[:num_draft], verify)  # (N, prev, vocab)
    kept_mass = draft_table * acceptance  # (N, prev, vocab) q_t(x | prev) a_t(x | prev)
    betas = kept_mass.sum(-1)  # (N, prev)
    accepted = torch.zeros(vocab, dtype=torch.float64)  # P(first t accepted, x_t = x)
    accepted[start_token] = 1.0
    drafted = accepted.clone()  # E[prod_{s<t} beta_s ; x_{t-1} = x] along q-drafted prefixes
    exact, spec_form = 1.0, 1.0
    for t in range(num_draft):
        spec_reach = drafted * betas[t]  # (prev,)
        spec_form += float(spec_reach.sum())
        drafted = spec_reach @ draft_table[t]  # (vocab,)
        accepted = accepted @ kept_mass[t]  # (vocab,)
        exact += float(accepted.sum())
    return exact, spec_form


def simulate_rounds(verifier, draft_table, target_table, num_rounds, seed, start_token=0):
    """Draft ``num_rounds`` rounds from the tables and verify them in one batched verifier call."""
    num_draft, vocab, _ = draft_table.shape
    generator = torch.Generator().manual_seed(seed)
    previous = torch.full((num_rounds,), start_token, dtype=torch.long)  # (R,)
    draft_ids, draft_probs, target_probs = [], [], []
    for t in range(num_draft + 1):
        target_probs.append(target_table[t, previous])  # (R, vocab)
        if t == num_draft:
            break
        probs = draft_table[t, previous]  # (R, vocab)
        token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (R,)
        draft_probs.append(probs)
        draft_ids.append(token)
        previous = token
    draft_ids = torch.stack(draft_ids, 1)  # (R, N)
    draft_probs = torch.stack(draft_probs, 1)  # (R, N, vocab)
    target_probs = torch.stack(target_probs, 1)  # (R, N + 1, vocab)
    result = verifier(draft_ids, draft_probs, target_probs, generator=generator)
    verify, _ = verifier.verification_probs(draft_probs, target_probs[:, :num_draft])
    acceptance = verifier.token_acceptance(draft_probs, target_probs[:, :num_draft], verify)  # (R, N, vocab)
    drafted_acceptance = acceptance.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)  # (R, N)
    return result, drafted_acceptance


@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(0.4)], ids=repr)
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_estimator_matches_monte_carlo_on_context_dependent_models(verifier, seed):
    draft_table, target_table = markov_tables(num_draft=4, vocab=5, seed=seed)
    exact, _ = exact_by_enumeration(verifier, draft_table, target_table)
    num_rounds = 40_000
    result, drafted_acceptance = simulate_rounds(verifier, draft_table, target_table, num_rounds, seed=10 + seed)
    tokens = (result.num_accepted + 1).double()  # (R,) measured T_N
    standard_error = float(tokens.std()) / math.sqrt(num_rounds)
    assert abs(float(tokens.mean()) - exact) < 5 * standard_error, (float(tokens.mean()), exact)
    estimate = theory.expected_tokens_per_round(result.position_acceptance, drafted_acceptance, per_round=True)
    estimator_error = float(estimate.std()) / math.sqrt(num_rounds)
    assert abs(float(estimate.mean()) - exact) < 5 * estimator_error + 1e-9
    # Rao-Blackwellised: never noisier than counting accepted tokens.
    assert estimate.std() <= tokens.std()


def test_product_of_betas_is_biased_when_acceptance_depends_on_context():
    """q_1 uniform on {A, B}, p_1 = delta_A; after A the models disagree, after B they agree: E[T_2] = 1.5."""
    A, B, _C = 0, 1, 2  # the three tokens (C appears in the tables only)
    draft_table = torch.zeros(2, 3, 3, dtype=torch.float64)
    draft_table[0, :] = torch.tensor([0.5, 0.5, 0.0])
    draft_table[1, :] = torch.tensor([0.0, 0.0, 1.0])  # position 2 always drafts C
    target_table = torch.full((3, 3, 3), 1 / 3, dtype=torch.float64)
    target_table[0, :] = torch.tensor([1.0, 0.0, 0.0])
    target_table[1, A] = torch.tensor([1.0, 0.0, 0.0])
    target_table[1, B] = torch.tensor([0.0, 0.0, 1.0])
    exact, spec_form = exact_by_enumeration(ExactVerifier(), draft_table, target_table)
    assert exact == pytest.approx(1.5) and spec_form == pytest.approx(1.75)
    result, drafted_acceptance = simulate_rounds(ExactVerifier(), draft_table, target_table, 20_000, seed=0)
    assert float((result.num_accepted + 1).double().mean()) == pytest.approx(1.5, abs=0.02)
    assert float(theory.expected_tokens_per_round(result.position_acceptance, drafted_acceptance)) == pytest.approx(
        1.5, abs=0.02
    )
    assert float(theory.beta_product_tokens_per_round(result.position_acceptance)) == pytest.approx(1.75, abs=0.02)


def test_both_estimators_agree_when_acceptance_depends_on_position_only():
    """Context-free distributions that differ by position: the beta-product form is exact, the i.i.d. formula is not."""
    generator = torch.Generator().manual_seed(3)
    num_draft, vocab = 4, 6
    draft_table = random_probs(num_draft, 1, vocab, generator=generator).expand(-1, vocab, -1)
    target_table = random_probs(num_draft + 1, 1, vocab, generator=generator).expand(-1, vocab, -1)
    # Make position 1 nearly agree and the later ones disagree: acceptance decays with position.
    target_table = target_table.clone()
    target_table[0] = 0.9 * draft_table[0] + 0.1 * target_table[0]
    exact, spec_form = exact_by_enumeration(ExactVerifier(), draft_table, target_table)
    assert spec_form == pytest.approx(exact, abs=1e-12)
    result, drafted_acceptance = simulate_rounds(ExactVerifier(), draft_table, target_table, 20_000, seed=4)
    spec_estimate = theory.beta_product_tokens_per_round(result.position_acceptance)
    assert float(spec_estimate) == pytest.approx(exact, abs=1e-9)  # betas are constant: no noise at all
    mean_acceptance = float(result.position_acceptance.mean())
    assert abs(theory.iid_tokens_per_round(mean_acceptance, num_draft) - exact) > 0.05


def test_expected_tokens_reduces_to_iid_formula_for_constant_acceptance():
    for alpha in (0.0, 0.3, 0.75, 0.999, 1.0):
        betas = torch.full((7, 5), alpha)
        expected = 6.0 if alpha == 1.0 else (1 - alpha**6) / (1 - alpha)
        assert float(theory.beta_product_tokens_per_round(betas)) == pytest.approx(expected)
        assert theory.iid_tokens_per_round(alpha, 5) == pytest.approx(expected)
        assert float(theory.expected_tokens_per_round(betas, betas)) == pytest.approx(expected)
    assert theory.iid_tokens_per_round(1.0 + 6e-7, 5) == pytest.approx(6.0)  # float32 rounding above 1 is clamped
    tensor = theory.iid_tokens_per_round(torch.tensor([0.0, 0.5, 1.0]), 2)
    assert torch.allclose(tensor, torch.tensor([1.0, 1.75, 3.0], dtype=torch.float64))


def test_nan_positions_end_the_round():
    betas = torch.tensor([[0.5, float("nan"), float("nan")], [1.0, 1.0, 1.0]])
    assert theory.beta_product_tokens_per_round(betas, per_round=True).tolist() == [1.5, 4.0]
    assert theory.expected_tokens_per_round(betas, betas, per_round=True).tolist() == [1.5, 4.0]
    assert torch.allclose(theory.position_acceptance(betas), torch.tensor([0.75, 1.0, 1.0], dtype=torch.float64))
    assert math.isnan(float(theory.expected_tokens_per_round(torch.zeros(0, 3), torch.zeros(0, 3))))


def test_bad_arguments_raise_naming_the_argument():
    with pytest.raises(ValueError, match="position_acceptance"):
        theory.expected_tokens_per_round(torch.ones(5), torch.ones(5))
    with pytest.raises(ValueError, match="`drafted_acceptance`.*is required"):
        theory.expected_tokens_per_round(torch.ones(2, 3), None)
    with pytest.raises(ValueError, match="drafted_acceptance"):
        theory.expected_tokens_per_round(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="alpha"):
        theory.iid_tokens_per_round(1.5, 3)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        theory.iid_tokens_per_round(0.5, -1)


def test_speedup_model():
    assert theory.predicted_speedup(3.0, 4, 0.25) == pytest.approx(1.5)
    assert theory.predicted_speedup(1.0, 0, 0.5) == pytest.approx(1.0)  # no drafting: target-only
    # Perfect free drafts: N + 1 tokens per target pass.
    assert theory.predicted_speedup(theory.iid_tokens_per_round(1.0, 5), 5, 0.0) == pytest.approx(6.0)


# ------------------------------------------------------------------------------------------------
# Single-step Pareto front: bias + rejection >= TV(p, q); the static ensemble is on it.


@pytest.mark.parametrize("weight", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_static_ensemble_lies_on_the_front(weight):
    generator = torch.Generator().manual_seed(0)
    draft_probs = random_probs(64, 3, 12, generator=generator)  # (batch, N, vocab)
    target_probs = random_probs(64, 3, 12, generator=generator)
    tradeoff = theory.single_step_tradeoff(StaticEnsembleVerifier(weight), draft_probs, target_probs)
    tv = ops.total_variation(target_probs, draft_probs)
    assert torch.allclose(tradeoff.rejection, weight * tv, atol=1e-12)
    assert torch.allclose(tradeoff.bias, (1 - weight) * tv, atol=1e-12)
    assert tradeoff.gap.abs().max() < 1e-12
    rejection, bias = theory.static_ensemble_tradeoff(draft_probs, target_probs, weight)
    assert torch.allclose(rejection, tradeoff.rejection) and torch.allclose(bias, tradeoff.bias)
    # The emitted distribution is the mixture itself.
    assert torch.allclose(tradeoff.output_probs, weight * target_probs + (1 - weight) * draft_probs, atol=1e-12)


RULES = [
    LenientVerifier(0.3),
    LenientVerifier(0.7),
    StaticEnsembleVerifier(0.5, mixing="logits"),
    *[SpecCascadeVerifier(rule, alpha) for rule in CASCADE_RULES for alpha in (0.1, 0.4)],
]


@pytest.mark.parametrize("verifier", RULES, ids=repr)
def test_every_rule_is_on_or_above_the_front(verifier):
    generator = torch.Generator().manual_seed(1)
    draft_probs = random_probs(256, 2, 10, generator=generator)
    target_probs = random_probs(256, 2, 10, generator=generator)
    tradeoff = theory.single_step_tradeoff(verifier, draft_probs, target_probs)
    assert tradeoff.gap.min() > -1e-9
    assert torch.allclose(tradeoff.output_probs.sum(-1), torch.ones(256, 2, dtype=torch.float64))


ON_THE_FRONT = [LenientVerifier(0.5), *[SpecCascadeVerifier(rule, 0.3) for rule in ("chow", "diff", "opt")]]
ABOVE_THE_FRONT = [
    StaticEnsembleVerifier(0.5, mixing="logits"),
    *[SpecCascadeVerifier(rule, 0.3) for rule in CASCADE_RULES[3:]],
]


@pytest.mark.parametrize("verifier", ON_THE_FRONT, ids=repr)
def test_lossy_sd_and_deferral_cascades_are_on_the_front_one_step_at_a_time(verifier):
    """Lossy SD accepts everything where p >= q and recovers from norm(max(0, p - q)), so bias + rejection
    = sum_{p<q} (q - p) = TV; a deferral rule picks w in {0, 1}: both are single-step optimal."""
    generator = torch.Generator().manual_seed(2)
    draft_probs = random_probs(256, 1, 10, generator=generator)
    target_probs = random_probs(256, 1, 10, generator=generator)
    tradeoff = theory.single_step_tradeoff(verifier, draft_probs, target_probs)
    assert tradeoff.gap.abs().max() < 1e-12


@pytest.mark.parametrize("verifier", ABOVE_THE_FRONT, ids=repr)
def test_geometric_pool_and_token_level_cascades_can_be_above_the_front(verifier):
    generator = torch.Generator().manual_seed(2)
    draft_probs = random_probs(256, 1, 10, generator=generator)
    target_probs = random_probs(256, 1, 10, generator=generator)
    tradeoff = theory.single_step_tradeoff(verifier, draft_probs, target_probs)
    assert tradeoff.gap.max() > 1e-2


class RandomRule(Verifier):
    """An arbitrary single-step rule: random acceptance a(x) in [0, 1] and random recovery distribution."""

    def __init__(self, acceptance, recovery):
        self._acceptance, self._recovery = acceptance, recovery

    def verification_probs(self, draft_probs, target_probs, **context):
        return ops.emitted_distribution(draft_probs, self._acceptance, self._recovery), None

    def token_acceptance(self, draft_probs, target_probs, verify_probs):
        return self._acceptance

    def residual_probs(self, draft_probs, target_probs, verify_probs):
        return self._recovery


def test_arbitrary_rules_satisfy_the_bound():
    """Prop. 1 for rules nobody designed: bias + rejection >= TV(p, q)."""
    generator = torch.Generator().manual_seed(5)
    draft_probs = random_probs(2048, 1, 6, generator=generator)
    target_probs = random_probs(2048, 1, 6, generator=generator)
    acceptance = torch.rand(2048, 1, 6, generator=generator, dtype=torch.float64) ** 3
    recovery = random_probs(2048, 1, 6, generator=generator, scale=4.0)
    tradeoff = theory.single_step_tradeoff(RandomRule(acceptance, recovery), draft_probs, target_probs)
    assert tradeoff.gap.min() > -1e-12
    gap = theory.front_gap(tradeoff.rejection, tradeoff.bias, tradeoff.total_variation)
    assert torch.equal(gap, tradeoff.gap)


def test_single_position_inputs():
    draft_probs = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    target_probs = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    tradeoff = theory.single_step_tradeoff(ExactVerifier(), draft_probs, target_probs)
    assert float(tradeoff.rejection) == pytest.approx(0.5) and float(tradeoff.bias) == pytest.approx(0.0)
    assert tradeoff.output_probs.shape == (3,)
