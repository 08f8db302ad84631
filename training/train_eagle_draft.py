"""Distil an EAGLE-style feature draft (``diversed_hf.EagleDraft``) from its target, on the target's own responses.

    python training/train_eagle_draft.py                       # the real pair: runs/eagle_draft/{data,checkpoints,draft}
    python training/train_eagle_draft.py --save_to diversed_hf/testbed/assets/smollm2/eagle   # then ships it there (diversed-hf ship)

    python training/train_eagle_draft.py --prompts my_chats.jsonl --num_chat 0   # on your own conversations
    python training/train_eagle_draft.py --target smollm2-tuned --num_synopsis 1000 --num_arith_steps 1000 \
        --num_arith 0 --code_samples 0 --num_docstrings 0 --output_dir runs/tuned_eagle   # the task-tuned target's
    python training/train_eagle_draft.py --target_model Qwen/Qwen3-0.6B --output_dir runs/qwen3_eagle   # any target
    accelerate launch training/train_eagle_draft.py ...   # the distillation data-parallel over the processes

1. **Data** (``--output_dir``/data): the target answers chat prompts (``--num_chat`` everyday requests of
   the broad chat set, or your own with ``--prompts``; ``arith_chat`` and ``humaneval`` training problems;
   explanations of standard-library functions: ``diversed_hf.lab.tasks.eagle_prompts``; follow-up turns after the
   answers of earlier collections, ``--follow_ups``, and requests the target writes itself, ``--num_written``:
   ``diversed_hf.lab.tasks.target_prompts``), sampled at ``--temperature``
   (every ``1/--greedy_fraction``-th prompt greedily), and reads ``--num_prefill`` existing texts as they are (every
   position of them trained); its last hidden state and top-``--top_k``
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
import json
import logging
import math
import sys
import time
from pathlib import Path

import torch

from diversed_hf.cli.ship import save_location
from diversed_hf.lab.cli_utils import ArgumentParser, check_output_dir, run_script, write_text_atomic

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
    ("chat_offset", int, 0, "skip this many requests of the broad set (a second collection on new ones)"),
    ("chat_max_new_tokens", int, 96, "response length limit of the chat prompts"),
    ("num_arith", int, 250, "arith_chat training problems the target answers"),
    ("code_samples", int, 1, "target answers per humaneval training problem"),
    ("num_docstrings", int, 40, "standard-library functions the target explains"),
    ("num_synopsis", int, 0, "synopsis training prompts the target answers (the tuned target's task)"),
    ("num_arith_steps", int, 0, "arith_steps training problems the target answers (the tuned target's task)"),
    ("num_prefill", int, 0, "existing texts the target reads as they are (docstrings, synopsis documents)"),
    ("num_written", int, 0, "requests the target writes itself from topic lists, then answers"),
    ("num_follow_ups", int, None, "with --follow_ups: answer at most this many follow-up turns (default all)"),
    ("temperature", float, 0.7, "sampling temperature of the responses"),
    ("greedy_fraction", float, 0.25, "share of prompts answered greedily"),
    ("top_k", int, 32, "target log-probabilities kept per position"),
    ("generation_batch_size", int, 32, "prompts decoded together"),
    ("shard_size", int, 64, "sequences per data shard (the unit a resumed collection redoes, and processes split)"),
    ("num_layers", int, 1, "decoder layers of the draft"),
    ("draft_vocab_size", int, 8192, "ids the draft scores (the most frequent in the data; 0: all)"),
    ("unroll", int, 3, "training-time test: steps on the draft's own features"),
    ("epochs", int, 3, "passes over the training sequences"),
    ("batch_size", int, 8, "sequences per step"),
    ("learning_rate", float, 1e-3, "AdamW learning rate (cosine decay after a warm-up of 1/20 of the steps)"),
    (
        "mixed_precision",
        str,
        "no",
        "'bf16': the loss under bfloat16 autocast over float32 weights (about 1.45x faster on a CPU with AVX512-BF16, "
        "and on GPUs); 'no': float32",
    ),
    ("feature_weight", float, 1.0, "weight of the feature regression loss"),
    ("tv_weight", float, 1.0, "weight of the total-variation loss"),
    ("held_out", float, 0.05, "fraction of the sequences kept out to measure acceptance"),
    ("save_steps", int, 100, "checkpoint every this many steps"),
    ("seed", int, 0, "seed of the prompts, sampling, split and training"),
    ("threads", int, None, "torch CPU threads"),
    ("num_assistant_tokens", int, 3, "the saved draft's default draft length (a tree's depth)"),
    ("assistant_tree_top_k", int, 4, "the saved draft's default tree: children of each expanded node (1: a chain)"),
    ("assistant_tree_size", int, 12, "the saved draft's default tree: nodes a round verifies (with top_k > 1)"),
]


def parse_args(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    _check_options(parser, args)
    _check_sources(parser, args)
    try:
        args.drafting = _drafting(args)
    except ValueError as error:
        parser.error(f"the saved draft's tree: {error}")
    return args


def _parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, kind, default, help_text in OPTIONS:
        parser.add_argument(f"--{name}", type=kind, default=default, help=help_text)
    parser.add_argument(
        "--extra_data",
        nargs="+",
        default=[],
        metavar="DIR",
        help="earlier collections (another run's <output_dir>/data) to distil on as well; one made for the other "
        "--arch is read again by the target for this draft's features (<output_dir>/features-<i>, resumable)",
    )
    parser.add_argument(
        "--follow_ups",
        nargs="+",
        default=[],
        metavar="DIR",
        help="earlier collections (<output_dir>/data) whose conversations continue: the target's answer, a follow-up "
        "request as the next user turn, and the target answers it (multi-turn data)",
    )
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="the target's dtype while it answers (the real pair's default: bfloat16)",
    )
    parser.add_argument(
        "--target",
        choices=("smollm2", "smollm2-tuned"),
        default=None,
        help="a shipped target the draft is distilled from: SmolLM2-135M-Instruct (the default), or it with a "
        "task-tuning adapter merged (--adapter)",
    )
    parser.add_argument(
        "--target_model",
        default=None,
        metavar="ID_OR_PATH",
        help="any other target: a Hub id or a local directory of a causal LM (an architecture EagleDraft.for_target "
        "reads: llama, mistral, qwen2, qwen3, gemma3_text, phi3, gpt_neox; with --arch eagle3 any), loaded in --dtype",
    )
    parser.add_argument(
        "--chat_template",
        default=None,
        help="with --target_model: the chat template the prompts are rendered with (a .jinja file, a tokenizer "
        "directory, or 'none' for plain text); default the target tokenizer's own",
    )
    parser.add_argument(
        "--adapter", default=None, help="with --target smollm2-tuned: the LoRA adapter (default: the shipped one)"
    )
    parser.add_argument(
        "--arch",
        choices=("eagle", "eagle3"),
        default="eagle",
        help="eagle: EAGLE-1 style (fc over [embedding, last hidden state], the target's LM head); eagle3: fc over three "
        "of the target's layers (--aux_layer_ids), its own norm and LM head over --draft_vocab_size ids (d2t), no "
        "feature regression (docs/eagle.md)",
    )
    parser.add_argument(
        "--aux_layer_ids",
        type=int,
        nargs="+",
        default=None,
        metavar="I",
        help="with --arch eagle3: the target's hidden_states the draft fuses (default 2, L // 2, L - 3 of its L layers)",
    )
    parser.add_argument(
        "--group_by_length",
        action="store_true",
        help="batches of like lengths (less padding: 1.36x as fast on the real pair's answers, RESULTS.md "
        '"Distillation speed"); default batches drawn uniformly',
    )
    parser.add_argument("--data_only", action="store_true", help="stop after collecting the data")
    return parser


def _check_options(parser, args) -> None:
    """Refuse a bad number or a combination of options that do not go together, naming them."""
    if args.aux_layer_ids is not None and args.arch != "eagle3":
        parser.error(
            f"--aux_layer_ids {' '.join(map(str, args.aux_layer_ids))} names an EAGLE-3 draft's layers: add --arch eagle3"
        )
    if args.aux_layer_ids is not None and min(args.aux_layer_ids) < 0:
        parser.error(f"--aux_layer_ids must be hidden-state indices >= 0, got {args.aux_layer_ids}")
    from diversed_hf.training.eagle_distill import MIXED_PRECISION

    if args.mixed_precision not in MIXED_PRECISION:
        parser.error(
            f"--mixed_precision {args.mixed_precision!r}: give 'bf16' (bfloat16 autocast over float32 weights) or "
            "'no' (float32)"
        )
    for name in (
        "num_layers",
        "unroll",
        "epochs",
        "batch_size",
        "top_k",
        "generation_batch_size",
        "save_steps",
        "chat_max_new_tokens",
        "shard_size",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.target_model is not None and args.target is not None:
        parser.error(f"--target {args.target} and --target_model {args.target_model}: name one target")
    if args.chat_template is not None and args.target_model is None:
        parser.error("--chat_template renders the prompts of a --target_model (the shipped targets use their own)")
    if args.target_model is not None and (args.num_synopsis or args.num_arith_steps or args.adapter):
        parser.error(
            "--num_synopsis, --num_arith_steps and --adapter are the task-tuned SmolLM2 target's: leave them out "
            "with --target_model"
        )
    if args.target is None and args.target_model is None:
        args.target = "smollm2"
    if args.adapter and args.target != "smollm2-tuned":
        parser.error(f"--adapter {args.adapter} is for the tuned target: add --target smollm2-tuned")
    counts = (
        "num_chat",
        "chat_offset",
        "num_arith",
        "code_samples",
        "num_docstrings",
        "num_synopsis",
        "num_arith_steps",
        "num_prefill",
        "num_written",
    )
    for name in counts:
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


def _check_sources(parser, args) -> None:
    """Refuse an empty prompt mix and collections that are not there, naming them."""
    sources = args.num_chat + args.num_arith + args.code_samples + args.num_docstrings + args.num_written
    if sources + args.num_synopsis + args.num_arith_steps + args.num_prefill == 0 and not (
        args.prompts or args.follow_ups
    ):
        parser.error(
            "the prompt mix is empty (--num_chat, --num_arith, --code_samples, --num_docstrings and --num_written are "
            "all 0, and no --prompts or --follow_ups): give the target something to answer"
        )
    for option in ("extra_data", "follow_ups"):
        for directory in getattr(args, option):
            if not (Path(directory) / "manifest.json").is_file():
                parser.error(
                    f"--{option} {directory} is not a collection (no manifest.json): name another run's data "
                    "directory, <output_dir>/data"
                )
    if args.num_follow_ups is not None and (args.num_follow_ups < 1 or not args.follow_ups):
        parser.error(
            f"--num_follow_ups {args.num_follow_ups} limits the follow-up turns of --follow_ups DIR: give a positive "
            "count and the collections to continue"
        )
    if args.draft_vocab_size < 0:
        parser.error(f"--draft_vocab_size must be 0 (all ids) or positive, got {args.draft_vocab_size}")
    if not 0 < args.held_out < 1:
        parser.error(f"--held_out must be in (0, 1), got {args.held_out}")
    if not 0 <= args.greedy_fraction <= 1:
        parser.error(f"--greedy_fraction must be in [0, 1], got {args.greedy_fraction}")


def _drafting(args) -> dict:
    """The drafting knobs the saved draft's generation config carries (``generate`` reads them when a call passes
    none): a chain with ``--assistant_tree_top_k 1``."""
    from diversed_hf.training.eagle_distill import check_drafting

    chain = args.assistant_tree_top_k == 1
    return check_drafting(
        {
            "num_assistant_tokens": args.num_assistant_tokens,
            "assistant_tree_top_k": args.assistant_tree_top_k,
            **({} if chain else {"assistant_tree_size": args.assistant_tree_size}),
        }
    )


def _settings(args):
    """The collection's and the distillation's settings (``CollectionSettings``, ``DistillSettings``), which refuse
    a bad value when they are made."""
    from diversed_hf.training.eagle_data import CollectionSettings
    from diversed_hf.training.eagle_distill import DistillSettings

    settings = CollectionSettings(
        temperature=args.temperature,
        greedy_fraction=args.greedy_fraction,
        top_k=args.top_k,
        batch_size=args.generation_batch_size,
        shard_size=args.shard_size,
        seed=args.seed,
    )
    distill_settings = DistillSettings(
        num_layers=args.num_layers,
        draft_vocab_size=args.draft_vocab_size or None,
        unroll=args.unroll,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        mixed_precision=args.mixed_precision,
        group_by_length=args.group_by_length,
        feature_weight=args.feature_weight,
        tv_weight=args.tv_weight,
        held_out=args.held_out,
        save_steps=args.save_steps,
        seed=args.seed,
    )
    return settings, distill_settings


def _prompts(args, chat_template: str = "smollm2") -> dict[str, list[tuple[str, int]]]:
    """The prompts the target answers (rendered with ``chat_template``) by source, the chat ones named after where
    they come from; the sources made with the target (follow-ups, written requests) come later (:func:`_made_with`).
    """
    from diversed_hf.lab.tasks.eagle_prompts import eagle_prompt_mix

    user_prompts = None
    if args.prompts:
        from diversed_hf.lab.tasks.chat_prompts import load_user_prompts

        user_prompts = load_user_prompts(args.prompts, args.num_user_prompts, chat_template=chat_template)
    mix = eagle_prompt_mix(
        args.num_arith,
        args.code_samples,
        args.num_docstrings,
        num_chat=args.num_chat,
        chat_offset=args.chat_offset,
        chat_prompts=user_prompts,
        chat_max_new_tokens=args.chat_max_new_tokens,
        num_synopsis=args.num_synopsis,
        num_arith_steps=args.num_arith_steps,
        seed=args.seed,
        chat_template=chat_template,
        num_prefill=args.num_prefill,
    )
    chat_source = f"your prompts ({args.prompts})" if args.prompts else "everyday requests of the broad chat set"
    return {chat_source if name == "chat" else name: jobs for name, jobs in mix.items()}


def _made_with(args, target, tokenizer, chat_template: str, output_dir: Path, processes) -> dict[str, list]:
    """The prompts made with the target: follow-up turns after the answers of ``--follow_ups`` and the requests it
    writes itself (``--num_written``, kept in ``<output_dir>/written_requests.json`` so a resumed run asks the same
    ones), each answered at ``--chat_max_new_tokens``."""
    from diversed_hf.lab.tasks.chat import chat_prompt
    from diversed_hf.lab.tasks.target_prompts import follow_up_prompts, write_requests
    from diversed_hf.training.eagle_data import load_token_ids

    made = {}
    if args.follow_ups:
        conversations = [c for directory in args.follow_ups for c in load_token_ids(directory)]
        prompts = follow_up_prompts(conversations, tokenizer, chat_template, seed=args.seed)
        made["follow-ups"] = [(p, args.chat_max_new_tokens) for p in prompts[: args.num_follow_ups]]
    if args.num_written:
        record = {"seed": args.seed, "num_written": args.num_written, "target": args.target or args.target_model}
        file = output_dir / "written_requests.json"
        with processes.main_first():  # the main process writes them, the others read its file
            stored = json.loads(file.read_text()) if file.is_file() else None
            if stored is None or {k: stored.get(k) for k in record} != record:
                partial = output_dir / "written_requests.partial.json"  # a stopped run goes on from it
                requests = write_requests(
                    target, tokenizer, args.num_written, seed=args.seed, chat_template=chat_template,
                    batch_size=args.generation_batch_size, progress=processes.is_main,
                    partial_file=partial if processes.is_main else None,
                )  # fmt: skip
                if processes.is_main:
                    write_text_atomic(file, json.dumps({**record, "requests": requests}, indent=1) + "\n")
                    partial.unlink(missing_ok=True)
            else:
                requests = stored["requests"]
        logger.info("the target wrote %d requests (of %d asked for)", len(requests), args.num_written)
        made["written requests"] = [(chat_prompt(r, chat_template), args.chat_max_new_tokens) for r in requests]
    return made


def _data_record(collections: list[dict], settings) -> dict:
    """What the draft's ``training.json`` records of its data: the collections (this run's first) merged, their
    commands in the order they ran, and this run's collection settings."""
    own = collections[0]
    merged_mix: dict[str, int] = {}
    for record in collections:
        for source, count in record["prompt_mix"].items():
            merged_mix[source] = merged_mix.get(source, 0) + count
    return {
        "data_seconds": sum(record["data_seconds"] for record in collections),
        "num_prompts": sum(record["num_prompts"] for record in collections),
        "prompt_mix": merged_mix,
        # the commands in order: the earlier collections' first, then this one
        "recipe": " && ".join([record["recipe"] for record in collections[1:]] + [own["recipe"]]),
        "collection": dataclasses.asdict(settings),
        **({"collections": collections} if len(collections) > 1 else {}),
    }


