"""Helpers of the vLLM plugin's tests. The tests run in vLLM's own environment (.ci/vllm); elsewhere they skip.

Engines run the shipped testbed pair (a 9M Llama target, a 1-layer draft, 2436 ids) on the CPU, one engine per test
module (module-scoped fixtures), with 1 thread and a 1 GiB KV cache. What an engine emits is compared with what the
project's own code says it must: ``nu_t`` from the project's verifiers on the testbed models under transformers.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch

from diversed_hf import testbed

NUM_DRAFT_TOKENS = 3
ASSETS = testbed.ASSETS_DIR


def engine(additional_config: dict | None, **overrides):
    """A vLLM engine on the testbed pair drafting ``NUM_DRAFT_TOKENS`` tokens by probabilistic draft sampling."""
    from vllm import LLM

    speculative_config = {
        "method": "draft_model",
        "model": str(ASSETS / "draft"),
        "num_speculative_tokens": NUM_DRAFT_TOKENS,
        "draft_sample_method": "probabilistic",
    }
    options = dict(
        model=str(ASSETS / "target"),
        tokenizer=str(ASSETS / "tokenizer"),
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        max_num_seqs=128,
        seed=0,
        disable_log_stats=False,
        speculative_config=speculative_config,
        additional_config=additional_config or {},
    )
    options.update(overrides)
    return LLM(**options)


def shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()


def spec_metrics(llm) -> dict[str, object]:
    """vLLM's spec-decoding counters: ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``, ``..._per_pos``."""
    found = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_"):
            name = metric.name.removeprefix("vllm:spec_decode_")
            found[name] = list(metric.values) if hasattr(metric, "values") else metric.value
    return found


def pair():
    """The testbed's (target, draft, tokenizer) under transformers, float32, the target's ``generate`` the project's."""
    from diversed_hf import enable_diversed

    target, draft, tokenizer = testbed.load_pair()
    return enable_diversed(target), draft, tokenizer


def prompt_ids(tokenizer, num_prompts: int, task: str = "arith") -> list[list[int]]:
    data = testbed.load_task(task, split="test", num_examples=num_prompts, seed=0)
    return [tokenizer(text)["input_ids"] for text in data["prompt"]]


def law_candidates(tokenizer, num_examples: int = 3) -> list[list[int]]:
    """Arithmetic prompts followed by every prefix of their worked solution: contexts mid-solution, where the draft
    (weak on numbers) and the target disagree."""
    data = testbed.load_task("arith", split="test", num_examples=num_examples, seed=0)
    candidates = []
    for prompt, completion in zip(data["prompt"], data["completion"]):
        prompt_length, ids = len(tokenizer(prompt)["input_ids"]), tokenizer(prompt + completion)["input_ids"]
        candidates += [ids[:cut] for cut in range(prompt_length, len(ids) - 2)]
    return candidates


@torch.no_grad()
def next_probs(model, ids: list[int]) -> torch.Tensor:  # (vocab,) float64, temperature 1
    return model(torch.tensor([ids])).logits[0, -1].double().softmax(-1)


