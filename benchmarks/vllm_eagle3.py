"""The real pair's EAGLE-3 draft served by vLLM's ``eagle3`` method against ``generate`` (RESULTS.md "EAGLE-3 draft";
docs/eagle.md), in vLLM's environment:

    .venv-vllm/bin/python benchmarks/vllm_eagle3.py

The draft is exported with ``save_pretrained(path, format="eagle3")`` and served with ``method: "eagle3"`` and the
DIVERSED plugin (lossless, ``target_weight`` 1); ``generate`` runs the same weights with ``ExactVerifier`` on the same
held-out everyday prompts, greedy, float32, a chain of ``--num_draft_tokens``. Reported: each side's share of drafts
accepted and whether vLLM's greedy text is the target's. Writes ``results/vllm_eagle3.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    from diversed_hf.lab.cli_utils import ArgumentParser, write_text_atomic

    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=16)
    parser.add_argument("--max_tokens", type=int, default=48)
    parser.add_argument("--num_draft_tokens", type=int, default=3)
    parser.add_argument("--output_dir", default=str(REPO / "runs" / "vllm_eagle3"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from vllm import LLM, SamplingParams

    from diversed_hf import ExactVerifier, enable_diversed, testbed
    from diversed_hf.lab.tasks.chat_prompts import everyday_prompts
    from diversed_hf.testbed import smollm2

    target, draft, tokenizer = testbed.load_pair("smollm2", draft="eagle3", torch_dtype=torch.float32)
    enable_diversed(target)
    export = draft.save_pretrained(Path(args.output_dir) / "export", format="eagle3")
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in everyday_prompts(args.num_prompts)]
    accepted = drafted = 0
    expected = []
    for ids in prompts:
        out = target.generate(
            torch.tensor([ids]),
            assistant_model=draft,
            verifier=ExactVerifier(),
            do_sample=False,
            max_new_tokens=args.max_tokens,
            num_assistant_tokens=args.num_draft_tokens,
            assistant_tree_top_k=1,
            return_dict_in_generate=True,
        )
        accepted, drafted = accepted + out.speculation.total_accepted, drafted + out.speculation.total_drafted
        expected.append(target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=args.max_tokens)[0])
    llm = LLM(
        model=str(smollm2.target_dir()),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,  # as the plugin's tests and benchmarks serve (a compiled engine's warm-up is not verified)
        seed=0,
        disable_log_stats=False,  # the spec-decoding counters read below
        max_num_seqs=8,
        speculative_config={
            "method": "eagle3",
            "model": str(export),
            "num_speculative_tokens": args.num_draft_tokens,
            "draft_sample_method": "probabilistic",
        },
        additional_config={"diversed": {"target_weight": 1.0}},
    )
    before = {metric.name: metric for metric in llm.get_metrics()}
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids in prompts],
        SamplingParams(temperature=0.0, max_tokens=args.max_tokens),
        use_tqdm=False,
    )
    after = {metric.name: metric for metric in llm.get_metrics()}

    def counter(name):
        return after[name].value - (before[name].value if name in before else 0)

    served = counter("vllm:spec_decode_num_accepted_tokens") / max(counter("vllm:spec_decode_num_draft_tokens"), 1)
    same = sum(
        list(output.outputs[0].token_ids) == reference[len(ids) :].tolist()[: len(output.outputs[0].token_ids)]
        for ids, output, reference in zip(prompts, outputs, expected)
    )
    text = (
        "Measured with `.venv-vllm/bin/python benchmarks/vllm_eagle3.py`: SmolLM2-135M-Instruct with its EAGLE-3 draft, "
        f"float32, {len(prompts)} held-out everyday prompts x {args.max_tokens} tokens, greedy, N = "
        f'{args.num_draft_tokens}, lossless. Drafts accepted: vLLM `eagle3` (the `format="eagle3"` export, the '
        f"DIVERSED plugin) {100 * served:.1f} %, `generate` {100 * accepted / drafted:.1f} % "
        f"({100 * (served - accepted / drafted):+.1f} points); vLLM's greedy text is the target's on {same} of "
        f"{len(prompts)} prompts.\n"
    )
    write_text_atomic(REPO / "results" / "vllm_eagle3.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