def _load_target(args):
    """``(target, tokenizer)``: SmolLM2-135M-Instruct, the task-tuned target (``--adapter`` merged), or
    ``--target_model``, in ``--dtype``."""
    dtype = getattr(torch, args.dtype)
    if args.target_model is not None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        target = AutoModelForCausalLM.from_pretrained(args.target_model, dtype=dtype).eval()
        return target, AutoTokenizer.from_pretrained(args.target_model)
    if args.target == "smollm2-tuned":
        from diversed_hf.testbed import smollm2_tuned

        adapter = args.adapter or smollm2_tuned.TUNED_DIR
        return smollm2_tuned.load_tuned_target(torch_dtype=dtype, adapter=adapter)
    from diversed_hf.testbed import smollm2

    return smollm2.load_smollm2_target(torch_dtype=dtype)


def main(argv=None) -> Path:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from diversed_hf.testbed import smollm2_tuned  # the testbed: registers its tasks
    from diversed_hf.training.data_parallel import Processes
    from diversed_hf.training.eagle_data import collect
    from diversed_hf.training.eagle_distill import check_save_to, distill
    from diversed_hf.training.eagle_features import with_layers

    output_dir = Path(args.output_dir)
    destination = save_location(args.save_to or output_dir / "draft", "--save_to", output_dir)
    save_to = destination.folder  # a folder of the testbed's assets is written in the run, then shipped there
    check_output_dir(output_dir, "--output_dir")
    check_output_dir(save_to, "--save_to")
    # the draft replaces --save_to whole: neither the data nor the checkpoints, nor files not an earlier draft's
    for data_dir in [output_dir / "data", *map(Path, args.extra_data)]:
        check_save_to(save_to, data_dir, output_dir / "checkpoints", "--save_to")
    # every setting is checked before the target loads, not after the collection
    settings, distill_settings = _settings(args)
    if args.target == "smollm2-tuned":  # its adapter, before any prompt is built or model loads
        smollm2_tuned.check_tuned_files(args.adapter or smollm2_tuned.TUNED_DIR, eagle=None)
    started = time.time()
    processes = Processes.current()  # several under `accelerate launch`: shards and batches are split among them
    chat_template = _chat_template(args, processes, output_dir)
    mix = _prompts(args, chat_template)
    target, tokenizer = _load_target(args)
    target = target.to(processes.device)
    mix.update(_made_with(args, target, tokenizer, chat_template, output_dir, processes))
    from diversed_hf.lab.tasks.eagle_prompts import interleave

    prompts = interleave(mix, args.seed)
    prompt_mix = {name: len(jobs) for name, jobs in mix.items() if jobs}
    if args.arch == "eagle3":
        settings, distill_settings = _eagle3_settings(args, target, settings, distill_settings)
    source = {"target": args.target or args.target_model, "dtype": args.dtype}
    if args.target == "smollm2-tuned":
        source["adapter"] = str(args.adapter or smollm2_tuned.TUNED_DIR)
    collect(target, tokenizer, prompts, output_dir / "data", settings, source=source, processes=processes)
    own = _record_collection(args, argv, output_dir, prompts, prompt_mix, time.time() - started, processes)
    logger.info("data: %d prompts, %d s of decoding", own["num_prompts"], own["data_seconds"])
    if args.data_only:
        processes.close()
        return output_dir / "data"
    collections = [own, *(_collection_record(Path(d)) for d in args.extra_data)]
    # an earlier collection keeping other layers (made for the other --arch) is read again for this draft's
    layers = settings.feature_layers or (target.config.get_text_config().num_hidden_layers,)
    data_dirs = with_layers(target, [output_dir / "data", *map(Path, args.extra_data)], layers, output_dir, processes)
    saved = distill(
        target,
        data_dirs,
        output_dir / "checkpoints",
        save_to,
        distill_settings,
        extra_record=_data_record(collections, settings),
        drafting=args.drafting,
    )
    if processes.is_main:
        destination.finish()
    processes.close()
    return saved


