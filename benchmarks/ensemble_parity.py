"""Greedy static ensembles against a no-cache reference of the rule, ours and transformers' (docs/method.md §3,
"Greedy decoding").

    python benchmarks/ensemble_parity.py        # testbed pair, 16 held-out arith prompts x 64 tokens, N = 5, w = 0.5

The reference drafts ``N`` tokens greedily with the draft, keeps them while ``x_t == argmax nu_t``
(``nu_t = w p_t + (1 - w) q_t``), emits ``argmax nu_t`` at the first mismatch or the bonus ``argmax p`` after a full
round, and starts the next round there; every distribution comes from a forward over the whole sequence, no cache.
Where rounds end is part of the rule's output (a kept draft is a draft the target alone might not have chosen), so
the reference fixes the draft length at ``N`` and so must the implementations compared with it:

- ours: ``generate(..., verifier=StaticEnsembleVerifier(w), num_assistant_tokens=N)`` (a chain of ``N``);
- transformers, as configured: ``assistant_ensemble_weight=w`` with the **assistant's** generation config set to
  ``num_assistant_tokens=N``, the constant schedule and no confidence threshold (transformers reads its draft length
  from the assistant's config, not from the call);
- transformers, as called: the same with ``num_assistant_tokens=N`` passed to ``generate`` only, which transformers
  does not read for the draft: the assistant's defaults apply (20 tokens, a confidence threshold of 0.4 that stops a
  round early, tuned during generation when scikit-learn is installed).

Prints, and writes to ``results/ensemble_parity.md``, on how many prompts each agrees with the reference token for
token. The test suite checks ours against the same reference (tests/test_ensemble_reference.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import GenerationMixin

import diversed_hf.testbed as testbed
from diversed_hf import StaticEnsembleVerifier, enable_diversed
from diversed_hf.lab.cli_utils import ArgumentParser, run_script, write_text_atomic

REPO = Path(__file__).resolve().parents[1]


@torch.no_grad()
def reference_greedy(target, draft, ids: list[int], weight: float, num_drafts: int, max_new_tokens: int) -> list[int]:
    """The greedy static-ensemble rule with every distribution from a full forward (no cache): the new tokens, up to
    the first of the target's end-of-sequence tokens."""
    eos = target.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    sequence = list(ids)
    while len(sequence) - len(ids) < max_new_tokens:
        drafts = []
        for _ in range(num_drafts):
            drafts.append(int(draft(torch.tensor([sequence + drafts])).logits[0, -1].argmax()))
        full = torch.tensor([sequence + drafts])
        p = target(full).logits[0, len(sequence) - 1 :].float().softmax(-1)  # (N + 1, V)
        q = draft(full).logits[0, len(sequence) - 1 : len(sequence) - 1 + num_drafts].float().softmax(-1)  # (N, V)
        emitted = []
        for i, token in enumerate(drafts):
            choice = int((weight * p[i] + (1 - weight) * q[i]).argmax())
            emitted.append(choice)
            if choice != token:
                break
        else:
            emitted.append(int(p[num_drafts].argmax()))
        sequence += emitted
        stops = [i for i, token in enumerate(sequence[len(ids) :]) if token in eos]
        if stops:  # generation ends at the first end-of-sequence token, as generate's does
            return sequence[len(ids) : len(ids) + min(stops[0] + 1, max_new_tokens)]
    return sequence[len(ids) : len(ids) + max_new_tokens]


def transformers_greedy(target, draft, ids, weight, num_drafts, max_new_tokens, configured: bool) -> list[int]:
    """transformers' own assisted decoding with ``assistant_ensemble_weight`` (the mixin's override bypassed)."""
    saved = draft.generation_config.to_dict()
    if configured:
        draft.generation_config.num_assistant_tokens = num_drafts
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
    try:
        out = GenerationMixin.generate(
            target,
            torch.tensor([ids]),
            assistant_model=draft,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            assistant_ensemble_weight=weight,
            **({} if configured else dict(num_assistant_tokens=num_drafts, num_assistant_tokens_schedule="constant")),
        )
    finally:
        for name in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
            setattr(draft.generation_config, name, saved.get(name))
    return out[0, len(ids) :].tolist()


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=16)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--num_drafts", type=int, default=5)
    parser.add_argument("--weight", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=31337, help="the held-out prompts' sampling seed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target, draft, tokenizer = testbed.load_pair()
    enable_diversed(target)
    prompts = testbed.load_task("arith", split="test", num_examples=args.num_prompts, seed=args.seed)["prompt"]
    settings = (args.weight, args.num_drafts, args.max_new_tokens)
    agree = {"ours": 0, "transformers, as configured": 0, "transformers, as called": 0}
    for text in prompts:
        ids = tokenizer(text)["input_ids"]
        reference = reference_greedy(target, draft, ids, *settings)
        ours = target.generate(
            torch.tensor([ids]),
            assistant_model=draft,
            verifier=StaticEnsembleVerifier(args.weight),
            do_sample=False,
            max_new_tokens=args.max_new_tokens,
            num_assistant_tokens=args.num_drafts,
            assistant_tree_top_k=1,
        )[0, len(ids) :].tolist()
        runs = {
            "ours": ours,
            "transformers, as configured": transformers_greedy(target, draft, ids, *settings, configured=True),
            "transformers, as called": transformers_greedy(target, draft, ids, *settings, configured=False),
        }
        for name, tokens in runs.items():
            agree[name] += tokens == reference
    command = "python benchmarks/ensemble_parity.py" + (" " + " ".join(argv) if argv else "")
    lines = [
        f"Measured with `{command}`: the testbed pair (float32), {len(prompts)} held-out `arith` test prompts (seed "
        f"{args.seed}) x {args.max_new_tokens} new tokens, greedy, w = {args.weight:g}, N = {args.num_drafts}. Prompts "
        "whose output equals the no-cache reference of the rule, token for token:",
        "",
        *(f"- {name}: {count} of {len(prompts)}" for name, count in agree.items()),
        "",
    ]
    text = "\n".join(lines)
    write_text_atomic(REPO / "results" / "ensemble_parity.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
