"""The draft's per-batch plan (``assistant_batch_plan``, ``diversed_hf.generation.batch_plan``): per batch size the
draft's own shape, a chain of N drafts, or the target alone; chosen from measured tokens/s; lossless calls that leave
the drafting to the draft only; the target's law at every batch size."""

import pytest
import torch
from tiny_models import VOCAB_SIZE, empirical, make_pair, prompt, tv_bound

from diversed_hf import ExactVerifier, StaticEnsembleVerifier, enable_diversed
from diversed_hf.generation import batch_plan, batch_rule
from diversed_hf.generation.batch_plan import PLAN, BatchPlan, plan_from_throughput

TREE = dict(num_assistant_tokens=3, assistant_tree_top_k=2, assistant_tree_size=4)


@pytest.fixture
def pair():
    target, draft = make_pair("llama")
    for knob, value in TREE.items():
        setattr(draft.generation_config, knob, value)  # a draft shipped with its tree
    setattr(draft.generation_config, PLAN, [[1, None], [2, 1], [3, 0]])
    return enable_diversed(target), draft


def _generate(target, draft, batch: int, **kwargs):
    return target.generate(
        prompt(5, batch=batch),
        assistant_model=draft,
        max_new_tokens=6,
        do_sample=False,
        return_dict_in_generate=True,
        **kwargs,
    )


def test_each_batch_size_gets_its_choice(pair):
    target, draft = pair
    alone = _generate(target, draft, 1, verifier=ExactVerifier()).speculation
    assert alone.tree_nodes is not None  # batch 1: the draft's own tree
    two = _generate(target, draft, 2, verifier=ExactVerifier()).speculation
    assert two.tree_nodes is None and two.num_draft_tokens == 1 and two.total_drafted > 0  # a chain of one
    four = _generate(target, draft, 4, verifier=ExactVerifier())
    assert four.speculation.total_drafted == 0 and four.speculation.disabled_by_batch_size == 2  # the target alone
    assert torch.equal(four.sequences, target.generate(prompt(5, batch=4), max_new_tokens=6, do_sample=False))


def test_the_plan_stays_out_of_calls_that_choose_their_drafting_or_a_relaxed_law(pair):
    target, draft = pair
    for kwargs in (
        dict(verifier=ExactVerifier(), num_assistant_tokens=2),
        dict(verifier=ExactVerifier(), output_target_weights=True),
        dict(verifier=StaticEnsembleVerifier(0.5)),
    ):
        stats = _generate(target, draft, 4, **kwargs).speculation
        assert stats.disabled_by_batch_size is None and stats.total_drafted > 0, kwargs
    # the keyword applies whatever else the call passes, and beats the draft's plan
    stats = _generate(target, draft, 4, verifier=ExactVerifier(), num_assistant_tokens=2, **{PLAN: [[8, 2]]})
    assert stats.speculation.total_drafted > 0 and stats.speculation.num_draft_tokens == 2


@pytest.mark.parametrize("choice", [None, 1, 0], ids=["configured", "chain of 1", "target alone"])
def test_the_law_is_the_targets_whatever_the_plan_chooses(pair, choice):
    """The first sampled token of 600 copies of one prompt (one call, two new tokens so that the first is drafted):
    the target's next-token distribution."""
    target, draft = pair
    torch.manual_seed(0)
    rows = prompt(5).repeat(600, 1)
    out = target.generate(
        rows, assistant_model=draft, verifier=ExactVerifier(), max_new_tokens=2, do_sample=True,
        return_dict_in_generate=True, **{PLAN: [[600, choice]]},
    )  # fmt: skip
    assert (out.speculation.total_drafted == 0) == (choice == 0)
    with torch.no_grad():
        expected = target(rows[:1]).logits[0, -1].softmax(-1)
    observed = empirical(out.sequences[:, rows.shape[1]], VOCAB_SIZE)
    assert 0.5 * (observed - expected[:VOCAB_SIZE]).abs().sum() <= tv_bound(expected, rows.shape[0])


@pytest.mark.parametrize(
    "pairs, match",
    [
        ([], "give a list of"),
        ([[2, None], [1, 0]], "the bound 1 after 2"),
        ([[0, None]], "the bound 0 after 0"),
        ([[4, -1]], "the choice -1 for up to 4 rows"),
        ([[4, "tree"]], "the choice 'tree'"),
        ([4, 0], "holds 4, not a"),
    ],
)
def test_a_bad_plan_is_refused_by_name(pair, pairs, match):
    target, draft = pair
    with pytest.raises(ValueError, match=rf"`{PLAN}`.* {match}"):
        _generate(target, draft, 2, verifier=ExactVerifier(), **{PLAN: pairs})
    setattr(draft.generation_config, PLAN, pairs)
    with pytest.raises(ValueError, match=rf"the draft's generation_config's `{PLAN}`.* {match}"):
        _generate(target, draft, 2, verifier=ExactVerifier())


def test_a_plan_and_a_limit_together_are_refused(pair):
    target, draft = pair
    setattr(draft.generation_config, batch_rule.KNOB, 2)
    with pytest.raises(ValueError, match=rf"both `{batch_rule.KNOB}` \(2\) and `{PLAN}`.*keep one"):
        _generate(target, draft, 2, verifier=ExactVerifier())


def test_the_plan_needs_a_verifier_like_the_limit(pair):
    target, draft = pair
    with pytest.raises(ValueError, match=rf"`{PLAN}` only applies to relaxed speculative decoding"):
        target.generate(prompt(5), assistant_model=draft, max_new_tokens=2, **{PLAN: [[1, None]]})


def test_a_plan_from_measured_throughput_keeps_speculation_only_where_it_wins():
    measured = {
        1: {"target-only": 20.0, "configured": 30.0, "chain 2": 25.0},
        2: {"target-only": 38.0, "configured": 40.0, "chain 2": 44.0},
        4: {"target-only": 70.0, "configured": 60.0, "chain 2": 73.0},
        8: {"target-only": 130.0, "configured": 90.0, "chain 2": 131.0},  # 0.8 % faster: within the margin
        16: {"target-only": 200.0, "configured": 100.0, "chain 2": 150.0},
    }
    plan = plan_from_throughput(measured, {"configured": None, "chain 2": 2})
    assert plan.to_list() == [[1, None], [4, 2], [16, 0]]
    assert [plan.choose(rows) for rows in (1, 2, 3, 4, 5, 16, 64)] == [None, 2, 2, 2, 0, 0, 0]
    assert plan.speculates_up_to(16) == 4
    with pytest.raises(ValueError, match="no 'target-only' figure"):
        plan_from_throughput({1: {"chain 2": 3.0}}, {"chain 2": 2})
    with pytest.raises(ValueError, match=r"does not map to a choice: \['tree'\]"):
        plan_from_throughput({1: {"target-only": 1.0, "tree": 3.0}}, {"chain 2": 2})


def test_plan_of_reads_the_keyword_then_the_calls_config_then_the_drafts(pair):
    _, draft = pair
    assert batch_plan.plan_of(draft, None, [[3, 0]]).to_list() == [[3, 0]]
    assert batch_plan.plan_of(draft, None, None).to_list() == [[1, None], [2, 1], [3, 0]]
    assert BatchPlan([[2, 1]]).choose(9) == 1  # beyond the last bound: its choice
