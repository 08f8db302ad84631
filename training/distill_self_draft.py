"""The real pair's self-draft (docs/real_pair.md): the target's first layers plus a LoRA adapter, distilled from the target.

    python training/distill_self_draft.py                    # into runs/self_draft/draft; CPU, see docs/real_pair.md
    python training/distill_self_draft.py --save_to diversed_hf/testbed/assets/smollm2/draft   # then ships it there

1. **Corpus.** SmolLM2-135M-Instruct answers the training prompts of the real pair's tasks
   (``arith_chat``: ``--num_arith`` problems; ``humaneval``: its 44 training problems, ``--code_samples``
   answers each), sampled at ``--temperature`` (the temperature the pair is evaluated at), and the
   target's top ``--top_k`` log-probabilities at every answer position are kept (``corpus.pt`` in
   ``--output_dir``; a later run with the same settings reuses it).
2. **Distillation.** The draft (:func:`diversed_hf.testbed.smollm2.build_self_draft`: first
   ``--num_layers`` layers, LM head over the first ``--draft_vocab_size`` ids) gets a LoRA adapter of
   rank ``--lora_r`` on every linear layer and on the head, trained for ``--epochs`` on the forward
   KL to the target's (top-k) distribution at the answer positions: sequence-level distillation on
   the target's own answers, token-level on its distributions.
3. **Saved**: the adapter (peft's format) and ``self_draft.json`` (layer count, head size, settings,
   the held-out acceptance ``1 - TV`` before and after) in ``--save_to``.

Seeded (corpus sampling, split, initialisation, batch order). Every argument has both spellings
(``--num_layers``, ``--num-layers``).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

import torch

from diversed_hf.cli.ship import save_location
from diversed_hf.lab.cli_utils import ArgumentParser, check_output_dir, run_script
from diversed_hf.lab.tasks import load_task_dataset
from diversed_hf.testbed import smollm2  # noqa: E402  (also registers the testbed's tasks)

logger = logging.getLogger("distill_self_draft")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


CARD = """---
library_name: peft
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
tags: [speculative-decoding, diversed_hf, self-draft]
---

# Self-draft for SmolLM2-135M-Instruct

A LoRA adapter for a draft built from SmolLM2-135M-Instruct itself: its first {num_layers} layers, its embeddings
and final norm, and an LM head over its first {draft_vocab_size} token ids. Made for speculative decoding with
`diversed_hf` (docs/real_pair.md):

```python
from diversed_hf import testbed

REPO = Path(__file__).resolve().parents[1]
target, draft, tokenizer = testbed.load_pair("smollm2")   # rebuilds this draft from the target in seconds
```

