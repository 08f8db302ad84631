"""The model card of a trained :class:`~diversed_hf.eagle.EagleDraft` (``README.md`` beside its weights).

Everything in it comes from the draft's config and its ``training.json`` (what ``train_eagle_draft.py`` recorded, plus
the ``measured`` block a measurement command adds): nothing is typed in by hand.
"""

from __future__ import annotations

import json

__all__ = ["render_eagle_card"]


def _steps(values) -> str:
    return ", ".join(f"{100 * v:.1f} %" for v in values) if values else "–"


def render_eagle_card(config, record: dict) -> str:
    """The card's Markdown, with Hub metadata."""
    target = config.target_model_id or "its target"
    settings = record.get("settings", {})
    before, after = record.get("held_out_before", {}), record.get("held_out_after", {})
    vocab = (
        f"{config.draft_vocab_size} ids (the most frequent in the target's responses)"
        if config.draft_vocab_size
        else "every id"
    )
    lines = [
        "---",
        "library_name: diversed_hf",
        "tags: [speculative-decoding, eagle, diversed_hf]",
        f"base_model: {target}" if config.target_model_id else "",
        "---",
        "",
        f"# EAGLE-style feature draft for {target}",
        "",
        f"An `EagleDraft` ({config.num_layers} decoder layer(s) of the target's architecture, reading the target's "
        f"last hidden state and the next token's embedding; the target's embeddings and LM head, scoring {vocab}), "
        "for speculative decoding with `diversed_hf`. Its weights hold only what it trained; the embeddings and LM "
        "head are the target's, attached when it runs:",
        "",
        "```python",
        "from diversed_hf import EagleDraft, enable_diversed",
        "",  # the snippet as ruff formats it (CI formats the cards' code blocks too)
        "draft = EagleDraft.from_pretrained(PATH, target=target)  # or let generate attach it",
        "out = enable_diversed(target).generate(**inputs, assistant_model=draft)  # lossless SD; "
        "verifier=/diversed_head= too",
        "```",
        "",
        "## Training",
        "",
        f"Distilled from the target on its own responses ({record.get('num_prompts', '?')} chat prompts"
        + (
            ": " + ", ".join(f"{count} {source}" for source, count in record["prompt_mix"].items())
            if record.get("prompt_mix")
            else ""
        )
        + "; "
        f"{record.get('num_sequences', {}).get('train', '?')} training sequences, "
        f"{record.get('train_positions', '?')} response positions; "
        f"{record.get('num_sequences', {}).get('held_out', '?')} held out). Loss per position: smooth L1 on the "
        f"feature + cross-entropy to the target's top-k distribution + {settings.get('tv_weight', '?')} x total "
        f"variation, over {settings.get('unroll', '?')} unrolled steps (steps after the first read the draft's own "
        f"features: training-time test). {record.get('steps', '?')} steps of batch "
        f"{settings.get('batch_size', '?')}, learning rate {settings.get('learning_rate', '?')}, seed "
        f"{settings.get('seed', '?')}. Time on a 2-core CPU: data {record.get('data_seconds', '?')} s, distillation "
        f"{record.get('distill_seconds_this_run', '?')} s (last run).",
        "",
        _collections_line(record.get("collections")),
        "Held-out acceptance estimates per draft step (step 1 reads the target's feature, later steps the draft's "
        "own):",
        "",
        "| | sum min(p, q), T = 1 | top-1 agreement (greedy) |",
        "|---|---|---|",
        f"| untrained | {_steps(before.get('acceptance_t1'))} | {_steps(before.get('top1_agreement'))} |",
        f"| trained | {_steps(after.get('acceptance_t1'))} | {_steps(after.get('top1_agreement'))} |",
        "",
    ]
    measured = record.get("measured")
    if measured:
        lines += [
            "## Measured in generate",
            "",
            measured.get("summary", ""),
            "",
            f"Command: `{measured.get('command', '')}`",
            "",
        ]
    if record.get("recipe"):
        lines += ["## Rebuild", "", "```bash", *record["recipe"].split(" && "), "```", ""]
    lines += ["Settings: `" + json.dumps(settings, sort_keys=True) + "`", ""]
    return "\n".join(line for line in lines if line is not None) + "\n"


def _collections_line(collections: list[dict] | None) -> str | None:
    """Several collections (``train_eagle_draft.py --extra_data``): what each holds, and what that means for the
    held-out split."""
    if not collections:
        return None
    parts = [
        f"{c['num_prompts']} prompts answered in {c.get('dtype', '?')} ({c['data_seconds']} s)" for c in collections
    ]
    return (
        f"The data is {len(collections)} collections, one command each (Rebuild): " + "; ".join(parts) + ". A prompt "
        "answered in two collections can put one answer in the held-out split and the other in training, so the "
        "held-out figures below lean optimistic; the measured figures are on prompts the draft never saw.\n"
    )
