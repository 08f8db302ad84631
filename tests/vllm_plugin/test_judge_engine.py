"""Judge decoding served: an engine loads judges (``additional_config["diversed"]["judges"]``) and a request picks one
with its threshold (``extra_args={"diversed": {"judge": {...}}}``). The judge reads the target's state after each
drafted token, as under ``generate``: greedy output equals ``generate`` with ``JudgeVerifier``, the sampled token at
the first drafted position follows the rule's own law, a threshold above 1 is lossless and 0 keeps every draft."""

import math

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in vLLM's environment (.ci/vllm)")

import torch
from vllm_helpers import (
    check_greedy_parity,
    check_rules_law_and_acceptance,
    engine,
    law_candidates,
    next_probs,
    pair,
    prompt_ids,
    shutdown,
    spec_metrics,
    vllm_prompts,
)

from diversed_hf.heads.judge import JudgeHead
from diversed_hf.verifiers import ExactVerifier, JudgeVerifier, StaticEnsembleVerifier, ops


@pytest.fixture(scope="module")
def models():
    return pair()


@pytest.fixture(scope="module")
def judge(tmp_path_factory, models):
    """A judge for the testbed target that fires on about half the states it reads (seeded random weights)."""
    target, _, _ = models
    judge = JudgeHead.for_target(target, task="arith")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        judge.linear.weight.copy_(torch.randn(judge.linear.weight.shape, generator=generator))
        judge.linear.bias.zero_()
    path = tmp_path_factory.mktemp("judge") / "arith"
    judge.save_pretrained(path)
    return JudgeHead.from_pretrained(path).eval(), str(path)


@pytest.fixture(scope="module")
def llm(judge):
    llm = engine({"diversed": {"target_weight": 1.0, "judges": {"arith": judge[1]}}})
    yield llm
    shutdown(llm)


def test_a_greedy_batch_with_judged_requests_equals_generate(llm, judge, models):
    target, draft, tokenizer = models
    prompts = prompt_ids(tokenizer, 8, "arith")
    rules = [
        (JudgeVerifier(judge[0], threshold=0.5), {"diversed": {"judge": "arith"}}),
        (ExactVerifier(), None),
    ]
    chosen = [rules[index % 2] for index in range(len(prompts))]
    judged = [verifier for verifier, _ in chosen]
    check_greedy_parity(llm, judged, target, draft, prompts, extra_args=[extra for _, extra in chosen])
    context = torch.tensor([prompts[0]])
    outputs = [
        target.generate(context, assistant_model=draft, verifier=rule, do_sample=False, max_new_tokens=40)
        for rule in (judged[0], ExactVerifier())
    ]
    assert not torch.equal(*outputs), "the judge must change the greedy text for the test to mean anything"


@torch.no_grad()
def judge_law(verifier, target, draft, ids):
    """The token law at the position after ``ids`` and the chance the draft is kept: the draft ``x ~ q`` is kept when
    the judge fires on the target's state after ``x`` or with ``min(1, p(x) / q(x))``; else ``norm(max(0, p - q))``."""
    target_probs, draft_probs = next_probs(target, ids), next_probs(draft, ids)
    vocab = target_probs.numel()
    states = []
    for start in range(0, vocab, 512):  # the state after every candidate drafted token
        candidates = torch.arange(start, min(start + 512, vocab))[:, None]  # (b, 1)
        batch = torch.cat([torch.tensor([ids]).expand(len(candidates), -1), candidates], dim=1)
        states.append(target(batch, output_hidden_states=True).hidden_states[-1][:, -1])
    fires = verifier.fires(torch.cat(states)[None])[0]  # (vocab,)
    kept = torch.where(fires, torch.ones_like(draft_probs), ops.ratio_acceptance(draft_probs, target_probs))
    beta = float((draft_probs * kept).sum())
    residual = ops.residual(target_probs, draft_probs, fallback=target_probs)
    return draft_probs * kept + (1 - beta) * residual, target_probs, beta


def test_a_sampled_judged_request_follows_the_rules_law(llm, judge, models):
    from tiny_models import empirical, tv_bound
    from vllm import SamplingParams

    target, draft, tokenizer = models
    verifier = JudgeVerifier(judge[0], threshold=0.5)
    for ids in law_candidates(tokenizer):
        first = int(next_probs(target, ids).argmax())
        if float(next_probs(target, ids)[first]) < 0.99:
            continue
        law, target_probs, beta = judge_law(verifier, target, draft, ids + [first])
        if 0.5 * float((law - target_probs).abs().sum()) > 0.15:
            break
    else:
        raise AssertionError("no candidate prompt has a nearly fixed first token and the judge's law far from p")
    num_requests = 3000
    params = SamplingParams(temperature=1.0, max_tokens=2, extra_args={"diversed": {"judge": "arith"}})
    before = spec_metrics(llm)
    outputs = llm.generate(vllm_prompts([ids] * num_requests), params, use_tqdm=False)
    after = spec_metrics(llm)
    tokens = torch.tensor([list(output.outputs[0].token_ids)[:2] for output in outputs])  # (requests, 2)
    kept = tokens[tokens[:, 0] == first, 1]
    bound = tv_bound(law, kept.numel())
    assert float(ops.total_variation(target_probs, law)) > 2 * bound, "the test must tell the law from p"
    assert float(ops.total_variation(empirical(kept, law.numel()), law)) < bound
    accepted = after["num_accepted_tokens_per_pos"][0] - before["num_accepted_tokens_per_pos"][0]
    drafts = after["num_drafts"] - before["num_drafts"]
    hoeffding = (math.log(2 / 1e-6) / (2 * drafts)) ** 0.5
    assert drafts == num_requests and kept.numel() > 0.95 * num_requests
    assert abs(accepted / drafts - beta) < hoeffding + (1 - kept.numel() / num_requests)  # other first tokens


def test_a_threshold_above_one_is_lossless_and_zero_keeps_every_draft(llm, models):
    from vllm import SamplingParams

    target, draft, tokenizer = models
    never = {"diversed": {"judge": {"name": "arith", "threshold": 1.5}}}
    rules = [(StaticEnsembleVerifier(1.0), never), (StaticEnsembleVerifier(0.3), {"diversed": {"target_weight": 0.3}})]
    check_rules_law_and_acceptance(llm, rules, target, draft, law_candidates(tokenizer), num_requests=1500)

    always = {"diversed": {"judge": {"name": "arith", "threshold": 0.0}}}
    before = spec_metrics(llm)
    params = SamplingParams(temperature=1.0, max_tokens=24, extra_args=always)
    llm.generate(vllm_prompts(prompt_ids(tokenizer, 16, "arith")), params, use_tqdm=False)
    after = spec_metrics(llm)
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    assert drafted > 0 and after["num_accepted_tokens"] - before["num_accepted_tokens"] == drafted