def _chat_template(args, processes, output_dir: Path) -> str:
    """The template the prompts are rendered with (the shipped targets': SmolLM2's ChatML), checked with what the
    sources need before any weight loads."""
    chat_template = "smollm2"
    if args.target_model is not None:  # its architecture and chat template
        from diversed_hf.lab.tasks.eagle_prompts import check_target_model

        with processes.main_first():  # the main process writes the tokenizer's files, the others read them
            chat_sources = args.num_chat + args.num_arith + args.code_samples + args.num_docstrings + args.num_written
            # prefill-only texts are read as they are
            needs_chat = bool(args.prompts or args.follow_ups) or chat_sources > 0
            chat_template = check_target_model(
                args.target_model,
                args.arch,
                args.chat_template,
                needs_chat,
                output_dir / "target_tokenizer",
                save=processes.is_main,
            )
    if args.follow_ups:  # the template must append turns
        from diversed_hf.lab.tasks.target_prompts import turn_frame

        turn_frame(chat_template)
    if args.num_written and chat_template == "none":
        raise ValueError("--num_written asks a chat model to write requests: the target has no chat template")
    return chat_template


def _eagle3_settings(args, target, settings, distill_settings):
    """The settings with the target's layers an EAGLE-3 draft fuses, kept as each position's feature."""
    from diversed_hf.drafting.eagle3 import check_aux_layer_ids, default_aux_layer_ids

    layers = target.config.get_text_config().num_hidden_layers
    ids = tuple(args.aux_layer_ids or default_aux_layer_ids(layers))
    check_aux_layer_ids(ids, layers)
    settings = dataclasses.replace(settings, feature_layers=ids)
    return settings, dataclasses.replace(distill_settings, architecture="eagle3", aux_layer_ids=ids)


