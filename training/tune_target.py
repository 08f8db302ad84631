"""Tune SmolLM2-135M-Instruct on the real pair's tasks with a LoRA adapter: the task-tuned target (docs/real_pair.md).

    python training/tune_target.py --config training/configs/smollm2_tuned_target.yaml      # into runs/tuned_target
    python training/tune_target.py --config training/configs/smollm2_tuned_target.yaml \\
        --save_to diversed_hf/testbed/assets/smollm2/tuned                   # the shipped adapter (through the ship step)

1. **Chat answers** (``--output_dir``/chat_answers.jsonl): the base model answers ``--num_chat`` everyday requests of
   the broad chat set (``diversed_hf.lab.tasks.chat_prompts.broad_chat_prompts``) greedily, at most
   ``--chat_max_new_tokens`` tokens each. Answers cut off there, or empty, are left out of training (a cut-off answer
   would teach the model to stop mid-sentence). Written batch by batch: a rerun answers only what is missing.
2. **Supervised fine-tuning** (``--output_dir``/checkpoints): TRL's ``SFTTrainer`` on prompt/completion pairs, the loss
   on the completion only: the training splits of ``synopsis`` (``--num_synopsis``) and ``arith_steps``
   (``--num_arith_steps``), each prompt the task's chat prompt and each completion its reference, and the chat answers,
   which keep the model an instruct model. Every completion ends with the end-of-turn token ``<|im_end|>``. A LoRA
   adapter (``--lora_r``, ``--lora_alpha``, ``--lora_dropout``) on ``--target_modules`` of every layer; a checkpoint
   every ``--save_steps`` optimizer steps.
3. **Saved** (``--save_to``, default ``<output_dir>/adapter``, replaced whole): the adapter alone
   (``adapter_config.json``, ``adapter_model.safetensors`` in bfloat16), ``training.json`` (settings, seed, data
   counts, steps, time summed over the sessions, the command line) and the card ``README.md``.

**Resumable.** Rerun the same command: the chat answers are reused, and training resumes from the newest complete
checkpoint (optimizer, schedule, data order and random state included), so a long run spreads over several sessions.
A rerun may raise ``--max_steps`` / ``--epochs`` to train on; it may not change what the data, the adapter or the
optimizer are (``<output_dir>/run.json`` records them): pass another ``--output_dir`` for another run.

``--config`` reads a YAML recipe whose keys are these options; flags given on the command line override it. Every
option has both spellings (``--lora_r``, ``--lora-r``). Every value is checked before any model loads.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from diversed_hf.cli.ship import save_location
from diversed_hf.lab.cli_utils import ArgumentParser, check_output_dir, run_script, write_text_atomic
from diversed_hf.testbed.cards import REAL_PAIR_MODEL_IDS

logger = logging.getLogger("tune_target")

#: the linear layers of a Llama decoder layer, where the adapter may go
LLAMA_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OPTIONS = [
    ("config", str, None, "a YAML recipe (training/configs/smollm2_tuned_target.yaml) whose keys are these options"),
    ("output_dir", str, "runs/tuned_target", "work directory (chat answers, checkpoints)"),
    ("save_to", str, None, "where the adapter, training.json and the card go (default <output_dir>/adapter)"),
    ("num_synopsis", int, 1000, "synopsis training pairs (its train split has 1904)"),
    ("num_arith_steps", int, 1000, "arith_steps training problems"),
    ("num_chat", int, 800, "everyday chat requests the base model answers (about half finish within the limit)"),
    ("chat_max_new_tokens", int, 256, "length limit of the base model's chat answers (longer ones are left out)"),
    ("generation_batch_size", int, 16, "chat requests answered together"),
    ("lora_r", int, 16, "LoRA rank"),
    ("lora_alpha", int, 32, "LoRA alpha (the update is scaled by alpha / r)"),
    ("lora_dropout", float, 0.05, "dropout on the LoRA input"),
    ("target_modules", str, list(LLAMA_LINEAR), f"the layers the adapter goes on, among {', '.join(LLAMA_LINEAR)}"),
    (
        "mixed_precision",
        str,
        "no",
        "'bf16': bfloat16 autocast over float32 weights (about 1.5x faster on a CPU with AVX512-BF16); 'no': float32",
    ),
    ("learning_rate", float, 2e-4, "AdamW learning rate (cosine decay after a warm-up of 3 %% of the steps)"),
    ("epochs", float, 2.0, "passes over the training pairs"),
    ("max_steps", int, None, "optimizer steps; overrides --epochs"),
    ("batch_size", int, 4, "sequences per forward pass"),
    ("gradient_accumulation_steps", int, 4, "forward passes per optimizer step"),
    ("max_length", int, 512, "tokens per sequence, prompt included (longer ones are cut)"),
    ("save_steps", int, 10, "checkpoint every this many optimizer steps"),
    ("seed", int, 0, "seed of the task data, the chat requests, the adapter's initialisation and the data order"),
    ("threads", int, None, "torch CPU threads"),
]
#: what a resumed run must share with the run that wrote the checkpoints (the data, the adapter, the optimizer)
RUN_KEYS = (
    "num_synopsis",
    "num_arith_steps",
    "num_chat",
    "chat_max_new_tokens",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "learning_rate",
    "mixed_precision",
    "batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "seed",
)
MIXED_PRECISION = ("no", "bf16")
CHAT_FILE = "chat_answers.jsonl"
SESSIONS_FILE = "sessions.json"
SAVED_FILES = {"adapter_config.json", "adapter_model.safetensors", "training.json", "README.md"}
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, kind, default, help_text in OPTIONS:
        nargs = "+" if isinstance(default, list) else None
        parser.add_argument(f"--{name}", type=kind, default=default, nargs=nargs, help=help_text)
    return parser


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string"}


def _config_defaults(parser: ArgumentParser, path: str) -> dict:
    """The recipe's values, checked against the options (names and types)."""
    import yaml

    file = Path(path)
    if not file.is_file():
        parser.error(f"--config {path}: no such file; pass a recipe such as training/configs/smollm2_tuned_target.yaml")
    try:
        recipe = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as error:
        parser.error(f"--config {path} is not valid YAML: {' '.join(str(error).split())}")
    if not isinstance(recipe, dict):
        parser.error(f"--config {path} must hold a mapping of option: value, got {type(recipe).__name__}")
    kinds = {name: (kind, default) for name, kind, default, _ in OPTIONS if name != "config"}
    values = {}
    for key, value in recipe.items():
        name = str(key).replace("-", "_")
        if name not in kinds:
            parser.error(f"--config {path}: unknown key {key!r}; its keys are the options: {', '.join(sorted(kinds))}")
        kind, default = kinds[name]
        if isinstance(default, list):
            value = [value] if isinstance(value, str) else value
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            if isinstance(value, str) and kind is not str:  # YAML reads 2e-4 as a string: read it as the flag would
                try:
                    value = kind(value)
                except ValueError:
                    pass
            ok = isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)
        if not (ok or (value is None and default is None)):
            expected = "a list of names" if isinstance(default, list) else _KIND_NAMES[kind]
            parser.error(f"--config {path}: `{key}` is {value!r}; it must be {expected}")
        values[name] = float(value) if kind is float and value is not None else value
    return values


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    config = parser.parse_known_args(argv)[0].config
    if config:
        parser.set_defaults(**_config_defaults(parser, config))
    args = parser.parse_args(argv)
    positive = ["chat_max_new_tokens", "generation_batch_size", "lora_r", "lora_alpha", "batch_size"]
    positive += ["gradient_accumulation_steps", "max_length", "save_steps"]
    for name in positive + ["max_steps", "threads"]:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be a positive integer, got {value}")
    for name in ("num_synopsis", "num_arith_steps", "num_chat"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be 0 or a positive integer, got {getattr(args, name)}")
    if args.num_synopsis + args.num_arith_steps + args.num_chat == 0:
        parser.error("the training mix is empty (--num_synopsis, --num_arith_steps and --num_chat are all 0)")
    from diversed_hf.lab.tasks.synopsis import synopsis_rows

    available = sum(row["split"] == "train" for row in synopsis_rows())
    if args.num_synopsis > available:
        parser.error(f"--num_synopsis is {args.num_synopsis}, but synopsis's train split has {available} pairs")
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        parser.error(f"--learning_rate must be a positive finite number, got {args.learning_rate} (the recipe: 2e-4)")
    if not (math.isfinite(args.epochs) and args.epochs > 0):
        parser.error(f"--epochs must be a positive finite number, got {args.epochs}")
    if args.mixed_precision not in MIXED_PRECISION:
        parser.error(f"--mixed_precision is {args.mixed_precision!r}; use one of {', '.join(MIXED_PRECISION)}")
    if not 0 <= args.lora_dropout < 1:
        parser.error(f"--lora_dropout must be in [0, 1), got {args.lora_dropout}")
    unknown = [m for m in args.target_modules if m not in LLAMA_LINEAR]
    if unknown or len(set(args.target_modules)) != len(args.target_modules):
        parser.error(
            f"--target_modules is {args.target_modules}: name each once, among the Llama layers {list(LLAMA_LINEAR)}"
        )
    return args


def check_save_to(save_to: Path, output_dir: Path) -> None:
    """``--save_to`` neither holds the run's own files nor anything but an earlier adapter (it is replaced whole)."""
    save_to, output_dir = save_to.resolve(), output_dir.resolve()
    checkpoints = output_dir / "checkpoints"
    if save_to == output_dir or output_dir.is_relative_to(save_to) or save_to.is_relative_to(checkpoints):
        raise ValueError(
            f"`--save_to` {save_to} overlaps the run's own files in --output_dir {output_dir}: it is replaced whole. "
            "Pass a directory of its own, such as <output_dir>/adapter (the default)."
        )
    others = sorted(p.name for p in save_to.iterdir() if p.name not in SAVED_FILES) if save_to.is_dir() else []
    if others:
        raise ValueError(
            f"`--save_to` {save_to} holds files that are not a tuned adapter's ({', '.join(others)}): it would be "
            "replaced whole. Pass a new directory, or one holding an earlier adapter."
        )


def check_run(output_dir: Path, args) -> dict:
    """The run's settings (:data:`RUN_KEYS`), refused when ``output_dir`` holds another run's checkpoints."""
    settings = {key: getattr(args, key) for key in RUN_KEYS}
    recorded = output_dir / "run.json"
    if recorded.is_file() and _newest_checkpoint(output_dir / "checkpoints") is not None:
        before = json.loads(recorded.read_text())
        changed = [f"--{k} {before.get(k)!r} -> {settings[k]!r}" for k in RUN_KEYS if before.get(k) != settings[k]]
        if changed:
            raise ValueError(
                f"`--output_dir` {output_dir} holds the checkpoints of a run with other settings ({'; '.join(changed)}). "
                "Rerun with that run's settings to resume it, or pass another --output_dir."
            )
    return settings


def _newest_checkpoint(directory: Path) -> Path | None:
    """The newest ``checkpoint-<step>`` that is complete (transformers writes ``trainer_state.json`` last)."""
    found = [p for p in directory.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)]
    complete = [p for p in found if (p / "trainer_state.json").is_file()]
    return max(complete, key=lambda p: int(p.name.split("-")[1]), default=None)