Distilled from the target (forward KL to its top-k distributions at temperature 0.7) on its own answers to
{corpus_answers} training prompts of `arith_chat` and `humaneval`. Lossless SD acceptance estimated on held-out
answers (sum of min(p, q) over the target's top-k): {held_out_acceptance_before} before, {held_out_acceptance_after}
after. Rebuild with:

```bash
{recipe}
```
"""


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    options = [
        ("output_dir", str, "runs/self_draft", "work directory (corpus, logs)"),
        ("save_to", str, None, "where the adapter and self_draft.json go (default <output_dir>/draft)"),
        ("num_layers", int, 4, "target layers the draft keeps"),
        ("draft_vocab_size", int, 8192, "ids the draft's head scores (the first ones)"),
        ("lora_r", int, 32, "LoRA rank"),
        ("lora_alpha", int, 64, "LoRA alpha"),
        ("num_arith", int, 256, "arith_chat training problems answered by the target"),
        ("code_samples", int, 1, "target answers per HumanEval training problem"),
        ("arith_max_new_tokens", int, 96, "length limit of the target's arith_chat answers"),
        ("code_max_new_tokens", int, 160, "length limit of its HumanEval answers (a prefix is enough to distil on)"),
        ("temperature", float, 0.7, "sampling temperature of the corpus and of the distilled distributions"),
        ("top_k", int, 64, "target log-probabilities kept per position"),
        ("generation_batch_size", int, 32, "prompts per target generate call"),
        ("epochs", int, 3, "passes over the corpus"),
        ("batch_size", int, 8, "sequences per step"),
        ("learning_rate", float, 1e-3, "AdamW learning rate (cosine decay after a warm-up of 1/20 of the steps)"),
        ("held_out", float, 0.1, "fraction of the corpus kept out of training to measure acceptance"),
        ("seed", int, 0, "seed of the corpus sampling, the split and the training"),
        ("threads", int, None, "torch CPU threads"),
    ]
    for name, kind, default, help_text in options:
        parser.add_argument(f"--{name}", type=kind, default=default, help=help_text)
    args = parser.parse_args(argv)
    for name in (
        "num_layers",
        "draft_vocab_size",
        "lora_r",
        "epochs",
        "batch_size",
        "top_k",
        "generation_batch_size",
        "arith_max_new_tokens",
        "code_max_new_tokens",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        parser.error(f"--temperature must be a positive number, got {args.temperature}")
    if not 0 < args.held_out < 1:
        parser.error(f"--held_out must be in (0, 1), got {args.held_out}")
    return args


def build_corpus(target, tokenizer, args) -> list[dict]:
    """The target's answers to the training prompts, with its top-k log-probabilities at each answer position."""
    arith = load_task_dataset("arith_chat", split="train", num_examples=args.num_arith, seed=args.seed)
    code = load_task_dataset("humaneval", split="train")
    jobs = [(p, args.arith_max_new_tokens) for p in arith["prompt"]]
    jobs += [(p, args.code_max_new_tokens) for p in code["prompt"] for _ in range(args.code_samples)]
    tokenizer.padding_side = "left"
    torch.manual_seed(args.seed)
    corpus = []
    from tqdm.auto import tqdm

    with tqdm(total=len(jobs), desc="target answers") as bar:
        for start in range(0, len(jobs), args.generation_batch_size):
            chunk = jobs[start : start + args.generation_batch_size]
            encoded = tokenizer([p for p, _ in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = target.generate(
                    **encoded,
                    do_sample=True,
                    temperature=args.temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max(n for _, n in chunk),
                    output_scores=True,
                    return_dict_in_generate=True,
                    pad_token_id=tokenizer.pad_token_id,
                )
            width = encoded["input_ids"].shape[1]
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # (b, new, V)
            top_logprobs, top_ids = scores.topk(args.top_k, dim=-1)  # (b, new, k)
            for row, (prompt, limit) in enumerate(chunk):
                new = out.sequences[row, width:]
                length = int((new != tokenizer.pad_token_id).sum()) + 1  # up to and including EOS
                length = min(length, limit, new.shape[0])
                prompt_ids = encoded["input_ids"][row][encoded["attention_mask"][row].bool()]
                corpus.append(
                    {
                        "ids": torch.cat([prompt_ids, new[:length]]),
                        "start": prompt_ids.shape[0],
                        "top_ids": top_ids[row, :length].to(torch.int32),
                        "top_logprobs": top_logprobs[row, :length].half(),
                    }
                )
            bar.update(len(chunk))
    return corpus


def kd_loss(draft, batch: list[dict], vocab: int, temperature: float, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward KL (up to the target's entropy) at the answer positions, and the per-position 1 - TV on the top-k."""
    length = max(e["ids"].shape[0] for e in batch)
    ids = torch.full((len(batch), length), pad_id)  # (b, L), right-padded
    mask = torch.zeros(len(batch), length, dtype=torch.long)
    for row, example in enumerate(batch):
        ids[row, : example["ids"].shape[0]] = example["ids"]
        mask[row, : example["ids"].shape[0]] = 1
    logits = draft(input_ids=ids, attention_mask=mask).logits.float() / temperature  # (b, L, V')
    losses, overlaps = [], []
    for row, example in enumerate(batch):
        start, n = example["start"], example["top_ids"].shape[0]
        draft_logprobs = logits[row, start - 1 : start - 1 + n].log_softmax(-1)  # (n, V')
        top_ids = example["top_ids"].long()  # (n, k)
        target_probs = example["top_logprobs"].float().exp() * (
            top_ids < vocab
        )  # (n, k): ids the draft cannot score count 0
        gathered = draft_logprobs.gather(-1, top_ids.clamp(max=vocab - 1))  # (n, k)
        losses.append(-(target_probs * gathered).sum(-1))
        overlaps.append(torch.minimum(target_probs, gathered.exp() * (top_ids < vocab)).sum(-1).detach())
    return torch.cat(losses).mean(), torch.cat(overlaps)


def evaluate(draft, corpus, args, pad_id) -> float:
    """Mean of sum_x min(p, q) over the top-k at held-out answer positions: lossless SD's acceptance, estimated."""
    draft.eval()
    with torch.no_grad():
        overlaps = [
            kd_loss(draft, corpus[i : i + args.batch_size], args.draft_vocab_size, args.temperature, pad_id)[1]
            for i in range(0, len(corpus), args.batch_size)
        ]
    return float(torch.cat(overlaps).mean())


def corpus_for(target, tokenizer, args, corpus_file: Path) -> list[dict]:
    """The corpus in ``corpus_file`` when it was built with these settings; else a new one, saved there."""
    corpus_settings = {
        k: getattr(args, k)
        for k in (
            "num_arith",
            "code_samples",
            "arith_max_new_tokens",
            "code_max_new_tokens",
            "temperature",
            "top_k",
            "seed",
            "generation_batch_size",
        )
    }
    saved = torch.load(corpus_file) if corpus_file.is_file() else None
    if saved is not None and saved["settings"] == corpus_settings:
        corpus = saved["corpus"]
        logger.info("reusing the corpus in %s (%d answers)", corpus_file, len(corpus))
    else:
        corpus = build_corpus(target, tokenizer, args)
        torch.save({"settings": corpus_settings, "corpus": corpus}, corpus_file)
    return corpus


def distil(model, train: list[dict], args, pad_id: int, generator: torch.Generator, log_path: Path) -> None:
    """``--epochs`` passes of AdamW on :func:`kd_loss` over ``train`` (batch order from ``generator``; warm-up, then
    cosine decay; gradients clipped at 1), the loss and acceptance logged to ``log_path`` every 20 steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    steps = args.epochs * math.ceil(len(train) / args.batch_size)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    )
    log = open(log_path, "w")
    step = 0
    for epoch in range(args.epochs):
        model.train()
        permutation = torch.randperm(len(train), generator=generator).tolist()
        for start in range(0, len(train), args.batch_size):
            batch = [train[i] for i in permutation[start : start + args.batch_size]]
            loss, overlap = kd_loss(model, batch, args.draft_vocab_size, args.temperature, pad_id)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step % 20 == 0 or step == steps:
                record = {
                    "step": step,
                    "epoch": epoch,
                    "loss": round(loss.item(), 4),
                    "acceptance": round(overlap.mean().item(), 4),
                }
                log.write(json.dumps(record) + "\n")
                log.flush()
                logger.info("step %d/%d loss %.4f acceptance %.3f", step, steps, loss.item(), overlap.mean().item())
    log.close()


def save_draft(model, save_to: Path, args, measured: dict, train_started: float) -> None:
    """The adapter, ``self_draft.json`` (what the draft is, its recipe and settings, then ``measured``, the training
    time since ``train_started`` and the threads) and the card ``README.md``, in ``save_to``."""
    save_to.mkdir(parents=True, exist_ok=True)
    # Only the LoRA weights: the pruned head's base rows are the target's and are rebuilt from it.
    model.save_pretrained(str(save_to), save_embedding_layers=False)
    settings = {k: v for k, v in vars(args).items() if k not in ("output_dir", "save_to", "threads")}
    (save_to / "self_draft.json").write_text(
        json.dumps(
            {
                "base_model": smollm2.MODEL_IDS["target"],
                "num_layers": args.num_layers,
                "draft_vocab_size": args.draft_vocab_size,
                "recipe": "python training/distill_self_draft.py "
                + " ".join(f"--{k} {v}" for k, v in settings.items()),
                "settings": settings,
                **measured,
                "train_seconds": round(time.time() - train_started),
                "threads": torch.get_num_threads(),
            },
            indent=2,
        )
        + "\n"
    )
    (save_to / "README.md").write_text(CARD.format(**json.loads((save_to / "self_draft.json").read_text())))


def main(argv=None) -> Path:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    output_dir = Path(args.output_dir)
    destination = save_location(args.save_to or output_dir / "draft", "--save_to", output_dir)
    save_to = destination.folder  # a folder of the testbed's assets is written in the run, then shipped there
    check_output_dir(output_dir, "--output_dir")  # before the model loads, not after the corpus
    check_output_dir(save_to, "--save_to")
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    target, tokenizer = smollm2.load_smollm2_target(torch_dtype=torch.float32)  # distilled in float32
    corpus = corpus_for(target, tokenizer, args, output_dir / "corpus.pt")
    corpus_seconds = time.time() - started

    generator = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(corpus), generator=generator).tolist()
    num_held_out = max(1, int(args.held_out * len(corpus)))
    held_out, train = [corpus[i] for i in order[:num_held_out]], [corpus[i] for i in order[num_held_out:]]

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(args.seed)
    draft = smollm2.build_self_draft(target, args.num_layers, args.draft_vocab_size)
    del target
    pad_id = tokenizer.pad_token_id
    acceptance_before = evaluate(draft, held_out, args, pad_id)
    logger.info("held-out acceptance before distillation: %.3f", acceptance_before)
    lora = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0, target_modules=LORA_TARGETS)
    model = get_peft_model(draft, lora)
    train_started = time.time()
    distil(model, train, args, pad_id, generator, output_dir / "train_log.jsonl")
    acceptance_after = evaluate(model, held_out, args, pad_id)
    logger.info("held-out acceptance after distillation: %.3f (before %.3f)", acceptance_after, acceptance_before)

    measured = {
        "corpus_answers": len(corpus),
        "held_out_acceptance_before": round(acceptance_before, 4),
        "held_out_acceptance_after": round(acceptance_after, 4),
        "corpus_seconds": round(corpus_seconds),
    }
    save_draft(model, save_to, args, measured, train_started)
    logger.info("saved the adapter and self_draft.json to %s", save_to)
    destination.finish()
    return save_to


if __name__ == "__main__":
    sys.exit(run_script(main))
