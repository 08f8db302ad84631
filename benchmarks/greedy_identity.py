"""How often lossless SD's greedy text equals ``generate``'s on the real pair, in bfloat16 and in float32
(README, "A real model"; docs/method.md §3, "Greedy decoding").

    python benchmarks/greedy_identity.py      # SmolLM2-135M-Instruct, default EagleDraft, 16 held-out everyday prompts

Greedy lossless SD emits, at each position, the argmax of the target's distribution **as computed in the round's
verification pass**: a forward over the last token and the drafts, where ``generate`` computes it one token at a
time. In exact arithmetic the two are the same distribution; in bfloat16 the two passes round differently, and a
near-tie between the two best tokens can go either way. Once one token differs the texts part. In float32 the
rounding is ~65,000 times finer and ties that close are rare. For each dtype: the prompts whose 64 new tokens are
identical, and where the others first differ. Writes ``results/greedy_identity.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import diversed_hf.testbed as testbed
from diversed_hf import ExactVerifier, enable_diversed
from diversed_hf.lab.cli_utils import ArgumentParser, run_script, write_text_atomic
from diversed_hf.lab.tasks.chat_prompts import everyday_prompts

REPO = Path(__file__).resolve().parents[1]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The index of the first token where ``a`` and ``b`` differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(dtype: torch.dtype, prompts: list[str], max_new_tokens: int) -> list[int | None]:
    target, draft, tokenizer = testbed.load_pair("smollm2", torch_dtype=dtype)
    enable_diversed(target)
    parts = []
    for text in prompts:
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        common = dict(do_sample=False, max_new_tokens=max_new_tokens)
        with torch.no_grad():
            plain = target.generate(**inputs, **common)[0].tolist()
            speculative = target.generate(**inputs, assistant_model=draft, verifier=ExactVerifier(), **common)[
                0
            ].tolist()
        start = inputs["input_ids"].shape[1]
        parts.append(first_difference(plain[start:], speculative[start:]))  # in new tokens
    return parts


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=16)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    prompts = everyday_prompts(args.num_prompts)
    lines = [
        f"Measured with `python benchmarks/greedy_identity.py`: SmolLM2-135M-Instruct with its default EagleDraft (its "
        f"shipped tree), lossless SD (`ExactVerifier`) against `generate`, greedy, {len(prompts)} held-out everyday "
        f"prompts x {args.max_new_tokens} new tokens, batch 1, one thread.",
        "",
    ]
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        parts = measure(dtype, prompts, args.max_new_tokens)
        same = sum(part is None for part in parts)
        where = sorted(part for part in parts if part is not None)
        lines.append(
            f"- {name}: identical on {same} of {len(parts)} prompts"
            + (f"; the others first differ at new token {where} (0-based)" if where else "")
            + "."
        )
    text = "\n".join(lines) + "\n"
    write_text_atomic(REPO / "results" / "greedy_identity.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