def _read_answers(path: Path) -> list[dict]:
    """The cached chat answers; a last line cut short by a killed run is dropped (and the file trimmed)."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    rows = []
    for number, line in enumerate(lines[:-1], 1):
        try:
            rows.append(json.loads(line))
        except ValueError:
            raise ValueError(
                f"{path}, line {number}: not a JSON answer record. Remove the file to answer again."
            ) from None
    if lines[-1]:  # no newline at the end: the write was cut short
        write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
    return rows


def chat_answers(target, tokenizer, prompts: list[str], path: Path, args) -> tuple[list[dict], float]:
    """The base model's greedy answer to each prompt (``answer``, ``finished``), answering only those ``path`` lacks;
    and the seconds spent answering, summed over sessions."""
    from tqdm.auto import tqdm

    done = {(row["prompt"], row["max_new_tokens"]): row for row in _read_answers(path)}
    todo = [p for p in prompts if (p, args.chat_max_new_tokens) not in done]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    with (
        open(path, "a", encoding="utf-8") as stream,
        tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="base model's chat answers") as bar,
    ):
        for start in range(0, len(todo), args.generation_batch_size):
            batch = todo[start : start + args.generation_batch_size]
            began = time.time()
            encoded = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
            with torch.no_grad():
                out = target.generate(
                    **encoded,
                    do_sample=False,
                    max_new_tokens=args.chat_max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            new = out[:, encoded["input_ids"].shape[1] :]  # (batch, new tokens)
            seconds = (time.time() - began) / len(batch)
            for prompt, row in zip(batch, new.tolist()):
                finished = tokenizer.eos_token_id in row
                text = tokenizer.decode(
                    row[: row.index(tokenizer.eos_token_id)] if finished else row, skip_special_tokens=True
                )
                record = {
                    "prompt": prompt,
                    "max_new_tokens": args.chat_max_new_tokens,
                    "answer": text,
                    "finished": finished,
                    "seconds": round(seconds, 3),
                }
                done[prompt, args.chat_max_new_tokens] = record
                stream.write(json.dumps(record) + "\n")
            stream.flush()
            bar.update(len(batch))
    tokenizer.padding_side = side
    rows = [done[p, args.chat_max_new_tokens] for p in prompts]
    return rows, sum(row["seconds"] for row in rows)


def task_pairs(args) -> dict[str, tuple[list[str], list[str]]]:
    """``{task: (prompts, references)}`` of the training splits."""
    from diversed_hf.lab.tasks import load_task_dataset

    pairs = {}
    for task, count in (("synopsis", args.num_synopsis), ("arith_steps", args.num_arith_steps)):
        data = load_task_dataset(task, split="train", num_examples=count, seed=args.seed) if count else None
        pairs[task] = (data["prompt"], data["reference"]) if data is not None else ([], [])
    return pairs


def session_clock(path: Path):
    """A ``TrainerCallback`` recording each session's training time and steps in ``path`` after every step, so the
    time of a killed session counts too."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.sessions = json.loads(path.read_text()) if path.is_file() else []
            self.began = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.began = time.time()
            self.sessions.append(
                {
                    "start_step": state.global_step,
                    "end_step": state.global_step,
                    "seconds": 0.0,
                    "threads": torch.get_num_threads(),
                }
            )
            self._write(state)

        def on_step_end(self, args, state, control, **kwargs):
            self._write(state)

        def on_train_end(self, args, state, control, **kwargs):
            self._write(state)

        def _write(self, state):
            self.sessions[-1].update(end_step=state.global_step, seconds=round(time.time() - self.began, 1))
            write_text_atomic(path, json.dumps(self.sessions, indent=1) + "\n")

    return Clock()


