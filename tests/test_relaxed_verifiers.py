"""The field's relaxed acceptance rules (diversed_hf.verifiers.relaxed, diversed_hf.heads.judge): their defining
cases (the lossless settings give the target's law, the extreme ones keep every draft), the declared law of the first
token at other settings (batched rows), greedy decoding, trees, and bad knobs refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import VOCAB_SIZE, declared_first_token, empirical, make_pair, prompt, tv_bound
from transformers import GenerationConfig

from diversed_hf import FuzzyVerifier, JudgeHead, JudgeVerifier, TopKRelaxedVerifier, enable_diversed
from diversed_hf.verifiers import ExactVerifier, ops
from diversed_hf.verifiers.relaxed import divergence

SAMPLING = dict(do_sample=True, temperature=0.8, top_k=0, top_p=1.0)  # the processors the declared laws apply
TREE = dict(num_assistant_tokens=3, assistant_tree_top_k=2, assistant_tree_size=6)


@pytest.fixture(scope="module")
def pair():
    target, draft = make_pair("llama", noise=0.5)
    return enable_diversed(target), draft


def _first_tokens(target, draft, verifier, input_ids, num_rows: int, **options):
    out = target.generate(
        input_ids.repeat(num_rows, 1),
        assistant_model=draft,
        verifier=verifier,
        max_new_tokens=2,
        num_assistant_tokens=2,
        generator=torch.Generator().manual_seed(0),
        **SAMPLING,
        **options,
    )
    return empirical(out[:, input_ids.shape[1]], VOCAB_SIZE)


def _acceptance(target, draft, verifier, **options) -> float:
    out = target.generate(
        prompt(5, batch=8, seed=2),
        assistant_model=draft,
        verifier=verifier,
        max_new_tokens=12,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(1),
        **options,
    )
    return out.speculation.total_acceptance_rate


def _judge(target, bias: float) -> JudgeHead:
    """A judge that fires on some states and not others (random weights around ``bias``)."""
    judge = JudgeHead.for_target(target)
    with torch.no_grad():
        judge.linear.weight.copy_(torch.randn(judge.linear.weight.shape, generator=torch.Generator().manual_seed(3)))
        judge.linear.bias.fill_(bias)
    return judge


@pytest.mark.parametrize(
    "make",
    [
        lambda target: FuzzyVerifier(threshold=0.0),
        lambda target: TopKRelaxedVerifier(top_k=0, delta=1.0),
        lambda target: JudgeVerifier(_judge(target, 0.0), threshold=1.5),
    ],
    ids=["fuzzy-0", "topk-0", "judge-never"],
)
def test_the_lossless_settings_give_the_targets_law(pair, make):
    target, draft = pair
    input_ids = prompt(6, seed=5)
    num_rows = 4000
    observed = _first_tokens(target, draft, make(target), input_ids, num_rows)
    processors = target._get_logits_processor(GenerationConfig(**SAMPLING))
    with torch.no_grad():
        p = processors(input_ids, target(input_ids).logits[:, -1]).softmax(-1)[0].double()
    assert float(ops.total_variation(observed, p)) < tv_bound(p, num_rows)
    greedy_prompts = prompt(6, batch=3, seed=8)  # and greedy: the target's own output, batched
    greedy = target.generate(greedy_prompts, assistant_model=draft, verifier=make(target), max_new_tokens=12)
    assert torch.equal(greedy, target.generate(greedy_prompts, do_sample=False, max_new_tokens=12))


@pytest.mark.parametrize(
    "make",
    [
        lambda target: FuzzyVerifier(threshold=1.0),  # above ln 2, the largest JS divergence
        lambda target: TopKRelaxedVerifier(top_k=VOCAB_SIZE, delta=math.inf),
        lambda target: JudgeVerifier(_judge(target, 0.0), threshold=0.0),
    ],
    ids=["fuzzy-max", "topk-all", "judge-always"],
)
def test_the_extreme_settings_keep_every_draft(pair, make):
    target, draft = pair
    assert _acceptance(target, draft, make(target), **SAMPLING) == 1.0
    assert _acceptance(target, draft, make(target), do_sample=False) == 1.0


@pytest.mark.parametrize("verifier", [FuzzyVerifier(0.15), FuzzyVerifier(0.5, "tv"), TopKRelaxedVerifier(3, 1.0)])
def test_the_first_token_follows_the_declared_law(pair, verifier):
    """Fuzzy: pi = q where D(p, q) < threshold, else p. Top-k: o(x) = q(x) a(x) + (1 - beta) r(x)."""
    target, draft = pair
    input_ids = prompt(6, seed=9)
    declared, p = declared_first_token(target, draft, verifier, input_ids, SAMPLING)
    assert float(ops.total_variation(declared, p)) > 0.05  # the setting tells the rule from lossless SD
    num_rows = 5000
    observed = _first_tokens(target, draft, verifier, input_ids, num_rows)
    assert float(ops.total_variation(observed, declared.double())) < tv_bound(declared, num_rows)


def test_a_judges_first_token_follows_its_declared_law(pair):
    """Kept when the judge fires on the state after the drafted token, else with min(1, p / q); recovered from
    norm(max(0, p - q))."""
    target, draft = pair
    judge = _judge(target, 2.0)
    verifier = JudgeVerifier(judge, threshold=0.5)
    input_ids = prompt(6, seed=9)
    processors = target._get_logits_processor(GenerationConfig(**SAMPLING))
    with torch.no_grad():
        p = processors(input_ids, target(input_ids).logits[:, -1]).softmax(-1)[0].double()
        q = processors(input_ids, draft(input_ids).logits[:, -1]).softmax(-1)[0].double()
        after = torch.cat([input_ids.repeat(VOCAB_SIZE, 1), torch.arange(VOCAB_SIZE)[:, None]], dim=1)
        states = target(after, output_hidden_states=True).hidden_states[-1][:, -1]  # (V, d) after each token
        fires = judge(states).double() >= 0.5
    assert 0 < int(fires.sum()) < VOCAB_SIZE  # the judge tells tokens apart
    acceptance = torch.where(fires, torch.ones_like(p), torch.clamp(p / q, max=1.0))
    kept = q * acceptance
    declared = kept + (1 - kept.sum()) * ops.residual(p, q, fallback=p)
    assert float(ops.total_variation(declared, p)) > 0.05
    num_rows = 5000
    observed = _first_tokens(target, draft, verifier, input_ids, num_rows)
    assert float(ops.total_variation(observed, declared)) < tv_bound(declared, num_rows)


def test_greedy_rules_keep_what_they_relax_and_emit_argmax_p_otherwise():
    p = torch.tensor([[[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]])  # (1, N + 1, 4)
    q = torch.tensor([[[0.1, 0.8, 0.05, 0.05], [0.7, 0.1, 0.1, 0.1]]])  # (1, N, 4)
    drafts = torch.tensor([[1, 0]])  # within delta of the top-1 at position 1; far below it at position 2
    result = TopKRelaxedVerifier(top_k=2, delta=0.6)(drafts, q, p, do_sample=False)
    assert result.num_accepted.tolist() == [1] and result.next_tokens.tolist() == [3]
    strict = TopKRelaxedVerifier(top_k=2, delta=0.1)(drafts, q, p, do_sample=False)
    assert strict.num_accepted.tolist() == [0] and strict.next_tokens.tolist() == [0]
    lossless = ExactVerifier()(drafts, q, p, do_sample=False)
    assert lossless.num_accepted.tolist() == [0]


def test_divergences_are_zero_for_equal_distributions_and_bounded():
    p = torch.tensor([0.7, 0.2, 0.1, 0.0])
    assert float(divergence(p, p)) == pytest.approx(0.0, abs=1e-7)
    assert float(divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))) == pytest.approx(math.log(2))
    assert float(divergence(p, torch.tensor([0.1, 0.2, 0.7, 0.0]), "tv")) == pytest.approx(0.6)


def test_fuzzy_verifies_trees_and_the_others_are_refused_on_trees_by_name(pair):
    target, draft = pair
    out = target.generate(prompt(5), assistant_model=draft, verifier=FuzzyVerifier(0.2), max_new_tokens=8, **TREE)
    assert out.shape == (1, 13)
    for verifier in (TopKRelaxedVerifier(2, 0.5), JudgeVerifier(JudgeHead.for_target(target))):
        with pytest.raises(ValueError, match=rf"{type(verifier).__name__} has no token-tree form"):
            target.generate(prompt(5), assistant_model=draft, verifier=verifier, max_new_tokens=8, **TREE)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: FuzzyVerifier(threshold=-0.1), r"`threshold` must be a non-negative number, got -0.1"),
        (lambda: FuzzyVerifier(threshold=0.1, divergence="kl"), r"`divergence` must be one of \('js', 'tv'\)"),
        (lambda: TopKRelaxedVerifier(top_k=-1), r"`top_k` must be a non-negative integer, got -1"),
        (lambda: TopKRelaxedVerifier(top_k=1.5), r"`top_k` must be a non-negative integer, got 1.5"),
        (lambda: TopKRelaxedVerifier(top_k=2, delta=-1.0), r"`delta` must be a non-negative number, got -1.0"),
        (lambda: JudgeVerifier(None), r"`judge` must be a `JudgeHead`"),
        (lambda: JudgeVerifier(JudgeHead(8), threshold=-1), r"`threshold` must be a non-negative number, got -1"),
        (lambda: JudgeHead(0), r"`hidden_size` must be a positive integer"),
    ],
)
def test_bad_knobs_are_refused_by_name(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


def test_a_judge_for_another_width_is_refused_before_any_forward(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(draft, "forward", lambda *a, **k: pytest.fail("a model ran"))
    with pytest.raises(ValueError, match=r"`judge` reads hidden states of size 48, and the target's are 32"):
        target.generate(prompt(5), assistant_model=draft, verifier=JudgeVerifier(JudgeHead(48)), max_new_tokens=4)


def test_a_judge_saves_and_loads_with_a_card(pair, tmp_path):
    target, _ = pair
    judge = _judge(target, -1.0)
    judge.save_pretrained(tmp_path / "judge")
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in (tmp_path / "judge").iterdir()}
    assert "JudgeVerifier(judge, threshold=0.5)" in (tmp_path / "judge" / "README.md").read_text()
    loaded = JudgeHead.from_pretrained(tmp_path / "judge")
    assert loaded.config.hidden_size == 32
    assert torch.equal(loaded.linear.weight, judge.linear.weight)


def test_the_testbed_ships_its_summary_judge_with_its_operating_point():
    """benchmarks/relaxed_results.py ships a judge only where a threshold keeps the target's quality and accepts
    more than SD: on the testbed that is summary's; arith's is refused by name with the command that trains one."""
    import json

    from diversed_hf import testbed
    from diversed_hf.heads.judge import JudgeHead

    judge = testbed.load_judge("summary")
    assert isinstance(judge, JudgeHead) and not judge.training
    assert judge.config.hidden_size == testbed.load_pair()[0].config.hidden_size
    record = json.loads((testbed.ASSETS_DIR / "judges" / "summary" / "training.json").read_text())
    assert 0 <= record["operating_point"]["threshold"] <= 1 and record["recipe"].startswith("python training/")
    with pytest.raises(FileNotFoundError, match=r"no shipped judge for 'arith'.*train_judge.py --task arith"):
        testbed.load_judge("arith")
    with pytest.raises(ValueError, match="judges ship for"):
        testbed.load_judge("summary", pair="smollm2")
    # no judge of the task-tuned pair is an operating point (RESULTS.md): the error names the command for that pair
    with pytest.raises(FileNotFoundError, match=r"train_judge.py --target smollm2-tuned --task synopsis"):
        testbed.load_judge("synopsis", pair="smollm2-tuned")


def test_block_verification_refuses_a_judge(pair):
    """A judge keeps a draft by the state after that very token: block verification has no ``pi`` for it."""
    from diversed_hf.verifiers import BlockVerifier

    target, draft = pair
    judge = JudgeVerifier(JudgeHead.for_target(target), threshold=0.0)
    with pytest.raises(ValueError, match="Block verification .* cannot run JudgeVerifier"):
        BlockVerifier(judge)
    with pytest.raises(ValueError, match="Block verification .* cannot run JudgeVerifier"):
        target.generate(prompt(4), assistant_model=draft, verifier=judge, block_verification=True, max_new_tokens=4)


def test_a_judge_is_not_saved_over_another_model(pair, tmp_path):
    from diversed_hf import DiversedHead

    target, draft = pair
    head = DiversedHead.for_pair(target, draft)
    head.save_pretrained(tmp_path / "head")
    before = {p.name: p.read_bytes() for p in (tmp_path / "head").iterdir()}
    with pytest.raises(ValueError, match="holds another model's config.json"):
        JudgeHead.for_target(target).save_pretrained(tmp_path / "head")
    assert {p.name: p.read_bytes() for p in (tmp_path / "head").iterdir()} == before
    DiversedHead.from_pretrained(tmp_path / "head")  # still loads
    judge = JudgeHead.for_target(target)
    judge.save_pretrained(tmp_path / "judge")
    judge.save_pretrained(tmp_path / "judge")  # over itself: fine


def test_bad_judges_and_top_k_are_refused_where_they_are_made(pair, tmp_path):
    from diversed_hf import DiversedHead

    target, draft = pair
    with pytest.raises(ValueError, match="`top_k` must be a non-negative integer, got inf"):
        TopKRelaxedVerifier(top_k=float("inf"))
    with pytest.raises(TypeError, match="`judge` must be a `JudgeHead`.*got DiversedHead.*diversed_head=head"):
        JudgeVerifier(DiversedHead.for_pair(target, draft))
    judge = JudgeHead.for_target(target)
    with torch.no_grad():
        judge.linear.weight.fill_(float("nan"))
    judge.save_pretrained(tmp_path / "nan")
    with pytest.raises(ValueError, match=r"hold NaN or infinite values \(`linear.weight`\)"):
        JudgeHead.from_pretrained(tmp_path / "nan")
    with pytest.raises(FileNotFoundError, match="not found in the head directory"):
        (tmp_path / "empty").mkdir()
        JudgeHead.from_pretrained(tmp_path / "empty")
