"""Per-request verification: ``SamplingParams(extra_args={"diversed": {...}})`` picks a request's rule among the
engine's (lossless, a static weight, a head the engine loaded); requests with different rules share a batch and each
keeps its own law; a bad value fails that request alone. The field's relaxed rules (fuzzy SD, top-k relaxed
acceptance) are picked the same way."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in vLLM's environment (.ci/vllm)")

from vllm_helpers import (
    check_greedy_parity,
    check_rules_law_and_acceptance,
    engine,
    law_candidates,
    pair,
    prompt_ids,
    shutdown,
    vllm_prompts,
)

from diversed_hf import testbed
from diversed_hf.verifiers import FuzzyVerifier, HeadVerifier, StaticEnsembleVerifier, TopKRelaxedVerifier

HEAD = str(testbed.asset_path("heads/arith"))


@pytest.fixture(scope="module")
def models():
    return pair()


@pytest.fixture(scope="module")
def rules():
    """``(verifier, extra_args)``: the engine's default (lossless), a static weight, and the loaded head by name."""
    return [
        (StaticEnsembleVerifier(1.0), None),
        (StaticEnsembleVerifier(0.3), {"diversed": {"target_weight": 0.3}}),
        (HeadVerifier(testbed.load_head("arith")), {"diversed": {"head": "arith"}}),
        (FuzzyVerifier(0.5, "tv"), {"diversed": {"fuzzy": {"threshold": 0.5, "divergence": "tv"}}}),
    ]


@pytest.fixture(scope="module")
def sampled_rules(rules):
    """The rules above and top-k relaxed acceptance, whose greedy rule differs under vLLM (docs/method.md §9)."""
    return [*rules, (TopKRelaxedVerifier(2, 1.0), {"diversed": {"top_k_relaxed": {"top_k": 2, "delta": 1.0}}})]


@pytest.fixture(scope="module")
def llm():
    llm = engine({"diversed": {"target_weight": 1.0, "heads": {"arith": HEAD}}})
    yield llm
    shutdown(llm)


def test_a_mixed_greedy_batch_equals_generate_with_each_requests_rule(llm, rules, models):
    target, draft, tokenizer = models
    prompts = prompt_ids(tokenizer, 9, "arith")
    chosen = [rules[index % len(rules)] for index in range(len(prompts))]
    check_greedy_parity(
        llm, [verifier for verifier, _ in chosen], target, draft, prompts, extra_args=[extra for _, extra in chosen]
    )


def test_a_mixed_sampled_batch_keeps_each_requests_law(llm, sampled_rules, models):
    target, draft, tokenizer = models
    check_rules_law_and_acceptance(llm, sampled_rules, target, draft, law_candidates(tokenizer), num_requests=2000)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"target_weight": 1.5}, r'extra_args\["diversed"\]\["target_weight"\] must be a number in \[0, 1\]'),
        ({"head": "summary"}, r'extra_args\["diversed"\]\["head"\] must name a head this engine loaded'),
        ({"weight": 0.5}, r"unknown keys \['weight'\]"),
    ],
)
def test_a_bad_rule_fails_its_request_and_the_engine_serves_on(llm, models, extra, message):
    from vllm import SamplingParams

    _, _, tokenizer = models
    prompt = vllm_prompts(prompt_ids(tokenizer, 1, "arith"))
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, SamplingParams(max_tokens=4, extra_args={"diversed": extra}), use_tqdm=False)
    output = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert len(output[0].outputs[0].token_ids) == 4
