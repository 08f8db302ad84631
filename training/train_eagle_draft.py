"""Distil an EAGLE-style feature draft (``diversed_hf.EagleDraft``) from its target, on the target's own responses.

    python training/train_eagle_draft.py                       # the real pair: runs/eagle_draft/{data,checkpoints,draft}
    python training/train_eagle_draft.py --save_to diversed_hf/testbed/assets/smollm2/eagle   # replaces the shipped one

    python training/train_eagle_draft.py --prompts my_chats.jsonl --num_chat 0   # on your own conversations

1. **Data** (``--output_dir``/data): SmolLM2-135M-Instruct answers chat prompts (``--num_chat`` everyday requests of
   the broad chat set, or your own with ``--prompts``; ``arith_chat`` and ``humaneval`` training problems;
   explanations of standard-library functions: ``diversed_hf.tasks.eagle_prompts``), sampled at
   ``--temperature`` (every ``1/--greedy_fraction``-th prompt greedily); its last hidden state and top-``--top_k``
   log-probabilities are kept at every position from the same passes (``diversed_hf.training.eagle_data``). Resumable
   shard by shard.
2. **Distillation** (``--output_dir``/checkpoints): an ``EagleDraft.for_target(target, num_layers=--num_layers,
   draft_vocab_ids=the --draft_vocab_size ids most frequent in the data)`` learns, at response positions, the target's
   next feature (smooth L1), its soft labels (cross-entropy to the top-k) and their total variation, over
   ``--unroll`` steps on its own features (training-time test: step ``j`` reads the features the draft predicted at
   step ``j - 1``). Held-out sequences measure ``sum_x min(p, q)`` (lossless SD's acceptance at temperature 1) per
   unrolled step. A checkpoint every ``--save_steps`` steps; a rerun resumes from the newest.
3. **Saved** (``--save_to``): the draft in the Hub format (``config.json``, ``model.safetensors``,
   ``generation_config.json``), its card (``README.md``) and ``training.json`` (settings, seed, timings, held-out
   acceptance).

Seeded (prompts, sampling, split, initialisation, batch order). Every option has both spellings
(``--num_layers``, ``--num-layers``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from pathlib import Path

import torch

from diversed_hf.cli_utils import ArgumentParser, check_output_dir, run_script

logger = logging.getLogger("train_eagle_draft")

OPTIONS = [
    ("output_dir", str, "runs/eagle_draft", "work directory (data shards, checkpoints)"),
    ("save_to", str, None, "where the trained draft goes (default <output_dir>/draft)"),
    ("num_chat", int, 1500, "everyday requests of the broad chat set the target answers"),
    (
        "prompts",
        str,
        None,
        "your own prompts instead of the broad set: a .jsonl file, a datasets directory or a dataset "
        "name (rows with messages / conversations, or prompt / instruction / question / text)",
    ),
    ("num_user_prompts", int, None, "read only the first rows of --prompts"),
    ("chat_max_new_tokens", int, 96, "response length limit of the chat prompts"),
    ("num_arith", int, 250, "arith_chat training problems the target answers"),
    ("code_samples", int, 1, "target answers per humaneval training problem"),
    ("num_docstrings", int, 40, "standard-library functions the target explains"),
    ("temperature", float, 0.7, "sampling temperature of the responses"),
    ("greedy_fraction", float, 0.25, "share of prompts answered greedily"),
    ("top_k", int, 32, "target log-probabilities kept per position"),
    ("generation_batch_size", int, 32, "prompts decoded together"),
    ("num_layers", int, 1, "decoder layers of the draft"),
    ("draft_vocab_size", int, 8192, "ids the draft scores (the most frequent in the data; 0: all)"),
    ("unroll", int, 3, "training-time test: steps on the draft's own features"),
    ("epochs", int, 3, "passes over the training sequences"),
    ("batch_size", int, 8, "sequences per step"),
    ("learning_rate", float, 1e-3, "AdamW learning rate (cosine decay after a warm-up of 1/20 of the steps)"),
    ("feature_weight", float, 1.0, "weight of the feature regression loss"),
    ("tv_weight", float, 1.0, "weight of the total-variation loss"),
    ("held_out", float, 0.05, "fraction of the sequences kept out to measure acceptance"),
    ("save_steps", int, 100, "checkpoint every this many steps"),
    ("seed", int, 0, "seed of the prompts, sampling, split and training"),
    ("threads", int, None, "torch CPU threads"),
]


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, kind, default, help_text in OPTIONS:
        parser.add_argument(f"--{name}", type=kind, default=default, help=help_text)
    parser.add_argument("--data_only", action="store_true", help="stop after collecting the data")
    args = parser.parse_args(argv)
    for name in (
        "num_layers",
        "unroll",
        "epochs",
        "batch_size",
        "top_k",
        "generation_batch_size",
        "save_steps",
        "chat_max_new_tokens",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    for name in ("num_chat", "num_arith", "code_samples", "num_docstrings"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be 0 or a positive integer, got {getattr(args, name)}")
    if args.num_user_prompts is not None and args.num_user_prompts < 1:
        parser.error(f"--num_user_prompts must be a positive integer, got {args.num_user_prompts}")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        parser.error(
            f"--temperature must be a positive finite number, got {args.temperature} (greedy answers come from "
            "--greedy_fraction; --greedy_fraction 1 answers every prompt greedily)"
        )
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        parser.error(f"--learning_rate must be a positive finite number, got {args.learning_rate}")
    for name in ("tv_weight", "feature_weight"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            parser.error(f"--{name} must be a finite number >= 0, got {value}")
    if not args.prompts and args.num_chat + args.num_arith + args.code_samples + args.num_docstrings == 0:
        parser.error(
            "the prompt mix is empty (--num_chat, --num_arith, --code_samples and --num_docstrings are all 0, and no "
            "--prompts): give the target something to answer"
        )
    if args.draft_vocab_size < 0:
        parser.error(f"--draft_vocab_size must be 0 (all ids) or positive, got {args.draft_vocab_size}")
    if not 0 < args.held_out < 1:
        parser.error(f"--held_out must be in (0, 1), got {args.held_out}")
    if not 0 <= args.greedy_fraction <= 1:
        parser.error(f"--greedy_fraction must be in [0, 1], got {args.greedy_fraction}")
    return args


def main(argv=None) -> Path:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from diversed_hf.tasks.eagle_prompts import eagle_prompt_mix, interleave
    from diversed_hf.testbed import smollm2  # registers the testbed's tasks
    from diversed_hf.training.eagle_data import CollectionSettings, collect, collection_seconds
    from diversed_hf.training.eagle_distill import DistillSettings, check_save_to, distill

    output_dir = Path(args.output_dir)
    save_to = Path(args.save_to or output_dir / "draft")
    check_output_dir(output_dir, "--output_dir")
    check_output_dir(save_to, "--save_to")
    # the draft replaces --save_to whole: neither the data nor the checkpoints, nor files not an earlier draft's
    check_save_to(save_to, output_dir / "data", output_dir / "checkpoints", "--save_to")
    # every setting is checked before the target loads, not after the collection
    settings = CollectionSettings(
        temperature=args.temperature,
        greedy_fraction=args.greedy_fraction,
        top_k=args.top_k,
        batch_size=args.generation_batch_size,
        seed=args.seed,
    )
    distill_settings = DistillSettings(
        num_layers=args.num_layers,
        draft_vocab_size=args.draft_vocab_size or None,
        unroll=args.unroll,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        feature_weight=args.feature_weight,
        tv_weight=args.tv_weight,
        held_out=args.held_out,
        save_steps=args.save_steps,
        seed=args.seed,
    )
    started = time.time()
    user_prompts = None
    if args.prompts:
        from diversed_hf.tasks.chat_prompts import load_user_prompts

        user_prompts = load_user_prompts(args.prompts, args.num_user_prompts)
    mix = eagle_prompt_mix(
        args.num_arith,
        args.code_samples,
        args.num_docstrings,
        num_chat=args.num_chat,
        chat_prompts=user_prompts,
        chat_max_new_tokens=args.chat_max_new_tokens,
        seed=args.seed,
    )
    prompts = interleave(mix, args.seed)
    chat_source = f"your prompts ({args.prompts})" if args.prompts else "everyday requests of the broad chat set"
    prompt_mix = {chat_source if name == "chat" else name: len(jobs) for name, jobs in mix.items() if jobs}
    target, tokenizer = smollm2.load_smollm2_target()
    collect(target, tokenizer, prompts, output_dir / "data", settings)
    data_seconds = collection_seconds(output_dir / "data") or (time.time() - started)
    logger.info("data: %d prompts, %.0f s of decoding", len(prompts), data_seconds)
    if args.data_only:
        return output_dir / "data"
    recipe = "python training/train_eagle_draft.py " + " ".join(argv if argv is not None else sys.argv[1:])
    return distill(
        target,
        output_dir / "data",
        output_dir / "checkpoints",
        save_to,
        distill_settings,
        extra_record={
            "data_seconds": round(data_seconds),
            "num_prompts": len(prompts),
            "prompt_mix": prompt_mix,
            "recipe": recipe.strip(),
            "collection": dataclasses.asdict(settings),
        },
    )


if __name__ == "__main__":
    sys.exit(run_script(main))
