"""Build the CPU testbed of ``diversed_hf.testbed`` from scratch: data, tokenizer, target, draft.

    python training/build_testbed.py                      # everything, into runs/testbed
    python training/build_testbed.py --output-dir diversed_hf/testbed/assets   # replace the shipped testbed
    python benchmarks/measure_testbed.py --assets-dir runs/testbed                 # measure a build

Stages (each skipped when its output already exists, so rerunning resumes an interrupted build):

1. data       -- seeded training examples for each model from ``diversed_hf.testbed.tasks``
                 (train split only; the target sees the "target" phrasing mix, the draft the
                 "draft" mix), written to ``<work-dir>/data_*.jsonl``.
2. tokenizer  -- a word-level tokenizer trained with ``tokenizers`` on the training text, plus
                 every number 0..999 as one token (with and without a leading space).
3. target / draft -- causal-LM training on completion tokens only (AdamW), in *phases*: each phase
                 has fresh data with its own arith/summary mix and its own warmup + cosine schedule
                 (the target: a mixed phase, then two summary-heavy ones -- copying facts out of a
                 passage is learned late by the deep, narrow target). A checkpoint every
                 ``--ckpt-every`` steps in ``<work-dir>/<model>/``; then export in Hugging Face
                 format (safetensors, bf16) to ``<output-dir>/<model>/``.

Training is deterministic for a seed (fixed data order, no dropout) and uses ``--threads`` CPU
threads (default 1). The output directories are checked before the build starts. Options take both
spellings (``--output-dir``, ``--output_dir``); a bad argument ends as one line with exit status 2
(``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from diversed_hf.cli.ship import save_location
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script
from diversed_hf.testbed import tasks

REPO = Path(__file__).resolve().parents[1]

logger = logging.getLogger("build_testbed")

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0, 1, 2, 3
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


@dataclass
class Phase:
    """One training phase: fresh data with its own task mix, and its own warmup + cosine schedule."""

    steps: int
    arith_fraction: float  # share of arith examples (the rest is summary)
    lr: float  # peak learning rate
    warmup: int  # linear warmup steps


@dataclass
class ModelSpec:
    """Architecture and training budget of one model (a LlamaForCausalLM)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    batch_size: int
    style: str  # phrasing mix of its training data ("target" or "draft")
    phases: list[Phase]

    @property
    def total_steps(self) -> int:
        return sum(phase.steps for phase in self.phases)

    def phase_at(self, step: int) -> tuple[int, Phase, int]:
        """(phase index, phase, step within the phase) of global ``step``."""
        for index, phase in enumerate(self.phases):
            if step < phase.steps:
                return index, phase, step
            step -= phase.steps
        raise IndexError(f"step is past the last phase ({self.total_steps} steps)")


