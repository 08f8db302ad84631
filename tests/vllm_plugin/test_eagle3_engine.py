"""An EAGLE-3 EagleDraft served by vLLM's ``eagle3`` method (``save_pretrained(path, format="eagle3")``), with and
without DIVERSED.

The draft is an untrained EAGLE-3 EagleDraft for the testbed target (fusing its layers 2, 8 and 13; one layer; its own
LM head over 1,200 of the target's 2,436 ids through ``d2t``, started from the target's head rows), its ``fc`` and
head sharpened so its distributions are not flat. What vLLM serves is checked against the draft under transformers, fed as vLLM feeds an EAGLE draft: the
token at each position with the target's fused feature of the position before, from the second token on
(docs/eagle.md).
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in vLLM's environment (.ci/vllm)")

import torch
from test_eagle_engine import check_greedy_is_the_targets, llm_outputs, target_greedy
from vllm_helpers import NUM_DRAFT_TOKENS, engine, prompt_ids, shutdown, spec_metrics

from diversed_hf import EagleDraft, StaticEnsembleVerifier, enable_diversed, testbed


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``(target, draft, tokenizer, export directory)`` under transformers, float32."""
    target, _, tokenizer = testbed.load_pair()
    enable_diversed(target)
    torch.manual_seed(0)
    ids = torch.randperm(target.config.vocab_size)[:1200]
    draft = EagleDraft.for_target(target, architecture="eagle3", draft_vocab_ids=ids).eval()
    with torch.no_grad():
        draft.fc.weight.mul_(4.0)
        draft.lm_head.weight.mul_(2.0)  # the target's head rows (its start), sharpened: about 60 % kept at w = 0.1
    return (
        target,
        draft,
        tokenizer,
        draft.save_pretrained(tmp_path_factory.mktemp("eagle3") / "export", format="eagle3"),
    )


@pytest.fixture(scope="module")
def llm(models):
    speculative_config = {
        "method": "eagle3",
        "model": str(models[3]),
        "num_speculative_tokens": NUM_DRAFT_TOKENS,
        "draft_sample_method": "probabilistic",
    }
    served = engine({"diversed": {"target_weight": 1.0}}, speculative_config=speculative_config, max_num_seqs=32)
    yield served
    shutdown(served)


@torch.no_grad()
def vllm_fed_chain(target, draft, ids: list[int], first: int) -> list[int]:
    """The draft's greedy tokens after ``ids`` and the target's ``first`` token, fed as vLLM's EAGLE-3 proposer feeds
    it: position ``i`` holds token ``i + 1`` and ``fc`` of the target's fused features at ``i`` (then the draft's own
    pre-norm features)."""
    tokens = ids[1:] + [first]
    hidden = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
    features = draft.fc(draft.target_features(hidden))[0]  # (n, d)
    chain = []
    for _ in range(NUM_DRAFT_TOKENS):
        predicted = draft.features(torch.tensor([tokens]), features[None])[0]  # (len, d)
        chain.append(int(draft.full_logits(predicted[-1]).argmax()))
        tokens, features = tokens + chain[-1:], torch.cat([features, predicted[-1:]])
    return chain


def test_vllm_serves_the_eagle3_export_and_its_greedy_output_is_the_targets(llm, models):
    target, _, tokenizer, _ = models
    check_greedy_is_the_targets(llm, target, prompt_ids(tokenizer, 6, "arith"))


def test_the_served_eagle3_draft_drafts_what_the_exported_draft_drafts(llm, models):
    """With ``target_weight = 0`` (``nu = q``) a greedy request keeps every draft: vLLM's first round emits the
    draft's own greedy chain, which must be the exported draft's under transformers (fc, midlayer, norm, lm_head and
    d2t all as vLLM reads them)."""
    from vllm import SamplingParams

    target, draft, tokenizer, _ = models
    prompts = prompt_ids(tokenizer, 8, "arith")
    params = SamplingParams(
        temperature=0.0, max_tokens=1 + NUM_DRAFT_TOKENS, extra_args={"diversed": {"target_weight": 0.0}}
    )
    for ids, emitted in zip(prompts, llm_outputs(llm, prompts, params)):
        assert emitted[0] == target_greedy(target, ids, 1)[0]
        assert emitted[1:] == vllm_fed_chain(target, draft, ids, emitted[0]), f"prompt {ids}"


def test_greedy_acceptance_under_vllm_is_generates_on_the_same_prompts(llm, models):
    """A greedy static ensemble (w = 0.1: the untrained draft is kept about 60 % of the time) accepts about as
    many drafts per drafted token served by vLLM as under ``generate`` with the same draft, prompts and draft length
    (vLLM drops each prompt's first position, which the loop pairs with a zero feature, so the two may part
    slightly)."""
    from vllm import SamplingParams

    target, draft, tokenizer, _ = models
    prompts = prompt_ids(tokenizer, 16, "arith")
    params = SamplingParams(temperature=0.0, max_tokens=32, extra_args={"diversed": {"target_weight": 0.1}})
    before = spec_metrics(llm)
    llm_outputs(llm, prompts, params)
    after = spec_metrics(llm)
    served = (after["num_accepted_tokens"] - before["num_accepted_tokens"]) / (
        after["num_draft_tokens"] - before["num_draft_tokens"]
    )
    accepted = drafted = 0
    for ids in prompts:
        out = target.generate(
            torch.tensor([ids]),
            assistant_model=draft,
            verifier=StaticEnsembleVerifier(0.1),
            do_sample=False,
            max_new_tokens=32,
            num_assistant_tokens=NUM_DRAFT_TOKENS,
            assistant_tree_top_k=1,
            return_dict_in_generate=True,
        )
        accepted, drafted = accepted + out.speculation.total_accepted, drafted + out.speculation.total_drafted
    assert served > 0.2, served  # the check means something: the draft's tokens are kept often
    # measured 64.2 % served against 60.6 %: the untrained draft is sensitive to vLLM starting each prompt at its
    # second token where the loop pairs the first with a zero feature (docs/eagle.md); 5 points bound that gap
    assert abs(served - accepted / drafted) < 0.05, (served, accepted / drafted)
