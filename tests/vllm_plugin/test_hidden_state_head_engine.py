"""A vLLM engine with a shipped head that reads both models' hidden states (the testbed's ``arith`` head): the plugin
hands it the target's and the draft's last-layer hidden states at the verified positions, and the engine then
verifies against the same ``nu_t`` as the project's ``generate(..., diversed_head=head)``."""

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

from diversed_hf import testbed
from diversed_hf.verifiers import HeadVerifier

HEAD = str(testbed.asset_path("heads/arith"))


@pytest.fixture(scope="module")
def models():
    return pair()


@pytest.fixture(scope="module")
def verifier():
    head = testbed.load_head("arith")
    assert head.config.use_hidden_states, "this test is about a head that reads hidden states"
    return HeadVerifier(head)


@pytest.fixture(scope="module")
def llm():
    llm = engine({"diversed": {"head": HEAD}})
    yield llm
    shutdown(llm)


def test_greedy_output_equals_generate_with_the_head(llm, verifier, models):
    target, draft, tokenizer = models
    check_greedy_parity(llm, verifier, target, draft, prompt_ids(tokenizer, 8, "arith"))


def test_first_drafted_position_follows_the_heads_mixture_with_hidden_states(llm, verifier, models):
    target, draft, tokenizer = models
    check_law_and_acceptance(llm, verifier, target, draft, law_candidates(tokenizer))