@dataclass
class BuildConfig:
    output_dir: str = field(
        default=str(REPO / "runs" / "testbed"),
        metadata={
            "help": "Where the final tokenizer/, target/ and draft/ go (diversed_hf/testbed/assets: replace the "
            "shipped testbed)."
        },
    )
    work_dir: str = field(
        default=str(REPO / "training" / ".testbed_work"),
        metadata={"help": "Data, intermediate checkpoints and logs (resumable builds)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of data generation and initialisation."})
    threads: int = field(default=1, metadata={"help": "torch CPU threads for training."})
    target_steps: int = field(default=2600, metadata={"help": "First target phase: steps on 70%-arith data."})
    target_extra_steps: int = field(
        default=700,
        metadata={"help": "Second target phase: steps on fresh, summary-heavy data (30% arith), new warmup + cosine."},
    )
    target_summary_steps: int = field(
        default=1400,
        metadata={"help": "Third target phase: steps on fresh data with 20% arith, new warmup + cosine."},
    )
    draft_steps: int = field(default=1500, metadata={"help": "Optimizer steps for the draft."})
    eval_every: int = field(
        default=200, metadata={"help": "Log held-out arith accuracy and summary ROUGE-2 every this many steps."}
    )
    batch_size: int = field(default=16, metadata={"help": "Sequences per optimizer step (both models)."})
    ckpt_every: int = field(default=100, metadata={"help": "Checkpoint period in steps."})
    eval_examples: int = field(
        default=50, metadata={"help": "Held-out arith problems scored after training (0: skip)."}
    )
    stages: str = field(default="data,tokenizer,target,draft", metadata={"help": "Comma-separated stages to run."})
    fresh: bool = field(default=False, metadata={"help": "Delete --work-dir first (no resume)."})

    def __post_init__(self) -> None:
        for name in ("target_steps", "draft_steps", "batch_size", "ckpt_every", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` is {getattr(self, name)}; it must be >= 1.")
        for name in ("target_extra_steps", "target_summary_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` is {getattr(self, name)}; it must be >= 0 (0 skips the phase).")
        unknown = set(self.stages.split(",")) - {"data", "tokenizer", "target", "draft"}
        if unknown:
            raise ValueError(f"`stages` has unknown entries {sorted(unknown)}; use data,tokenizer,target,draft.")


def model_specs(cfg: BuildConfig) -> dict[str, ModelSpec]:
    # Target: deep and narrow -- batch-1 CPU cost is dominated by per-layer overhead, so depth buys
    # the >= 8x cost ratio over the draft cheaply, and depth helps multi-step arithmetic.
    # Draft: one layer -- it cannot do induction-style copying, so it is weak on the numbers.
    target_phases = [
        Phase(cfg.target_steps, arith_fraction=0.7, lr=1.5e-3, warmup=100),
        Phase(cfg.target_extra_steps, arith_fraction=0.3, lr=5e-4, warmup=50),
        Phase(cfg.target_summary_steps, arith_fraction=0.2, lr=8e-4, warmup=50),
    ]
    return {
        "target": ModelSpec(192, 768, 16, 6, 2, cfg.batch_size, "target", [p for p in target_phases if p.steps]),
        "draft": ModelSpec(
            128,
            384,
            1,
            4,
            4,
            cfg.batch_size,
            "draft",
            [Phase(cfg.draft_steps, arith_fraction=0.7, lr=3e-3, warmup=100)],
        ),
    }


# ----------------------------------------------------------------------------------------------
# stage 1: data


def data_path(cfg: BuildConfig, model: str, phase: int = 0) -> Path:
    return Path(cfg.work_dir) / (f"data_{model}_phase{phase}.jsonl" if phase else f"data_{model}.jsonl")


def build_data(cfg: BuildConfig, specs: dict[str, ModelSpec]) -> None:
    for offset, (model, spec) in enumerate(specs.items()):
        for index, phase in enumerate(spec.phases):
            seed = 1000 * cfg.seed + 17 + 500 * index + offset
            write_data(
                data_path(cfg, model, index), spec.style, phase.steps * spec.batch_size, seed, phase.arith_fraction
            )


def write_data(path: Path, style: str, n: int, seed: int, arith_fraction: float) -> None:
    if path.exists():
        logger.info("data: %s exists, skipping", path)
        return
    n_arith = round(n * arith_fraction)
    examples = tasks.generate("arith", "train", n_arith, seed=seed, style=style, unique=False)
    examples += tasks.generate("summary", "train", n - n_arith, seed=seed, style=style, unique=False)
    random.Random(seed).shuffle(examples)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for ex in examples:
            f.write(json.dumps({"prompt": ex.prompt, "completion": ex.completion}) + "\n")
    os.replace(tmp, path)
    logger.info("data: wrote %d examples to %s", n, path)


def read_data(cfg: BuildConfig, model: str, phase: int = 0) -> list[dict]:
    with open(data_path(cfg, model, phase)) as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------------------------
# stage 2: tokenizer


def make_tokenizer_object():
    """An untrained word-level `tokenizers.Tokenizer` with the testbed's pre-tokenization.

    Spaces become "▁" attached to the next piece; pieces are letter runs, runs of up to 3 digits,
    single other characters and newlines, so every number 0..999 is one token and decoding is exact.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=False),
            pre_tokenizers.Split(
                Regex("\u2581?[A-Za-z]+|\u2581?[0-9]{1,3}|\u2581?[^A-Za-z0-9\u2581\\s]|\\s|\u2581"),
                behavior="isolated",
            ),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="never", split=False)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)]
    )
    return tok


def build_tokenizer(cfg: BuildConfig, specs: dict[str, ModelSpec]) -> None:
    out = Path(cfg.output_dir) / "tokenizer"
    if (out / "tokenizer.json").exists():
        logger.info("tokenizer: %s exists, skipping", out)
        return
    from tokenizers import trainers
    from transformers import PreTrainedTokenizerFast

    tok = make_tokenizer_object()
    numbers = [str(i) for i in range(1000)]

    def corpus():
        for model in specs:
            for row in read_data(cfg, model):
                yield row["prompt"] + row["completion"]
        yield " " + " ".join(numbers)  # "▁0" .. "▁999"
        yield "\n".join(numbers)  # "0" .. "999"

    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, min_frequency=1, show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    hf_tok.save_pretrained(str(out))
    # The generic class name loads with transformers 4.x (PreTrainedTokenizerFast) and 5.x (an alias).
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tok_config, indent=2, sort_keys=True) + "\n")
    logger.info("tokenizer: %d tokens, saved to %s", tok.get_vocab_size(), out)


def load_hf_tokenizer(cfg: BuildConfig):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(cfg.output_dir) / "tokenizer"))


def encode_data(cfg: BuildConfig, model: str, tokenizer, phase: int = 0) -> list[tuple[list[int], int]]:
    """[(ids, prompt_len)] with ids = <s> prompt completion </s>; cached in the work dir."""
    cache = Path(cfg.work_dir) / (f"encoded_{model}_phase{phase}.pt" if phase else f"encoded_{model}.pt")
    if cache.exists():
        return torch.load(cache)
    rows = read_data(cfg, model, phase)
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer._tokenizer
    prompts = backend.encode_batch([r["prompt"] for r in rows], add_special_tokens=True)
    completions = backend.encode_batch([r["completion"] for r in rows], add_special_tokens=False)
    encoded = [(p.ids + c.ids + [EOS_ID], len(p.ids)) for p, c in zip(prompts, completions)]
    n_unk = sum(ids.count(UNK_ID) for ids, _ in encoded)
    if n_unk:
        # Only tiny smoke-test builds see this (their tokenizer corpus misses words); a stale
        # tokenizer from another build is the other cause: rerun with --fresh.
        logger.warning("%d unknown tokens in the %s training data", n_unk, model)
    torch.save(encoded, cache)
    return encoded


# ----------------------------------------------------------------------------------------------
# stage 3: training


def make_model(spec: ModelSpec, vocab_size: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def make_batch(rows: list[tuple[list[int], int]]):
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (prompt and padding = -100)."""
    length = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), length), PAD_ID, dtype=torch.long)  # (batch, length)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)  # (batch, length)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)  # (batch, length)
    for i, (ids, prompt_len) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        labels[i, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
    return input_ids, attention_mask, labels


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))  # floor after `total` steps
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(cfg: BuildConfig, name: str, spec: ModelSpec) -> None:
    out = Path(cfg.output_dir) / name
    if (out / "model.safetensors").exists():
        logger.info("%s: %s exists, skipping", name, out)
        return
    tokenizer = load_hf_tokenizer(cfg)
    data = []
    for index, phase in enumerate(spec.phases):
        rows = encode_data(cfg, name, tokenizer, index)
        if len(rows) != phase.steps * spec.batch_size:  # data left by a build with other step counts
            raise ValueError(
                f"{data_path(cfg, name, index)} holds {len(rows)} examples but phase {index} of {name} needs "
                f"{phase.steps} steps x {spec.batch_size} = {phase.steps * spec.batch_size}; rerun with --fresh "
                f"or another --work-dir."
            )
        data += rows
    total_steps = spec.total_steps
    model = make_model(spec, len(tokenizer), seed=cfg.seed * 7919 + (1 if name == "target" else 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.phases[0].lr, betas=(0.9, 0.98), weight_decay=0.01)
    ckpt_dir = Path(cfg.work_dir) / name
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = ckpt_dir / "ckpt.pt"
    step, elapsed = 0, 0.0
    if ckpt_path.exists():
        state = torch.load(ckpt_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
        logger.info("%s: resuming at step %d", name, step)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "%s: %.2fM parameters, %d steps of %d sequences (phases: %s)",
        name,
        n_params / 1e6,
        total_steps,
        spec.batch_size,
        [phase.steps for phase in spec.phases],
    )

    model.train()
    bar = tqdm(total=total_steps, initial=step, desc=f"train {name}", dynamic_ncols=True, mininterval=5)
    t0, smooth = time.perf_counter() - elapsed, None
    while step < total_steps:
        rows = data[step * spec.batch_size : (step + 1) * spec.batch_size]
        input_ids, attention_mask, labels = make_batch(rows)
        _, phase, phase_step = spec.phase_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(phase_step, phase.steps, phase.lr, phase.warmup)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        smooth = loss.item() if smooth is None else 0.98 * smooth + 0.02 * loss.item()
        bar.update(1)
        bar.set_postfix(loss=f"{smooth:.4f}")
        if step % cfg.eval_every == 0 and cfg.eval_examples:
            model.eval()
            log_scores(model, tokenizer, name, cfg.eval_examples, f"step {step}")
            model.train()
        if step % cfg.ckpt_every == 0 or step == total_steps:
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "elapsed": time.perf_counter() - t0,
                },
                tmp,
            )
            os.replace(tmp, ckpt_path)
            logger.info("%s: step %d loss %.4f (%.0f s)", name, step, smooth, time.perf_counter() - t0)
    bar.close()
    logger.info("%s: trained in %.0f s", name, time.perf_counter() - t0)
    export_model(cfg, name, model)


