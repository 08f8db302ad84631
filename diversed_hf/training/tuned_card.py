"""The model card of a task-tuned target's LoRA adapter (``README.md`` beside ``adapter_model.safetensors``), rendered
from ``templates/tuned_adapter_card.md`` as heads' cards are from theirs
(:func:`diversed_hf.heads.cards.render_template`).

Everything in it comes from the ``training.json`` that ``training/tune_target.py`` writes: nothing is typed in by
hand.
"""

from __future__ import annotations

import json

__all__ = ["render_tuned_card"]


def _megabytes(count) -> str:
    return f"{count / 1e6:.1f} MB" if isinstance(count, (int, float)) else "?"


def _duration(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "?"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def render_tuned_card(record: dict) -> str:
    """The card's Markdown, with Hub metadata, from a ``training.json`` record (``templates/tuned_adapter_card.md``)."""
    from ..heads.cards import render_template

    settings, lora = record.get("settings", {}), record.get("lora", {})
    metadata = {"library_name": "peft", "tags": ["diversed_hf", "lora", "sft", "speculative-decoding"]}
    if record.get("base_model_hub_id"):
        metadata["base_model"] = record["base_model_hub_id"]
    return render_template(
        "tuned_adapter_card.md",
        metadata,
        base=record.get("base_model_name") or record.get("base_model") or "the base model",
        r=lora.get("r", "?"),
        alpha=lora.get("alpha", "?"),
        modules=", ".join(f"`{m}`" for m in lora.get("target_modules", [])) or "?",
        parameters=lora.get("parameters", "?"),
        size=_megabytes(lora.get("adapter_bytes")),
        dtype=lora.get("dtype", "?"),
        load_call=record.get("load_call"),
        rows=_data_rows(record.get("data", {}), settings),
        training=_training_paragraph(record, settings, lora),
        timing=_timing(record),
        measured=record.get("measured"),
        recipe=record.get("recipe"),
        settings=json.dumps(settings, sort_keys=True),
    )


def _data_rows(data: dict, settings: dict) -> list[str]:
    """The table of what the adapter was trained on: each task's train split, and the chat answers."""
    rows = [
        f"| `{name}` (train split) | {count} | the task's reference |"
        for name, count in data.get("tasks", {}).items()
        if count
    ]
    chat = data.get("chat", {})
    if chat.get("prompts"):
        rows.append(
            f"| everyday chat requests | {chat.get('used', '?')} of {chat['prompts']} | the base model's own greedy "
            f"answer ({chat.get('cut_off', '?')} cut off at {settings.get('chat_max_new_tokens', '?')} tokens and "
            f"{chat.get('empty', 0)} empty left out) |"
        )
    return rows


def _training_paragraph(record: dict, settings: dict, lora: dict) -> str:
    data = record.get("data", {})
    precision = "bfloat16 autocast over float32 weights" if settings.get("mixed_precision") == "bf16" else "float32"
    return (
        f"{data.get('train_sequences', '?')} of the {data.get('train_pairs', '?')} pairs have a completion within "
        f"{settings.get('max_length', '?')} tokens and are trained on. Prompts are chat turns (SmolLM2's template); "
        f"the loss is on the completion and its end-of-turn token `{record.get('eos_token', '?')}` only. "
        f"{record.get('steps', '?')} optimizer steps of {settings.get('batch_size', '?')} x "
        f"{settings.get('gradient_accumulation_steps', '?')} sequences ({record.get('epochs', '?')} epochs), learning "
        f"rate {settings.get('learning_rate', '?')} (cosine, warm-up), {precision}, LoRA dropout "
        f"{lora.get('dropout', '?')}, seed {record.get('seed', '?')}. Last logged training loss: "
        f"{record.get('final_loss') or '–'}."
    )


def _timing(record: dict) -> str:
    """Wall time, with the thread counts the starts ran on (recorded per start; older logs have the last start's)."""
    seconds = record.get("seconds", {})
    counts = sorted({s["threads"] for s in record.get("session_log", []) if isinstance(s.get("threads"), int)})
    threads = (
        f"{' or '.join(map(str, counts))} CPU thread(s)"
        if counts
        else f"CPU threads ({record.get('threads', '?')} in its last start)"
    )
    return (
        f"Wall time on {threads}, other jobs running at times: the base model's chat answers "
        f"{_duration(seconds.get('chat_answers'))}, training {_duration(seconds.get('training'))} over "
        f"{record.get('sessions', '?')} start(s) (a run resumes from its newest checkpoint; a start killed between "
        "checkpoints repeats its last steps)."
    )