def _record_collection(args, argv, output_dir: Path, prompts, prompt_mix, seconds: float, processes) -> dict:
    """What ``collection.json`` records of this run's collection (the main process writes it)."""
    from diversed_hf.training.eagle_data import collection_seconds

    recipe = "python training/train_eagle_draft.py " + " ".join(argv if argv is not None else sys.argv[1:])
    own = {
        "data": str(output_dir / "data"),
        "num_prompts": len(prompts),
        "prompt_mix": prompt_mix,
        "data_seconds": round(collection_seconds(output_dir / "data") or seconds),
        "dtype": args.dtype,
        "recipe": recipe.strip(),
    }
    if processes.is_main:
        write_text_atomic(output_dir / "collection.json", json.dumps(own, indent=1) + "\n")
    return own


def _collection_record(data_dir: Path) -> dict:
    """What an earlier run wrote of its collection (``collection.json`` beside its ``data``)."""
    file = data_dir.parent / "collection.json"
    try:
        record = json.loads(file.read_text())
        if not isinstance(record, dict) or not {"num_prompts", "prompt_mix", "data_seconds", "recipe"} <= set(record):
            raise ValueError("missing fields")
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--extra_data {data_dir}: {file} is missing or unreadable ({error}); it records the prompts and the "
            "command of that collection. Rerun that collection's command (with --data_only: the shards already "
            "written are kept) to write it."
        ) from error
    return record


if __name__ == "__main__":
    sys.exit(run_script(main))
