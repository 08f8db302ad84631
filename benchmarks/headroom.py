"""Where could a head's acceptance still come from? The head with its weight overridden by token class.

    python benchmarks/headroom.py --task arith --head testbed:arith --num-prompts 300 --num-samples 2

A head trades acceptance for quality position by position. To see how much room a better head would
have, this decodes the same held-out prompts (as ``benchmarks/ablation.py`` does) with the head and with
the head's weight replaced on one class of positions:

* **content** positions -- where the target or the draft puts at least ``--threshold`` of its mass on a
  *content token* (a token matching ``--content-pattern``: numbers, operators and ``#`` for ``arith``;
  for ``summary`` the facts: numbers, capitalised words, and every token of a fact value of the task --
  names, places, days, festival kinds, products, prizes, research topics);
* **wording** positions -- every other position (neither model puts that much mass on content tokens).

The classes are coarse on purpose (a regular expression and the task's fact lists): a capitalised word that
opens a sentence ("The", "About") counts as content on ``summary``.

Rows: the head as trained; content forced strict (``w = 1``); wording forced lenient (``w = 0``); both
(a hand-written head that knows the token classes, without the trained head). If forcing wording lenient
adds little acceptance, the trained head already takes what the wording offers, and what is left is on
content positions, where leniency changes the answer.

The override depends on ``p_t`` and ``q_t`` only, never on the drafted token, so every row still samples
exactly from its mixture ``nu_t = w_t p_t + (1 - w_t) q_t`` (docs/method.md §4). Writes
``headroom_<task>.json`` and ``headroom_<task>.md`` into ``--output-dir`` (default ``runs/headroom``; checked
before the run). ``benchmarks/make_results.py`` puts the tables of ``results/`` into RESULTS.md, so pass
``--output-dir results`` to publish them.

Options take both spellings (``--num-prompts``, ``--num_prompts``). A bad argument or file ends as one line
with exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from diversed_hf import DiversedHead, testbed
from diversed_hf.lab.bench import BenchConfig, Method, load_task, parse_methods, run_bench
from diversed_hf.lab.bench.report import _cell, _delta_cell
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script
from diversed_hf.lab.tasks import metric_label
from diversed_hf.testbed import tasks
from diversed_hf.verifiers import HeadVerifier

REPO = Path(__file__).resolve().parents[1]

#: content tokens of the testbed's tasks: what the reward checks (the answer's arithmetic; the summary's facts)
CONTENT_PATTERNS = {"arith": r"[0-9+\-*=#]", "summary": r"[0-9A-Z]"}
#: every fact value of ``summary`` (names, places, days, festival kinds, products, prizes, topics): each of their
#: tokens is content whatever its case (a lowercase fact, or a lowercase piece of a name)
SUMMARY_FACTS = (
    "FIRST",
    "LAST",
    "TOWNS",
    "CITIES",
    "DAYS",
    "FEST_THINGS",
    "COMPANIES",
    "PRODUCTS",
    "TEAMS",
    "PRIZES",
    "TOPICS",
)
CONTENT_WORDS = {"arith": (), "summary": tuple(value for name in SUMMARY_FACTS for value in getattr(tasks, name))}


@dataclass(frozen=True)
class TokenClassOverride(HeadVerifier):
    """The head's ``w_t``, replaced by ``content_weight`` / ``wording_weight`` (when not ``None``) on that class.

    A position is *content* when ``max(p_t(C), q_t(C)) >= threshold``, ``C`` the content tokens (``content_mask``,
    1.0 per content token id).
    """

    content_mask: torch.Tensor = field(default=None)  # (vocab,)
    content_weight: float | None = None
    wording_weight: float | None = None
    threshold: float = 0.05

    def target_weights(self, draft_probs, target_probs, **context):
        weight = super().target_weights(draft_probs, target_probs, **context)  # (batch, N)
        mask = self.content_mask[: target_probs.shape[-1]].to(target_probs)  # (vocab,)
        content = torch.maximum(target_probs @ mask, draft_probs @ mask) >= self.threshold  # (batch, N)
        if self.content_weight is not None:
            weight = torch.where(content, torch.full_like(weight, self.content_weight), weight)
        if self.wording_weight is not None:
            weight = torch.where(content, weight, torch.full_like(weight, self.wording_weight))
        return weight


def content_mask(tokenizer, vocab_size: int, pattern: str, words=()) -> torch.Tensor:
    """1.0 for every token id whose token string matches ``pattern`` or that spells one of ``words`` (after a
    space, as in running text), else 0.0; ``(vocab_size,)``."""
    regex = re.compile(pattern)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    mask = torch.zeros(vocab_size)
    for index, token in enumerate(tokens[:vocab_size]):
        if token is not None and regex.search(token):
            mask[index] = 1.0
    for word in words:
        for index in tokenizer(" " + word, add_special_tokens=False)["input_ids"]:
            if index < vocab_size:
                mask[index] = 1.0
    return mask


def table(rows: list[dict]) -> str:
    sd = next(r for r in rows if r["family"] == "sd")
    lines = [
        f"| method | acceptance | x SD | mean w | {metric_label(rows[0]['quality_metric'])} "
        "| vs target distribution [95 % CI] |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        accepted, weight = row.get("acceptance_rate"), row.get("mean_target_weight")
        ratio = None if accepted is None or not sd["acceptance_rate"] else accepted / sd["acceptance_rate"]
        acceptance = f"{_cell(accepted, '.1f', 100, ' %')} | {_cell(ratio, '.2f', suffix='x')}"
        mean_weight = "–" if weight is None else f"{weight:.2f}"
        lines.append(
            f"| {row['method']} | {acceptance} | {mean_weight} | {100 * row['quality']:.1f} | {_delta_cell(row)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=sorted(CONTENT_PATTERNS), help="a testbed task")
    parser.add_argument("--head", required=True, help="a head directory, or testbed:TASK for a shipped head")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--num-samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1, help="held-out prompts and sampling seed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--content-pattern", default=None, help="regular expression of content tokens (default: the task's)"
    )
    parser.add_argument(
        "--threshold", type=float, default=0.05, help="content mass that makes a position a content position"
    )
    parser.add_argument(
        "--output-dir",
        default=str(REPO / "runs" / "headroom"),
        help="where the table goes; `results` to publish it in RESULTS.md (benchmarks/make_results.py)",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if not 0 < args.threshold <= 1:
        parser.error(f"--threshold is {args.threshold}; it must be in (0, 1].")
    check_output_dir(args.output_dir)  # before the run, not after it
    torch.set_num_threads(args.threads)
    if args.head.startswith("testbed:"):
        head = testbed.load_head(args.head.split(":", 1)[1])
    else:
        head = DiversedHead.from_pretrained(args.head)
    pattern = args.content_pattern or CONTENT_PATTERNS[args.task]
    target, draft, tokenizer = testbed.load_pair()
    words = CONTENT_WORDS[args.task] if not args.content_pattern else ()
    mask = content_mask(tokenizer, target.config.vocab_size, pattern, words)
    variants = [
        ("head", None, None),
        ("head, content strict (w = 1)", 1.0, None),
        ("head, wording lenient (w = 0)", None, 0.0),
        ("token classes only: content w = 1, wording w = 0", 1.0, 0.0),
    ]
    methods, _ = parse_methods(["target", "sd"])
    for name, content_weight, wording_weight in variants:
        verifier = TokenClassOverride(
            head,
            content_mask=mask,
            content_weight=content_weight,
            wording_weight=wording_weight,
            threshold=args.threshold,
        )
        methods.append(Method(name, "diversed", verifier))
    config = BenchConfig(
        num_prompts=args.num_prompts,
        num_samples=args.num_samples,
        num_timing_prompts=0,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        num_html_examples=0,
        cost_tokens=4,
    )
    task = load_task(args.task, args.num_prompts, seed=args.seed)
    rows = run_bench(target, draft, tokenizer, task, methods, config, progress=True).rows
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"headroom_{args.task}.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    command = "python benchmarks/headroom.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    words_note = (
        " or a token of one of the task's fact values (names, places, days, products, topics...)" if words else ""
    )
    text = (
        f"On `{args.task}`: the head `{args.head}` with its weight overridden by token class, on {args.num_prompts} "
        f"held-out prompts (seed {args.seed}) x {args.num_samples} samples, temperature 1, N = 5. Content positions: "
        f"the target or the draft puts >= {args.threshold:g} of its mass on tokens matching `{pattern}`{words_note}; "
        f"every other position is wording. Regenerate with:\n\n```bash\n{command}\n```\n\n{table(rows)}\n"
    )
    (output / f"headroom_{args.task}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