def save_adapter(model, save_to: Path, record: dict) -> None:
    """The adapter in bfloat16, ``training.json`` and the card, staged beside ``save_to`` and moved into place."""
    from diversed_hf.training.tuned_card import render_tuned_card

    staging = save_to.parent / f".{save_to.name}.staging"
    old = save_to.parent / f".{save_to.name}.replaced"
    for leftover in (staging, old):
        shutil.rmtree(leftover, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(str(staging), save_embedding_layers=False)
    record["lora"]["adapter_bytes"] = (staging / "adapter_model.safetensors").stat().st_size
    (staging / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    (staging / "README.md").write_text(render_tuned_card(record))  # replaces peft's own card
    if save_to.exists():
        os.replace(save_to, old)
    os.replace(staging, save_to)
    shutil.rmtree(old, ignore_errors=True)


def training_columns(pairs: dict[str, tuple[list[str], list[str]]], used: list[dict], eos: str) -> dict[str, list]:
    """The training pairs as ``prompt`` / ``completion`` columns: the tasks' pairs, then the chat answers kept;
    every completion ends with ``eos`` (the end-of-turn token)."""
    columns = {"prompt": [], "completion": []}
    for task_prompts, references in pairs.values():
        columns["prompt"] += task_prompts
        columns["completion"] += [reference + eos for reference in references]
    columns["prompt"] += [row["prompt"] for row in used]
    columns["completion"] += [row["answer"] + eos for row in used]
    return columns


def lora_model(target, args):
    """``target`` with a new LoRA adapter (``--lora_r``, ``--lora_alpha``, ``--lora_dropout`` on
    ``--target_modules``), initialised from ``--seed``; and its number of trainable parameters."""
    from peft import LoraConfig, get_peft_model
    from transformers import set_seed

    set_seed(args.seed)
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=list(args.target_modules),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(target, lora)
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info("LoRA: %d parameters (%.1f MB in bfloat16)", parameters, 2 * parameters / 1e6)
    return model, parameters


def sft_config(args, output_dir: Path, num_pairs: int):
    """TRL's ``SFTConfig`` of the recipe (loss on the completion only, cosine schedule after a warm-up of 3 % of the
    steps, a checkpoint every ``--save_steps`` into ``<output_dir>/checkpoints``) for ``num_pairs`` training pairs."""
    from trl import SFTConfig

    steps_per_epoch = math.ceil(num_pairs / (args.batch_size * args.gradient_accumulation_steps))
    total_steps = args.max_steps or math.ceil(args.epochs * steps_per_epoch)
    return SFTConfig(
        output_dir=str(output_dir / "checkpoints"),
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, round(0.03 * total_steps)),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        max_length=args.max_length,
        completion_only_loss=True,
        packing=False,
        bf16=args.mixed_precision == "bf16",  # autocast: the weights and the optimizer stay float32
        use_cpu=args.mixed_precision == "bf16" and not torch.cuda.is_available(),  # transformers asks, for CPU bf16
        fp16=False,
        gradient_checkpointing=False,
        logging_steps=5,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=2,
        seed=args.seed,
        report_to="none",
        disable_tqdm=False,
        dataloader_pin_memory=False,
    )


def data_counts(pairs: dict, answers: list[dict], used: list[dict], num_pairs: int, num_sequences: int) -> dict:
    """``training.json``'s ``data``: the pairs per task, what became of the chat answers, and the totals."""
    return {
        "tasks": {task: len(task_prompts) for task, (task_prompts, _) in pairs.items()},
        "chat": {
            "prompts": len(answers),
            "used": len(used),
            "cut_off": sum(not row["finished"] for row in answers),
            "empty": sum(row["finished"] and not row["answer"].strip() for row in answers),
        },
        "train_pairs": num_pairs,
        "train_sequences": num_sequences,  # those whose completion starts within --max_length
    }


def training_record(
    args, argv: list[str], target, trainer, checkpoint, *, eos, data, parameters, chat_seconds, sessions
) -> dict:
    """``training.json``: the base model, the settings and the command, the data, the adapter, the training's steps
    and loss, and its time summed over the ``sessions``."""
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    base_id = getattr(target.config, "_name_or_path", None) or None
    smollm2_base = base_id == REAL_PAIR_MODEL_IDS["target"]
    record = {
        "base_model": base_id,
        "base_model_name": "SmolLM2-135M-Instruct" if smollm2_base else base_id,
        "base_model_hub_id": SMOLLM2_HUB_ID if smollm2_base else None,
        "load_call": 'target, draft, tokenizer = testbed.load_pair("smollm2-tuned")' if smollm2_base else None,
        "settings": {k: v for k, v in vars(args).items() if k not in ("config", "output_dir", "save_to", "threads")},
        "seed": args.seed,
        "recipe": "python training/tune_target.py " + " ".join(argv),
        "eos_token": eos,
        "data": data,
        "lora": {
            "r": args.lora_r,
            "alpha": args.lora_alpha,
            "dropout": args.lora_dropout,
            "target_modules": list(args.target_modules),
            "parameters": parameters,
            "dtype": "bfloat16",
        },
        "steps": trainer.state.global_step,
        "epochs": round(trainer.state.epoch or 0.0, 3),
        "final_loss": round(losses[-1], 4) if losses else None,
        "resumed_from": checkpoint.name if checkpoint else None,
        "sessions": len(sessions),
        "session_log": sessions,
        "seconds": {
            "chat_answers": round(chat_seconds, 1),
            "training": round(sum(s["seconds"] for s in sessions), 1),
        },
        "threads": torch.get_num_threads(),
    }
    record["seconds"]["total"] = round(record["seconds"]["chat_answers"] + record["seconds"]["training"], 1)
    return record


def main(argv=None, load_target=None) -> Path:
    """Run the recipe; ``load_target() -> (model, tokenizer)`` replaces SmolLM2-135M-Instruct (tests pass a tiny one)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    output_dir = Path(args.output_dir)
    destination = save_location(args.save_to or output_dir / "adapter", "--save_to", output_dir)
    save_to = destination.folder  # a folder of the testbed's assets is written in the run, then shipped there
    check_output_dir(output_dir, "--output_dir")
    check_output_dir(save_to, "--save_to")
    check_save_to(save_to, output_dir)
    settings = check_run(output_dir, args)  # all before the model loads
    if _newest_checkpoint(output_dir / "checkpoints") is None:  # training starts at step 0: a new chain of sessions
        (output_dir / SESSIONS_FILE).unlink(missing_ok=True)
    from diversed_hf.lab.tasks.chat_prompts import broad_chat_prompts

    pairs = task_pairs(args)
    prompts = broad_chat_prompts(args.num_chat, seed=args.seed) if args.num_chat else []
    if load_target is None:
        from diversed_hf.testbed import smollm2

        def load_target():  # trained in float32, as the recipe was measured
            return smollm2.load_smollm2_target(torch_dtype=torch.float32)

    target, tokenizer = load_target()
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "run.json", json.dumps(settings, indent=2) + "\n")

    answers, chat_seconds = chat_answers(target, tokenizer, prompts, output_dir / CHAT_FILE, args)
    used = [row for row in answers if row["finished"] and row["answer"].strip()]
    eos = tokenizer.eos_token
    columns = training_columns(pairs, used, eos)

    from datasets import Dataset
    from trl import SFTTrainer

    model, parameters = lora_model(target, args)
    dataset = Dataset.from_dict(columns)
    trainer = SFTTrainer(
        model=model,
        args=sft_config(args, output_dir, len(dataset)),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[session_clock(output_dir / SESSIONS_FILE)],
    )
    checkpoint = _newest_checkpoint(output_dir / "checkpoints")
    if checkpoint is not None:
        logger.info("resuming from %s", checkpoint)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)

    sessions = json.loads((output_dir / SESSIONS_FILE).read_text())
    data = data_counts(pairs, answers, used, len(dataset), len(trainer.train_dataset))
    record = training_record(
        args,
        argv,
        target,
        trainer,
        checkpoint,
        eos=eos,
        data=data,
        parameters=parameters,
        chat_seconds=chat_seconds,
        sessions=sessions,
    )
    save_adapter(trainer.model, save_to, record)
    if trainer.accelerator.is_main_process:
        destination.finish(card="smollm2_tuned_target.md" if destination.ship_as == "smollm2/tuned" else None)
    logger.info(
        "saved the adapter (%d bytes), training.json and the card to %s", record["lora"]["adapter_bytes"], save_to
    )
    return save_to


if __name__ == "__main__":
    sys.exit(run_script(main))
