"""A vLLM engine with ``additional_config={"diversed": {"head": <dir>}}`` verifies against the head's mixture.

The head reads distribution features only (``use_hidden_states=False``) and its weights are set so that ``w_t``
moves with the features: the test checks the per-position weight really is the head's, not a constant.
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in vLLM's environment (.ci/vllm)")

import torch
from vllm_helpers import (
    check_greedy_parity,
    check_law_and_acceptance,
    engine,
    law_candidates,
    pair,
    prompt_ids,
    shutdown,
)

from diversed_hf import DiversedHead
from diversed_hf.verifiers import HeadVerifier

FEATURES = ["tv", "target_top1", "draft_top1", "argmax_agree"]


@pytest.fixture(scope="module")
def models():
    return pair()


@pytest.fixture(scope="module")
def head_dir(models, tmp_path_factory):
    target, draft, _ = models
    head = DiversedHead.for_pair(target, draft, use_hidden_states=False, features=FEATURES)
    with torch.no_grad():
        head.net[-1].weight.copy_(torch.tensor([[-3.0, 2.0, 1.5, 1.0]]))
        head.net[-1].bias.fill_(-1.0)
    directory = tmp_path_factory.mktemp("head")
    head.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def verifier(head_dir):
    return HeadVerifier(DiversedHead.from_pretrained(head_dir))


@pytest.fixture(scope="module")
def llm(head_dir):
    llm = engine({"diversed": {"head": str(head_dir)}})
    yield llm
    shutdown(llm)


def test_the_heads_weight_moves_with_the_context(verifier, models):
    from vllm_helpers import next_probs

    target, draft, tokenizer = models
    contexts = law_candidates(tokenizer)[:40]
    target_probs = torch.stack([next_probs(target, ids) for ids in contexts])[None].float()  # (1, C, vocab)
    draft_probs = torch.stack([next_probs(draft, ids) for ids in contexts])[None].float()  # (1, C, vocab)
    _, weights = verifier.verification_probs(draft_probs, target_probs)  # (1, C)
    assert float(weights.max() - weights.min()) > 0.2, weights


def test_first_drafted_position_follows_the_heads_mixture_and_metrics_show_its_acceptance(llm, verifier, models):
    target, draft, tokenizer = models
    check_law_and_acceptance(llm, verifier, target, draft, law_candidates(tokenizer))


def test_greedy_output_equals_the_projects_generate(llm, verifier, models):
    target, draft, tokenizer = models
    check_greedy_parity(llm, verifier, target, draft, prompt_ids(tokenizer, 8, "summary"))
