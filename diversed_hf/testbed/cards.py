"""What the model cards say of the project's own pairs: their models' ids, descriptions and usage snippets.

``testbed.load_pair()`` and ``load_pair("smollm2")`` set each model's ``config._name_or_path`` to a stable id
(:data:`MODEL_ID_PREFIX` + ``target`` / ``draft``, :data:`REAL_PAIR_MODEL_IDS`), so that heads trained on a pair
record ids that match on every machine. :func:`register` tells :mod:`diversed_hf.heads.cards` how to describe those
ids and how a card's snippet loads the pair (by a call of this package, not by a Hub id); the testbed runs it when it
loads. The core's cards know none of these names.
"""

from __future__ import annotations

from pathlib import Path

from ..heads import cards

__all__ = ["MODEL_ID_PREFIX", "REAL_PAIR_MODEL_IDS", "register"]

#: ``config._name_or_path`` of the testbed's models (``diversed_hf.testbed.load_pair()`` sets it)
MODEL_ID_PREFIX = "diversed_hf/testbed/"
#: ``config._name_or_path`` of the real pair's models (``diversed_hf.testbed.load_pair("smollm2")`` sets them)
REAL_PAIR_MODEL_IDS = {
    "target": "diversed_hf/smollm2-135m-instruct",
    "draft": "diversed_hf/smollm2-135m-instruct-self-draft",
    "eagle": "diversed_hf/smollm2-135m-instruct-eagle-chat",
    "eagle-tasks": "diversed_hf/smollm2-135m-instruct-eagle",
    "eagle3": "diversed_hf/smollm2-135m-instruct-eagle3",  # the EAGLE-3 draft (training/train_eagle_draft.py --arch)
    "tuned": "diversed_hf/smollm2-135m-instruct-tuned",  # load_pair("smollm2-tuned"): the task-tuned target
    "tuned-eagle": "diversed_hf/smollm2-135m-instruct-tuned-eagle",  # and its EagleDraft
}
_DESCRIPTIONS = {
    MODEL_ID_PREFIX + "target": ("`diversed_hf` testbed target", "load_pair()"),
    MODEL_ID_PREFIX + "draft": ("`diversed_hf` testbed draft", "load_pair()"),
    REAL_PAIR_MODEL_IDS["target"]: ("SmolLM2-135M-Instruct", 'load_pair("smollm2")'),
    REAL_PAIR_MODEL_IDS["draft"]: ("SmolLM2-135M-Instruct's self-draft", 'load_pair("smollm2", draft="self")'),
    REAL_PAIR_MODEL_IDS["eagle"]: ("SmolLM2-135M-Instruct's EagleDraft", 'load_pair("smollm2", draft="eagle")'),
    REAL_PAIR_MODEL_IDS["eagle3"]: ("SmolLM2-135M-Instruct's EAGLE-3 draft", 'load_pair("smollm2", draft="eagle3")'),
    REAL_PAIR_MODEL_IDS["eagle-tasks"]: (
        "SmolLM2-135M-Instruct's task EagleDraft",
        'load_pair("smollm2", draft="eagle-tasks")',
    ),
    REAL_PAIR_MODEL_IDS["tuned"]: ("SmolLM2-135M-Instruct tuned on its tasks", 'load_pair("smollm2-tuned")'),
    REAL_PAIR_MODEL_IDS["tuned-eagle"]: (
        "EagleDraft of SmolLM2-135M-Instruct tuned on its tasks",
        'load_pair("smollm2-tuned")',
    ),
}
#: the real pair's drafts a head may be trained with, by the name ``load_pair("smollm2", draft=...)`` takes
_REAL_DRAFTS = {REAL_PAIR_MODEL_IDS["eagle"]: "eagle", REAL_PAIR_MODEL_IDS["eagle-tasks"]: "eagle-tasks"}
_REAL_DRAFTS[REAL_PAIR_MODEL_IDS["draft"]] = "self"


def _testbed_usage(config, head_source: str, load_head: str, generate: str, temperature: float) -> str:
    task = config.task if config.task in ("arith", "summary") else "arith"
    shipped = Path(head_source).parent.parts[-3:] == ("testbed", "assets", "heads")
    if shipped:  # a head shipped in the package: load it by name, not by this machine's path
        load_head = f'head = testbed.load_head("{Path(head_source).name}")'
    return (
        "import diversed_hf.testbed as testbed\n"
        f"from diversed_hf import {'' if shipped else 'DiversedHead, '}enable_diversed\n\n"
        f"{load_head}\n"
        "target, draft, tokenizer = testbed.load_pair()\n"
        "enable_diversed(target)\n\n"
        f'prompt = testbed.load_task("{task}", split="test", num_examples=1)["prompt"][0]\n'
        'inputs = tokenizer(prompt, return_tensors="pt")\n'
        f"{generate}"
    )


def _real_pair_usage(config, head_source: str, load_head: str, generate: str, temperature: float) -> str:
    draft_name = _REAL_DRAFTS[config.draft_model_id]
    shipped = Path(head_source).parent.parts[-3:] == ("assets", "smollm2", "heads")
    if shipped:  # a shipped head, with the draft it was trained with named
        load_head = f'head = testbed.load_head("{Path(head_source).name}", pair="smollm2", draft="{draft_name}")'
    return (
        "import diversed_hf.testbed as testbed\n"
        f"from diversed_hf import {'' if shipped else 'DiversedHead, '}enable_diversed\n"
        "from diversed_hf.lab.tasks import load_task_dataset\n\n"
        f"{load_head}\n"
        f'target, draft, tokenizer = testbed.load_pair("smollm2", draft="{draft_name}")\n'
        "enable_diversed(target)\n\n"
        f'prompt = load_task_dataset("{config.task or "arith_chat"}", num_examples=1)["prompt"][0]  # a chat turn\n'
        'inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)\n'
        f"{generate.replace('do_sample=True,', f'do_sample=True,{chr(10)}    temperature={temperature:g},')}"
    )


def register() -> None:
    """Register the project's pairs with the cards (idempotent). The testbed's models go by their stable ids and by
    the installed assets' paths (a model loaded with ``from_pretrained(testbed.asset_path("target"))`` records it)."""
    assets = Path(__file__).resolve().parent / "assets"
    testbed_ids = {role: (MODEL_ID_PREFIX + role, str(assets / role)) for role in ("target", "draft")}
    for model_id, (name, call) in _DESCRIPTIONS.items():
        cards.register_model_description(model_id, f"{name} (`diversed_hf.testbed.{call}`)")
    for role, (stable, path) in testbed_ids.items():
        cards.register_model_description(path, cards.MODEL_DESCRIPTIONS[stable])
    for target_id in testbed_ids["target"]:
        for draft_id in testbed_ids["draft"]:
            cards.register_pair_usage(target_id, draft_id, _testbed_usage)
    for draft_id in _REAL_DRAFTS:
        cards.register_pair_usage(REAL_PAIR_MODEL_IDS["target"], draft_id, _real_pair_usage)