def vllm_prompts(ids_list: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": list(ids)} for ids in ids_list]


@torch.no_grad()
def next_state(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs (vocab,) float64 at temperature 1, last-layer hidden state (d,))`` at the position after ``ids``."""
    out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0, -1].double().softmax(-1), out.hidden_states[-1][0, -1]


@torch.no_grad()
def mixture_at(verifier, target, draft, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(nu, p, q)`` at the position after ``ids``, by the project's verifier on the transformers models (a head
    that reads hidden states gets both models' last-layer hidden states there, as ``generate`` gives it)."""
    (target_probs, target_hidden), (draft_probs, draft_hidden) = next_state(target, ids), next_state(draft, ids)
    hidden = {}
    if verifier.requires_hidden_states:
        hidden = dict(draft_hidden=draft_hidden[None, None], target_hidden=target_hidden[None, None])
    verify_probs, _ = verifier.verification_probs(draft_probs[None, None], target_probs[None, None], **hidden)
    return verify_probs[0, 0].double(), target_probs, draft_probs


def law_prompt(verifier, target, draft, candidates: list[list[int]], min_gap: float = 0.15):
    """A prompt whose first token is nearly fixed (vLLM samples it from the target at prefill) and after which
    ``nu`` is far from ``p`` (so the test tells the two apart): ``(prompt, first token)``."""
    for ids in candidates:
        first_probs = next_probs(target, ids)
        first = int(first_probs.argmax())
        if float(first_probs[first]) < 0.99:
            continue
        verify_probs, target_probs, _ = mixture_at(verifier, target, draft, ids + [first])
        if 0.5 * float((verify_probs - target_probs).abs().sum()) > min_gap:
            return ids, first
    raise AssertionError("no candidate prompt has a nearly fixed first token and nu far from p after it")


def check_law_and_acceptance(llm, verifier, target, draft, candidates, num_requests: int = 3000) -> None:
    """The token at the first drafted position follows ``nu`` (not ``p``), and vLLM's acceptance counters match
    ``beta = sum_x min(q(x), nu(x))`` along the sampled prefixes (one rule: the engine's default)."""
    check_rules_law_and_acceptance(llm, [(verifier, None)], target, draft, candidates, num_requests)


def check_rules_law_and_acceptance(llm, rules, target, draft, candidates, num_requests: int = 3000) -> None:
    """For each ``(verifier, extra_args)`` of ``rules``, ``num_requests`` requests with those ``extra_args``, all
    interleaved in one batch: the token at each request's first drafted position follows its own rule's ``nu`` (not
    ``p``), and vLLM's acceptance counter matches the sum over rules of ``beta = sum_x min(q(x), nu(x))`` along the
    sampled prefixes.

    vLLM samples the first token from the target at prefill; the next one is the first drafted position. With
    ``max_tokens=2`` each request has exactly one verification round, so vLLM's per-position counter at position 1
    divided by its number of drafts is the empirical acceptance of the first draft.
    """
    from tiny_models import empirical, tv_bound
    from vllm import SamplingParams

    from diversed_hf.verifiers import ops

    exact = [getattr(verifier, "target_weight", None) == 1.0 for verifier, _ in rules]  # nu = p: no gap to find
    prompts = [
        law_prompt(verifier, target, draft, candidates, min_gap=-1.0 if is_exact else 0.15)
        for (verifier, _), is_exact in zip(rules, exact)
    ]
    requests, params = [], []
    for _ in range(num_requests):
        for (prompt, _), (_, extra_args) in zip(prompts, rules):
            requests.append(prompt)
            params.append(SamplingParams(temperature=1.0, max_tokens=2, extra_args=extra_args))
    before = spec_metrics(llm)
    outputs = llm.generate(vllm_prompts(requests), params, use_tqdm=False)
    after = spec_metrics(llm)
    tokens = torch.tensor([list(output.outputs[0].token_ids)[:2] for output in outputs])  # (requests, 2)
    assert tokens.shape == (len(requests), 2), "every request must emit its two tokens"
    num_drafts = after["num_drafts"] - before["num_drafts"]
    assert num_drafts == len(requests), f"each request must verify one drafted round, got {num_drafts} rounds"

    expected, lossless = 0.0, 0.0
    for index, ((prompt, first), (verifier, _)) in enumerate(zip(prompts, rules)):
        rule_tokens = tokens[index :: len(rules)]  # (num_requests, 2) this rule's requests
        kept = rule_tokens[rule_tokens[:, 0] == first, 1]  # (m,) second tokens after the usual first token
        verify_probs, target_probs, _ = mixture_at(verifier, target, draft, prompt + [first])
        bound = tv_bound(verify_probs, kept.numel())
        observed = empirical(kept, verify_probs.numel())
        if not exact[index]:
            assert float(ops.total_variation(target_probs, verify_probs)) > 2 * bound, "the test must tell nu from p"
        assert float(ops.total_variation(observed, verify_probs)) < bound, f"rule {index} ({verifier})"
        for token, count in zip(*rule_tokens[:, 0].unique(return_counts=True)):
            verify_probs, target_probs, draft_probs = mixture_at(verifier, target, draft, prompt + [int(token)])
            expected += int(count) * float(torch.minimum(draft_probs, verify_probs).sum())
            lossless += int(count) * float(torch.minimum(draft_probs, target_probs).sum())
    accepted = after["num_accepted_tokens_per_pos"][0] - before["num_accepted_tokens_per_pos"][0]
    expected, lossless = expected / len(requests), lossless / len(requests)
    hoeffding = (math.log(2 / 1e-6) / (2 * len(requests))) ** 0.5
    assert abs(expected - lossless) > 2 * hoeffding, "the test must tell DIVERSED's acceptance from lossless SD's"
    assert abs(accepted / num_drafts - expected) < hoeffding, (accepted / num_drafts, expected, lossless)


def check_greedy_parity(
    llm, verifier, target, draft, prompts: list[list[int]], max_tokens: int = 40, extra_args: list | None = None
) -> None:
    """Greedy output equals the project's ``generate(..., verifier=...)`` after vLLM's first token (``verifier``: one
    rule, or one per prompt, sent with that prompt's ``extra_args``).

    vLLM emits the first token at prefill from the target alone (``argmax p``); the project's ``generate`` drafts
    it. So the comparison is: vLLM's first token is the target's argmax, and the rest is what ``generate`` makes
    from the prompt followed by that token, drafting ``NUM_DRAFT_TOKENS`` per round. vLLM drafts that many tokens up
    to the last one, where ``generate`` drafts fewer as it nears ``max_new_tokens``; since a greedy lossy rule emits
    ``argmax nu`` at a drafted position and ``argmax p`` at a bonus one, ``generate`` runs ``NUM_DRAFT_TOKENS``
    further (same rounds as vLLM) and its output is cut at vLLM's length.
    """
    from vllm import SamplingParams

    extra_args = extra_args or [None] * len(prompts)
    verifiers = verifier if isinstance(verifier, list) else [verifier] * len(prompts)
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra) for extra in extra_args]
    outputs = llm.generate(vllm_prompts(prompts), params, use_tqdm=False)
    for ids, output, verifier in zip(prompts, outputs, verifiers):
        emitted = list(output.outputs[0].token_ids)
        assert emitted[0] == int(next_probs(target, ids).argmax())
        context = torch.tensor([ids + emitted[:1]])
        expected = target.generate(
            context,
            attention_mask=torch.ones_like(context),
            assistant_model=draft,
            verifier=verifier,
            do_sample=False,
            max_new_tokens=max_tokens - 1 + NUM_DRAFT_TOKENS,
            num_assistant_tokens=NUM_DRAFT_TOKENS,
            num_assistant_tokens_schedule="constant",
        )[0, context.shape[1] :].tolist()[: len(emitted) - 1]
        assert emitted[1:] == expected, f"prompt {ids}: vLLM {emitted[1:]} vs generate {expected}"
