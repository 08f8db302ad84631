"""A vLLM engine with ``additional_config={"diversed": {"target_weight": 0.4}}`` verifies against the static mixture."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in vLLM's environment (.ci/vllm)")

from vllm_helpers import (
    check_greedy_parity,
    check_law_and_acceptance,
    engine,
    law_candidates,
    pair,
    prompt_ids,
    shutdown,
)

from diversed_hf.verifiers import StaticEnsembleVerifier

TARGET_WEIGHT = 0.4


@pytest.fixture(scope="module")
def models():
    return pair()


@pytest.fixture(scope="module")
def llm():
    llm = engine({"diversed": {"target_weight": TARGET_WEIGHT}})
    yield llm
    shutdown(llm)


def test_first_drafted_position_follows_the_mixture_and_metrics_show_its_acceptance(llm, models):
    target, draft, tokenizer = models
    check_law_and_acceptance(llm, StaticEnsembleVerifier(TARGET_WEIGHT), target, draft, law_candidates(tokenizer))


def test_greedy_output_equals_the_projects_generate(llm, models):
    target, draft, tokenizer = models
    check_greedy_parity(llm, StaticEnsembleVerifier(TARGET_WEIGHT), target, draft, prompt_ids(tokenizer, 8, "summary"))
