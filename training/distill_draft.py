"""The "SD with fine-tuned draft" baseline (docs/method.md §7): distil the draft toward the target with LoRA and TRL's SFT.

    python training/distill_draft.py --task testbed_arith --output_dir runs/distill_arith --bf16 false \\
        --save_dtype bfloat16   # as the shipped one, into runs/distill_arith/merged; CPU, ~3 min
                                # (--merged_dir diversed_hf/testbed/assets/drafts_ft/arith replaces the shipped one, through diversed-hf ship)
    python training/distill_draft.py --task gsm8k --target_model meta-llama/Llama-3.1-8B-Instruct \\
        --draft_model meta-llama/Llama-3.2-1B-Instruct --dtype bfloat16 --num_shots 4 --output_dir runs/distill_gsm8k

1. The target completes ``num_train_examples`` training prompts of the task (sampled at
   ``teacher_temperature``, so the draft learns the target's distribution, not just its mode:
   sequence-level knowledge distillation).
2. ``trl.SFTTrainer`` fine-tunes a LoRA adapter (``peft``) on the draft with the loss on the
   completion tokens only (prompt-completion dataset).
3. The adapter is merged into the draft's weights and the merged draft is saved, with the
   tokenizer, to ``merged_dir`` (default ``<output_dir>/merged``): a plain ``from_pretrained``
   model to use as ``assistant_model`` with ``ExactVerifier`` (lossless SD) or with a head.

Arguments: :class:`DistillArguments` plus every field of ``trl.SFTConfig`` (``--config`` YAML works too), in
either spelling (``--max_steps``, ``--max-steps``). Both output directories are checked before the models load.
A bad argument or config ends as one line with exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer, TrlParser

from diversed_hf.cli.ship import save_location
from diversed_hf.lab.cli_utils import check_output_dir, run_script
from diversed_hf.lab.tasks import get_task

REPO = Path(__file__).resolve().parents[1]

logger = logging.getLogger("distill_draft")


@dataclass
class DistillArguments:
    task: str = field(
        metadata={"help": "Task whose training prompts are completed by the target (see diversed_hf.lab.tasks)."}
    )
    target_model: str = field(default="testbed", metadata={"help": "Target model id/path, or 'testbed'."})
    draft_model: str | None = field(default=None, metadata={"help": "Draft model id/path (not with the testbed)."})
    dtype: str = field(default="float32", metadata={"help": "dtype of the models."})
    device: str | None = field(default=None, metadata={"help": "Device (default: cuda if available)."})
    num_train_examples: int = field(default=1000, metadata={"help": "Training prompts completed by the target."})
    num_shots: int = field(default=0, metadata={"help": "Few-shot exemplars per prompt (Hub tasks)."})
    train_data_files: str | None = field(default=None, metadata={"help": "Local training file (Hub dataset schema)."})
    teacher_temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature of the target's completions."}
    )
    max_new_tokens: int = field(default=128, metadata={"help": "Length limit of the target's completions."})
    generation_batch_size: int = field(default=50, metadata={"help": "Prompts per target generate call."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: str = field(
        default="all-linear", metadata={"help": "LoRA target modules ('all-linear' or a comma list)."}
    )
    merged_dir: str | None = field(
        default=None, metadata={"help": "Where the merged draft goes (default <output_dir>/merged)."}
    )
    save_dtype: str | None = field(
        default=None, metadata={"help": "dtype of the saved merged draft (default: --dtype)."}
    )
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads."})


def teacher_completions(target, tokenizer, prompts: list[str], args: DistillArguments, seed: int) -> list[str]:
    """The target's sampled completions of ``prompts`` (text after the prompt, EOS removed)."""
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    completions = []
    for start in range(0, len(prompts), args.generation_batch_size):
        encoded = tokenizer(prompts[start : start + args.generation_batch_size], return_tensors="pt", padding=True)
        encoded = encoded.to(target.device)
        with torch.no_grad():
            out = target.generate(
                **encoded,
                do_sample=True,
                temperature=args.teacher_temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        texts = tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        completions += [" " + t.strip() for t in texts]
    return completions


def main(argv=None):
    parser = TrlParser((DistillArguments, SFTConfig))
    args, sft_config = parser.parse_args_and_config(args=argv)
    destination = save_location(
        args.merged_dir or Path(sft_config.output_dir) / "merged", "--merged_dir", sft_config.output_dir
    )
    merged_dir = destination.folder  # a folder of the testbed's assets is written in the run, then shipped there
    check_output_dir(sft_config.output_dir, "--output_dir")  # before the models load, not after training
    check_output_dir(merged_dir, "--merged_dir")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from diversed_hf.cli.evaluation import load_models, load_task_data  # also registers the testbed's tasks

    get_task(args.task)  # an unknown task fails here, before any model is loaded

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target, draft, tokenizer = load_models(args.target_model, args.draft_model, args.dtype, device)
    merged_dir.mkdir(parents=True, exist_ok=True)

    data = load_task_data(
        args.task,
        "train",
        args.num_train_examples,
        sft_config.seed,
        num_shots=args.num_shots,
        data_files=args.train_data_files,
    )
    prompts = list(data["prompt"])
    logger.info("sampling %d target completions", len(prompts))
    completions = teacher_completions(target, tokenizer, prompts, args, sft_config.seed)
    dataset = Dataset.from_dict({"prompt": prompts, "completion": completions})

    modules = args.lora_target_modules
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        task_type="CAUSAL_LM",
        target_modules=modules if modules == "all-linear" else [m.strip() for m in modules.split(",")],
    )
    draft.train()
    trainer = SFTTrainer(
        model=draft, args=sft_config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora
    )
    trainer.train()
    merged = trainer.model.merge_and_unload()
    merged.eval()
    merged.config.use_cache = True  # training turned it off; the saved draft is for generation
    if args.save_dtype:
        merged = merged.to(getattr(torch, args.save_dtype))
        merged.config.dtype = getattr(torch, args.save_dtype)
    merged.save_pretrained(str(merged_dir))
    tokenizer.save_pretrained(str(merged_dir))
    (merged_dir / "distillation.json").write_text(
        json.dumps(
            {
                "base_draft": args.draft_model or "testbed draft",
                "target": args.target_model,
                "task": args.task,
                "num_train_examples": len(prompts),
                "teacher_temperature": args.teacher_temperature,
                "lora": {"r": args.lora_r, "alpha": args.lora_alpha, "target_modules": modules},
                "train_loss": trainer.state.log_history[-1].get("train_loss"),
            },
            indent=2,
        )
        + "\n"
    )
    logger.info("saved the merged draft to %s", merged_dir)
    destination.finish()
    return merged_dir


if __name__ == "__main__":
    sys.exit(run_script(main))
