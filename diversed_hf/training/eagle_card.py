"""The model card of a trained :class:`~diversed_hf.drafting.eagle.EagleDraft` (``README.md`` beside its weights),
rendered from ``templates/eagle_draft_card.md`` as heads' cards are from theirs
(:func:`diversed_hf.heads.cards.render_template`).

Everything in it comes from the draft's config and its ``training.json`` (what ``train_eagle_draft.py`` recorded, plus
the ``measured`` block a measurement command adds): nothing is typed in by hand.
"""

from __future__ import annotations

import json

__all__ = ["render_eagle_card"]


def _steps(values) -> str:
    return ", ".join(f"{100 * v:.1f} %" for v in values) if values else "–"


def render_eagle_card(config, record: dict) -> str:
    """The card's Markdown, with Hub metadata (``templates/eagle_draft_card.md``)."""
    from ..heads.cards import render_template

    target = config.target_model_id or "its target"
    settings = record.get("settings", {})
    before, after = record.get("held_out_before", {}), record.get("held_out_after", {})
    vocab = (
        f"{config.draft_vocab_size} ids (the most frequent in the target's responses)"
        if config.draft_vocab_size
        else "every id"
    )
    metadata = {"library_name": "diversed_hf", "tags": ["speculative-decoding", "eagle", "diversed_hf"]}
    if config.target_model_id:
        metadata["base_model"] = config.target_model_id
    return render_template(
        "eagle_draft_card.md",
        metadata,
        target=target,
        num_layers=config.num_layers,
        vocab=vocab,
        eagle3=(f"at layers {config.aux_layer_ids}" if getattr(config, "architecture", "eagle") == "eagle3" else None),
        training=_training_paragraph(record, settings),
        collections=_collections_line(record.get("collections")),
        before_acceptance=_steps(before.get("acceptance_t1")),
        before_top1=_steps(before.get("top1_agreement")),
        after_acceptance=_steps(after.get("acceptance_t1")),
        after_top1=_steps(after.get("top1_agreement")),
        measured=record.get("measured"),
        tree=record.get("tree"),
        batch_plan=record.get("batch_plan"),
        recipe=record["recipe"].split(" && ") if record.get("recipe") else None,
        settings=json.dumps(settings, sort_keys=True),
    )


def _training_paragraph(record: dict, settings: dict) -> str:
    """What the draft was distilled on, the loss, the optimisation and the time."""
    mix = record.get("prompt_mix")
    sequences = record.get("num_sequences", {})
    return (
        f"Distilled from the target on its own responses ({record.get('num_prompts', '?')} chat prompts"
        + (": " + ", ".join(f"{count} {source}" for source, count in mix.items()) if mix else "")
        + f"; {sequences.get('train', '?')} training sequences, {record.get('train_positions', '?')} response "
        f"positions; {sequences.get('held_out', '?')} held out). Loss per position: "
        + ("" if settings.get("architecture") == "eagle3" else "smooth L1 on the feature + ")
        + f"cross-entropy to the target's top-k distribution + {settings.get('tv_weight', '?')} x total variation, "
        f"over {settings.get('unroll', '?')} unrolled steps (steps after the first read the draft's own features: "
        f"training-time test). {record.get('steps', '?')} steps of batch {settings.get('batch_size', '?')}, learning "
        f"rate {settings.get('learning_rate', '?')}, seed {settings.get('seed', '?')}. Time on a 2-core CPU: data "
        f"{record.get('data_seconds', '?')} s, distillation {record.get('distill_seconds_this_run', '?')} s (last run)."
    )


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
        "held-out figures below lean optimistic; the measured figures are on prompts the draft never saw."
    )
