"""lm-evaluation-harness over every verifier (docs/lm_eval.md): the harness's scores with speculation's statistics.

Importing this module registers the lm-eval model ``diversed`` (:class:`DiversedLM`), a subclass of lm-eval's Hugging
Face model (``HFLM``, registered as ``hf``) that answers ``generate_until`` requests with the target's
``generate(..., assistant_model=draft, verifier=... | diversed_head=...)``, batched as the harness batches (its stop
sequences become stopping criteria, as for ``hf``), and log-likelihood requests with the target alone: a relaxed rule
changes only what is sampled, never the target's probabilities. Without ``assistant_model`` it answers as ``hf``
does (target-only, measured the same way).

From Python (a model instance works too: ``DiversedLM(pretrained=model, assistant_model=draft, ...)``)::

    import lm_eval
    import diversed_hf.lab.harness  # registers "diversed"

    lm_eval.simple_evaluate(model="diversed", model_args="pretrained=...,assistant_model=...,verifier=static:0.5",
                            tasks=["gsm8k"])

From the command line, lm-eval's own CLI with the model registered (lm-eval's CLI loads no third-party model by
itself): ``diversed-hf lm-eval --model_args pretrained=...,assistant_model=... --tasks gsm8k``.

``model_args`` beyond ``hf``'s: ``assistant_model`` (a path or Hub id: a causal LM, or an EagleDraft in any of its
formats), ``verifier`` (:data:`VERIFIER_SPELLINGS`) or ``diversed_head`` (a path or Hub id), the drafting knobs
``num_assistant_tokens``, ``assistant_tree_top_k``, ``assistant_tree_size`` (else the draft's generation config's).
Per task, the results carry the acceptance, tokens per round and tokens/s of its generated answers
(``results["config"]["speculation"]``), and the CLI prints them as a table after the harness's.

lm-eval is the ``eval`` extra (``pip install "diversed_hf[eval]"``); nothing else in the package imports it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ImportError as error:  # the eval extra
    raise ImportError(
        'lm-evaluation-harness is not installed: `pip install "diversed_hf[eval]"` (lm-eval; the dev extra includes '
        "it)."
    ) from error

__all__ = ["DiversedLM", "VERIFIER_SPELLINGS", "cli_main", "parse_verifier", "speculation_table"]

#: how ``verifier=`` is spelled (the bench's spellings, one value each)
VERIFIER_SPELLINGS = (
    "exact (or sd)",
    "static:W",
    "lenient:L (or lossy:L)",
    "fuzzy:T",
    "topk:D",
    "typical:EPS",
    "cascade-RULE:ALPHA",
)
_ALIASES = {"exact": "sd", "lenient": "lossy"}


def parse_verifier(spec):
    """The :class:`~diversed_hf.verifiers.Verifier` that ``spec`` spells (:data:`VERIFIER_SPELLINGS`), or ``spec``
    itself when it is a verifier already; anything else is refused naming the accepted spellings."""
    from ..lab.bench.methods import parse_methods
    from ..verifiers import Verifier

    if isinstance(spec, Verifier):
        return spec
    fix = f"spell it as one of {', '.join(VERIFIER_SPELLINGS)} (e.g. verifier=static:0.5)"
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"`verifier={spec!r}`: {fix}.")
    kind, colon, values = spec.strip().partition(":")
    kind = _ALIASES.get(kind.lower(), kind.lower())
    if kind not in ("sd", "static", "lossy", "fuzzy", "topk", "typical") and not kind.startswith("cascade-"):
        raise ValueError(f"`verifier={spec!r}` is not a verifier: {fix}.")
    if (kind == "sd") == bool(colon) or "," in values:
        raise ValueError(f"`verifier={spec!r}` needs {'no' if kind == 'sd' else 'one'} value: {fix}.")
    methods, _ = parse_methods([f"{kind}{colon}{values}"])
    return methods[0].verifier


@dataclass
class _Tally:
    """Speculation over one task's generated answers: ``tokens`` (new tokens, padding left out) over ``seconds`` in
    ``generate``; ``emitted`` tokens over ``rounds`` (the loop's count, EOS included) for tokens per round."""

    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    emitted: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, stats, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens
        if stats is not None:  # target-only has tokens and time only
            self.drafted += stats.total_drafted
            self.accepted += stats.total_accepted
            self.rounds += stats.total_rounds
            self.emitted += int(stats.num_generated.sum())

    def summary(self) -> dict:
        return {
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "tokens_per_round": round(self.emitted / self.rounds, 3) if self.rounds else None,
            "tokens_per_second": round(self.tokens / self.seconds, 2) if self.seconds and self.tokens else None,
            "generated_tokens": self.tokens,
            "seconds": round(self.seconds, 2),
        }


@register_model("diversed")
class DiversedLM(HFLM):
    """lm-eval's ``hf`` model with speculative ``generate_until`` (module docstring)."""

    #: the statistics the last finished evaluation in this process reported (the CLI prints them)
    last_speculation: dict | None = None

    def __init__(
        self,
        pretrained,
        assistant_model=None,
        verifier=None,
        diversed_head=None,
        num_assistant_tokens: int | None = None,
        assistant_tree_top_k: int | None = None,
        assistant_tree_size: int | None = None,
        **kwargs,
    ):
        if verifier is not None and diversed_head is not None:
            raise ValueError("Pass either `verifier` or `diversed_head`, not both: the head is a verifier of its own.")
        rule = parse_verifier(verifier) if verifier is not None else None  # refused before the models load
        if (rule is not None or diversed_head is not None) and assistant_model is None:
            raise ValueError(
                f"`{'verifier' if rule is not None else 'diversed_head'}` verifies a draft's tokens: pass "
                "`assistant_model` (a path, Hub id or model) too, or neither for the target alone."
            )
        super().__init__(pretrained=pretrained, **kwargs)
        from .. import enable_diversed
        from ..verifiers import ExactVerifier

        enable_diversed(self.model)
        self.assistant = _load_assistant(assistant_model, self.model)
        self.rule = {}
        if self.assistant is not None:
            self.rule = {"diversed_head": _load_head(diversed_head)} if diversed_head is not None else {}
            self.rule = self.rule or {"verifier": rule or ExactVerifier()}
        knobs = dict(
            num_assistant_tokens=num_assistant_tokens,
            assistant_tree_top_k=assistant_tree_top_k,
            assistant_tree_size=assistant_tree_size,
        )
        self.drafting = {name: value for name, value in knobs.items() if value is not None}
        self.speculation: dict[str, _Tally] = {}
        self._task = None

    def generate_until(self, requests, disable_tqdm: bool = False):
        """``HFLM.generate_until`` task by task (the statistics are kept per task), answers in the requests' order."""
        answers = [None] * len(requests)
        by_task: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            by_task.setdefault(request.task_name or "unnamed", []).append(index)
        for task, indices in by_task.items():
            self._task = task
            try:
                for index, answer in zip(indices, super().generate_until([requests[i] for i in indices], disable_tqdm)):
                    answers[index] = answer
            finally:
                self._task = None
        return answers

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        """HFLM's call, greedy at temperature 0 as there, with the draft and the rule. The stop sequences are checked
        per row, target-only included (HFLM's criteria track the whole batch by position and keep every row decoding
        until the last one stops; speculative rounds let finished rows leave): the harness cuts each answer at its
        first stop sequence either way, so the answers are ``hf``'s, and each row's tokens and time are its own."""
        tally = self.speculation.setdefault(self._task or "unnamed", _Tally())
        generation_kwargs.setdefault("temperature", 0.0)
        if generation_kwargs["temperature"] == 0.0 and generation_kwargs.get("do_sample") is None:
            generation_kwargs["do_sample"] = False
        if generation_kwargs.get("do_sample") is False and generation_kwargs["temperature"] == 0.0:
            generation_kwargs.pop("temperature")
        speculative = {}
        if self.assistant is not None:
            speculative = dict(
                assistant_model=self.assistant, return_dict_in_generate=True, **self.rule, **self.drafting
            )
        started = time.perf_counter()
        output = self.model.generate(
            input_ids=context,
            max_length=max_length,
            stopping_criteria=StoppingCriteriaList([_StopSequences(self.tokenizer, stop, context.shape[1])]),
            pad_token_id=self.tokenizer.pad_token_id,
            **speculative,
            **generation_kwargs,
        )
        seconds = time.perf_counter() - started
        sequences = output.sequences if speculative else output  # (B, prompt + new)
        new_tokens = int((sequences[:, context.shape[1] :] != self.tokenizer.pad_token_id).sum())
        tally.add(output.speculation if speculative else None, seconds, new_tokens)
        return sequences

    def speculation_summary(self) -> dict[str, dict]:
        """Per task: acceptance, tokens per round and tokens/s of the generated answers (what the results carry)."""
        return {task: tally.summary() for task, tally in self.speculation.items()}

    def get_model_info(self) -> dict:
        """``hf``'s, with the draft, the rule, the drafting knobs and the statistics (lm-eval calls it once the tasks
        are scored and puts it in ``results["config"]``)."""
        rule = next(iter(self.rule.values()), None)
        DiversedLM.last_speculation = self.speculation_summary()
        return {
            **super().get_model_info(),
            "assistant_model": None if self.assistant is None else _name(self.assistant),
            "verifier": None if rule is None else repr(rule) if not hasattr(rule, "config") else "diversed_head",
            "drafting": dict(self.drafting),
            "speculation": self.speculation_summary(),
        }


class _StopSequences(StoppingCriteria):
    """Per row: whether the last new tokens decode to text holding a stop sequence (lm-eval's lookback: the stop's
    own tokens and two more), as a ``(batch,)`` bool tensor; stateless, so rows may leave the batch."""

    def __init__(self, tokenizer, stops, prompt_width: int):
        self.tokenizer, self.stops, self.prompt_width = tokenizer, [s for s in stops if s], prompt_width
        self.lookback = 2 + max((len(tokenizer.encode(s, add_special_tokens=False)) for s in self.stops), default=0)

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:  # (B, L) -> (B,)
        new = input_ids[:, self.prompt_width :][:, -self.lookback :]  # (B, <= lookback)
        texts = self.tokenizer.batch_decode(new)
        return torch.tensor([any(stop in text for stop in self.stops) for text in texts], device=input_ids.device)


def _name(model) -> str:
    return getattr(model.config, "_name_or_path", None) or type(model).__name__


def _load_assistant(assistant_model, target):
    """The draft from a path or Hub id (an EagleDraft in any format, else a causal LM in the target's dtype), or as
    given."""
    if assistant_model is None or isinstance(assistant_model, torch.nn.Module):
        return assistant_model
    if not isinstance(assistant_model, str):
        raise TypeError(f"`assistant_model` must be a path, a Hub id or a model, got {type(assistant_model).__name__}.")
    from ..drafting.eagle import EagleDraft
    from ..drafting.eagle_formats import detect_format, read_config

    config = read_config(assistant_model)
    if config is not None and _is_eagle(assistant_model, config, detect_format):
        return EagleDraft.from_pretrained(assistant_model, target=target).eval()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(assistant_model, dtype=target.dtype).to(target.device).eval()


def _is_eagle(path: str, config: dict, detect_format) -> bool:
    """Whether the checkpoint at ``path`` is a feature draft: this project's, an EAGLE-3 one, or an EAGLE-1 one (a
    Llama config whose weights hold ``fc``); any other causal LM drafts as itself."""
    from ..drafting.eagle_formats import read_weights

    if config.get("model_type") == "diversed_eagle":
        return True
    try:
        fmt = detect_format(config)
    except ValueError:  # another architecture: a plain causal LM draft
        return False
    return fmt == "eagle3" or "fc.weight" in read_weights(path)


def _load_head(diversed_head):
    from ..heads.head import DiversedHead

    if isinstance(diversed_head, DiversedHead):
        return diversed_head
    return DiversedHead.from_pretrained(diversed_head)


def speculation_table(summary: dict[str, dict]) -> str:
    """The per-task statistics as a Markdown table (what ``diversed-hf lm-eval`` prints after the harness's)."""
    lines = ["| task | acceptance | tokens/round | tokens/s | tokens |", "|---|---:|---:|---:|---:|"]
    for task, row in summary.items():
        cells = [row["acceptance_rate"], row["tokens_per_round"], row["tokens_per_second"], row["generated_tokens"]]
        lines.append(f"| {task} | " + " | ".join("-" if cell is None else str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def cli_main(argv: list[str]) -> int:
    """``diversed-hf lm-eval ARGS``: lm-eval's own CLI (``lm-eval run --model diversed ARGS``) with this model
    registered, then the speculation table of the run."""
    from lm_eval.__main__ import cli_evaluate

    if any(arg in ("--model", "-m") or arg.startswith("--model=") for arg in argv):
        raise ValueError(
            "`diversed-hf lm-eval` runs lm-eval with `--model diversed`: drop `--model` from the arguments."
        )
    saved, DiversedLM.last_speculation = sys.argv, None
    sys.argv = ["lm-eval", "run", "--model", "diversed", *argv]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    if DiversedLM.last_speculation:
        print("\nSpeculation (diversed_hf), per task:\n" + speculation_table(DiversedLM.last_speculation))
    return 0
