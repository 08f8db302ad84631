"""The model card of a task-tuned target's LoRA adapter (``README.md`` beside ``adapter_model.safetensors``).

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
    """The card's Markdown, with Hub metadata, from a ``training.json`` record."""
    settings, lora, data = record.get("settings", {}), record.get("lora", {}), record.get("data", {})
    seconds = record.get("seconds", {})
    base = record.get("base_model_name") or record.get("base_model") or "the base model"
    chat = data.get("chat", {})
    rows = [
        f"| `{name}` (train split) | {count} | the task's reference |"
        for name, count in data.get("tasks", {}).items()
        if count
    ]
    if chat.get("prompts"):
        rows.append(
            f"| everyday chat requests | {chat.get('used', '?')} of {chat['prompts']} | the base model's own greedy "
            f"answer ({chat.get('cut_off', '?')} cut off at {settings.get('chat_max_new_tokens', '?')} tokens and "
            f"{chat.get('empty', 0)} empty left out) |"
        )
    lines = [
        "---",
        "library_name: peft",
        f"base_model: {record['base_model_hub_id']}" if record.get("base_model_hub_id") else None,
        "tags: [diversed_hf, lora, sft, speculative-decoding]",
        "---",
        "",
        f"# {base}, tuned on its tasks (LoRA)",
        "",
        f"A LoRA adapter for {base} (rank {lora.get('r', '?')}, alpha {lora.get('alpha', '?')}, on "
        f"{', '.join(f'`{m}`' for m in lora.get('target_modules', [])) or '?'} of every layer: "
        f"{lora.get('parameters', '?')} parameters, {_megabytes(lora.get('adapter_bytes'))} in "
        f"{lora.get('dtype', '?')}), trained by supervised fine-tuning so that the model knows the tasks it is "
        "measured on and stays an instruct model. It is the target of the `diversed_hf` pair "
        '`smollm2-tuned` (docs/real_pair.md, "The task-tuned target").',
        "",
    ]
    if record.get("load_call"):
        lines += ["```python", "from diversed_hf import testbed", "", record["load_call"], "```", ""]
    lines += [
        "or with peft: `PeftModel.from_pretrained(base_model, PATH).merge_and_unload()`.",
        "",
        "## Training",
        "",
        "| data | pairs | completion |",
        "|---|---|---|",
        *rows,
        "",
        f"{data.get('train_sequences', '?')} of the {data.get('train_pairs', '?')} pairs have a completion within "
        f"{settings.get('max_length', '?')} tokens and are trained on. "
        f"Prompts are chat turns (SmolLM2's template); the loss is on the completion and its end-of-turn token "
        f"`{record.get('eos_token', '?')}` only. {record.get('steps', '?')} optimizer steps of "
        f"{settings.get('batch_size', '?')} x {settings.get('gradient_accumulation_steps', '?')} sequences "
        f"({record.get('epochs', '?')} epochs), learning rate "
        f"{settings.get('learning_rate', '?')} (cosine, warm-up), "
        f"{'bfloat16 autocast over float32 weights' if settings.get('mixed_precision') == 'bf16' else 'float32'}, "
        f"LoRA dropout {lora.get('dropout', '?')}, seed "
        f"{record.get('seed', '?')}. Last logged training loss: {record.get('final_loss') or '–'}.",
        "",
        f"Time on {record.get('threads', '?')} CPU thread(s): the base model's chat answers "
        f"{_duration(seconds.get('chat_answers'))}, training {_duration(seconds.get('training'))} over "
        f"{record.get('sessions', '?')} session(s) (a run resumes from its newest checkpoint).",
        "",
    ]
    measured = record.get("measured")
    if measured:
        lines += [
            "## Quality",
            "",
            f"Measured on {measured['prompts']} at temperature 1 (top-k 0, top-p 1) and greedily, in "
            f"{measured['metrics']}, paired 95 % intervals: {measured['summary']}.",
            "",
            f"`{measured['command']}`",
            "",
        ]
    if record.get("recipe"):
        lines += ["## Rebuild", "", "```bash", record["recipe"], "```", ""]
    lines += ["Settings: `" + json.dumps(settings, sort_keys=True) + "`", ""]
    return "\n".join(line for line in lines if line is not None) + "\n"
