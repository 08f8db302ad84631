"""Token trees against chains on a CUDA device: tokens/s against target-only, and the host synchronisations a round
makes (``torch.cuda.set_sync_debug_mode``). Without CUDA it says so and exits 0.

    python benchmarks/tree_gpu.py                                   # the real pair (SmolLM2-135M-Instruct, EagleDraft)
    python benchmarks/tree_gpu.py --target Qwen/Qwen3-8B --draft Qwen/Qwen3-0.6B --dtype bfloat16   # any pair
    python benchmarks/tree_gpu.py --quick                           # the testbed pair, a few tokens

Every configuration runs the held-out everyday prompts (``--num_prompts``) at batch 1, greedy and at T = 0.7, after a
warm-up call; the synchronisations are counted on one more call per configuration with the debug mode at "warn"
(each is a warning), divided by that call's rounds. Prints one table; ``--output`` also writes it as JSON.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch

from diversed_hf import ExactVerifier, enable_diversed
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, run_script, write_text_atomic
from diversed_hf.lab.tasks.chat_prompts import everyday_prompts

SHAPES = {
    "chain N=3": dict(num_assistant_tokens=3),
    "tree 4x2 (8)": dict(num_assistant_tokens=4, assistant_tree_top_k=2, assistant_tree_size=8),
    "tree 6x4 (24)": dict(num_assistant_tokens=6, assistant_tree_top_k=4, assistant_tree_size=24),
    "tree 8x8 (64)": dict(num_assistant_tokens=8, assistant_tree_top_k=8, assistant_tree_size=64),
}
MODES = {"greedy": dict(do_sample=False), "T=0.7": dict(do_sample=True, temperature=0.7, top_k=0, top_p=1.0)}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None, help="a causal LM id or path (default: the real pair)")
    parser.add_argument("--draft", default=None, help="its draft model (with --target)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--num_prompts", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--output", default=None, help="also write the rows as JSON here")
    parser.add_argument("--quick", action="store_true", help="the testbed pair, 2 prompts, 16 tokens")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        parser.error("pass --target and --draft together (or neither, for the real pair)")
    return args


def load(args, device):
    import diversed_hf.testbed as testbed

    dtype = getattr(torch, args.dtype)
    if args.quick:
        target, draft, tokenizer = testbed.load_pair(device=device)
    elif args.target is None:
        target, draft, tokenizer = testbed.load_pair("smollm2", torch_dtype=dtype, device=device)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, attn_implementation="sdpa").to(device)
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype, attn_implementation="sdpa").to(device)
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    return enable_diversed(target.eval()), draft.eval(), tokenizer


def measure(target, draft, tokenizer, prompts, max_new_tokens, device) -> dict:
    encoded = [tokenizer(prompt, return_tensors="pt").to(device) for prompt in prompts]
    rows = {}
    for mode, sampling in MODES.items():

        def run(**kwargs):
            tokens, rounds = 0, 0
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            for enc in encoded:
                out = target.generate(
                    **enc, max_new_tokens=max_new_tokens, return_dict_in_generate=True, **sampling, **kwargs
                )
                tokens += out.sequences.shape[1] - enc.input_ids.shape[1]
                stats = getattr(out, "speculation", None)
                rounds += int(stats.num_rounds.sum()) if stats is not None else 0
            torch.cuda.synchronize(device)
            return tokens / (time.perf_counter() - start), rounds

        run()
        base, _ = run()
        rows[mode] = {"target-only": {"tokens_per_second": base, "speedup": 1.0}}
        for name, shape in SHAPES.items():
            kwargs = dict(assistant_model=draft, verifier=ExactVerifier(), **shape)
            run(**kwargs)
            speed, rounds = run(**kwargs)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    _, sync_rounds = run(**kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in caught)
            rows[mode][name] = {
                "tokens_per_second": speed,
                "speedup": speed / base,
                "host_syncs_per_round": syncs / max(sync_rounds, 1),
            }
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA device on this machine: tree_gpu.py measures on a GPU only (nothing to do here).")
        return 0
    device = torch.device("cuda")
    target, draft, tokenizer = load(args, device)
    prompts = everyday_prompts(min(args.num_prompts, 2) if args.quick else args.num_prompts)
    rows = measure(target, draft, tokenizer, prompts, 16 if args.quick else args.max_new_tokens, device)
    print(f"{torch.cuda.get_device_name(device)}, batch 1, lossless SD, {len(prompts)} everyday prompts")
    print(f"{'mode':<7} {'method':<16} {'tokens/s':>9} {'x target':>9} {'syncs/round':>12}")
    for mode, methods in rows.items():
        for name, row in methods.items():
            syncs = row.get("host_syncs_per_round")
            print(
                f"{mode:<7} {name:<16} {row['tokens_per_second']:9.1f} {row['speedup']:8.2f}x "
                f"{'' if syncs is None else f'{syncs:12.1f}'}"
            )
    if args.output:
        write_text_atomic(args.output, json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