def export_model(cfg: BuildConfig, name: str, model) -> None:
    from transformers import GenerationConfig

    out = Path(cfg.output_dir) / name
    tmp = Path(cfg.work_dir) / f"export_{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    model = model.eval().to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, do_sample=False, max_new_tokens=128
    )
    model.save_pretrained(str(tmp))
    if out.exists():
        shutil.rmtree(out)
    shutil.move(str(tmp), str(out))
    logger.info("%s: exported to %s", name, out)


def greedy_score(model, tokenizer, task: str, num_examples: int, batch_size: int = 25) -> float:
    """Mean greedy reward x 100 on ``num_examples`` held-out ``task`` problems (seed 12345): arith
    exact-match accuracy or summary ROUGE-2 F1."""
    from diversed_hf.testbed import reward

    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    examples = tasks.generate(task, "test", num_examples, seed=12345)
    completions = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        enc = tokenizer([e.prompt for e in chunk], return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = model.generate(**enc, do_sample=False, max_new_tokens=128, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
        completions += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    tokenizer.padding_side = padding_side
    return 100 * sum(reward(task, completions, [e.reference for e in examples])) / len(examples)


def log_scores(model, tokenizer, name: str, num_examples: int, when: str) -> None:
    arith = greedy_score(model, tokenizer, "arith", num_examples)
    rouge = greedy_score(model, tokenizer, "summary", num_examples)
    logger.info(
        "%s: %s held-out arith accuracy %.1f %%, summary ROUGE-2 %.1f (%d problems each)",
        name,
        when,
        arith,
        rouge,
        num_examples,
    )


def quick_eval(cfg: BuildConfig) -> None:
    """Greedy arith accuracy and summary ROUGE-2 of both exported models on held-out problems (logged only)."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_hf_tokenizer(cfg)
    for name in ("target", "draft"):
        path = Path(cfg.output_dir) / name
        if not (path / "model.safetensors").exists():
            continue
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        log_scores(model, tokenizer, name, cfg.eval_examples, "exported,")


# ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> BuildConfig:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(BuildConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            parser.add_argument(flag, action="store_true", help=f.metadata["help"])
        else:
            kind = {"int": int, "str": str, "float": float}.get(str(f.type), str)
            parser.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"] + " (default: %(default)s)")
    add_debug_flag(parser)
    values = vars(parser.parse_args(argv))
    values.pop("debug")
    return BuildConfig(**values)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    work = check_output_dir(cfg.work_dir, "--work-dir")  # before the build, not after it
    destination = save_location(cfg.output_dir, "--output-dir", work)  # the assets: built in the work dir, then shipped
    cfg = dataclasses.replace(cfg, output_dir=str(destination.folder))
    check_output_dir(cfg.output_dir, "--output-dir")
    if cfg.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.StreamHandler(), logging.FileHandler(work / "build.log")],
    )
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    torch.set_num_threads(cfg.threads)
    stages = cfg.stages.split(",")
    specs = model_specs(cfg)
    t0 = time.perf_counter()
    logger.info("build config: %s", dataclasses.asdict(cfg))
    if "data" in stages:
        build_data(cfg, specs)
    if "tokenizer" in stages:
        build_tokenizer(cfg, specs)
    for name in ("target", "draft"):
        if name in stages:
            train_model(cfg, name, specs[name])
    if cfg.eval_examples:
        quick_eval(cfg)
    destination.finish()
    logger.info("build finished in %.0f s", time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(run_script(main))
