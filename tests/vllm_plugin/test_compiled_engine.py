"""A compiled engine (``enforce_eager=False``, vLLM's default) with the plugin. Its warm-up sends a dummy batch with
no requests behind it, which the plugin verifies against the engine's default rule; before, the engine failed to
start ("0 verifiers for 8 requests"). Served: an EagleDraft by vLLM's ``eagle`` method, with a head that reads hidden
states as the default rule (the warm-up gives it states of its widths); a greedy request at ``target_weight`` 1 is
the target's greedy text, and a request by the head's rule runs to its length."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in vLLM's environment (.ci/vllm)")

import torch
from vllm import SamplingParams
from vllm_helpers import NUM_DRAFT_TOKENS, engine, prompt_ids, shutdown, vllm_prompts

from diversed_hf import DiversedHead, EagleDraft, testbed


def test_a_compiled_engine_starts_and_serves_the_targets_greedy_text(tmp_path):
    target, _, tokenizer = testbed.load_pair()
    torch.manual_seed(0)
    draft = EagleDraft.for_target(target).eval()
    DiversedHead.for_pair(target, draft, w_0=0.9, use_hidden_states=True).save_pretrained(tmp_path / "head")
    speculative_config = {
        "method": "eagle",
        "model": str(draft.save_for_vllm(tmp_path / "export")),
        "num_speculative_tokens": NUM_DRAFT_TOKENS,
        "draft_sample_method": "probabilistic",
    }
    settings = {"diversed": {"head": str(tmp_path / "head")}}
    llm = engine(settings, speculative_config=speculative_config, enforce_eager=False, max_num_seqs=8)
    try:
        ids = prompt_ids(tokenizer, 2)
        greedy = SamplingParams(temperature=0.0, max_tokens=12, extra_args={"diversed": {"target_weight": 1.0}})
        exact = llm.generate(vllm_prompts(ids), greedy, use_tqdm=False)
        by_head = llm.generate(vllm_prompts(ids), SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    finally:
        shutdown(llm)
    for prompt, output in zip(ids, exact):
        with torch.no_grad():
            expected = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)[0, len(prompt) :]
        got = list(output.outputs[0].token_ids)
        assert got == expected.tolist()[: len(got)] and len(got) >= 1
    assert all(len(output.outputs[0].token_ids) == 12 for output in by_head)
