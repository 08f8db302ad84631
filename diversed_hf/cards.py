"""Model cards for DIVERSED heads, rendered from ``diversed_hf/templates/model_card.md``.

Every saved head gets a ``README.md`` card: the pair, the task and training data, the training
configuration, a results table in the paper's format, a usage snippet, limitations and the
citation, under Hub metadata (``library_name``, tags, ``base_model``, ``datasets``). The card is
rendered from the files in the head's directory:

``config.json`` (required)
    the :class:`~diversed_hf.head.DiversedHeadConfig`.
``training_config.json`` (optional)
    any JSON object describing training (the trainer's config as a dict); shown as a table,
    nested keys flattened with dots. Keys the card also reads: ``datasets`` (list of Hub dataset
    ids) or ``dataset`` (one id) for the metadata and the training-data line; ``license``.
``results.json`` (optional)
    benchmark metrics, either a list of rows or an object ``{"setting": {...}, "rows": [...]}``.
    ``setting`` is free-form (e.g. ``task``, ``temperature``, ``num_draft_tokens``,
    ``num_samples``, ``max_new_tokens``, ``hardware``, ``quality_metric``) and printed above the
    table. Each row is one method on the same prompts::

        {
          "method": "diversed",          # required; "autoregressive" and "sd" name the baselines
          "acceptance_rate": 0.726,      # accepted drafted tokens / drafted tokens, in [0, 1]
          "quality": 0.67,               # task quality as a fraction in [0, 1] (exact match,
                                         #   ROUGE-2 F1, pass@1); the card shows it x 100
          "quality_metric": "exact_match",   # "exact_match" | "rouge2_f1" | "pass@1" | other
          "seconds_per_sample": 1.9,     # mean wall-clock seconds per prompt
          "tokens_per_second": 67.4,     # generated tokens / second
          "tokens_per_round": 3.4,       # mean tokens emitted per round (E[T_N] estimate)
          "speedup_vs_target": 2.1,      # target-only seconds_per_sample / this row's
          "speedup_vs_sd": 1.3           # SD seconds_per_sample / this row's
        }

    Every field but ``method`` may be omitted or ``null`` (shown as "-"). Missing speedups are
    computed from ``seconds_per_sample`` when an ``"autoregressive"`` / ``"target-only"`` or an
    ``"sd"`` row (by ``method``, or by ``family`` as ``diversed-hf bench`` writes it) has it. Other
    keys are allowed and ignored. DIVERSED rows (``family`` ``"diversed"``, or a method name
    starting with ``diversed``) are shown in bold. ``diversed-hf bench`` writes one such file per
    task (``results_<task>.json``): copy it next to the head as ``results.json``.

Re-render after adding a results file with ``diversed-hf card DIR`` (or :func:`write_card`);
render the cards of the heads shipped with the package into ``model_cards/`` with
``diversed-hf card --shipped --output-dir model_cards``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from . import hub
from .head import PAPER_URL, DiversedHead, DiversedHeadConfig

logger = logging.getLogger(__name__)

TEMPLATE_PATH = Path(__file__).resolve().parent / "templates" / "model_card.md"

CITATION = """@inproceedings{wang2026diversed,
  title         = {{DIVERSED}: Relaxed Speculative Decoding via Dynamic Ensemble Verification},
  author        = {Wang and Kasa and {M S} and Kasa and Zou and Negi and Zhang and Jiang and Song},
  booktitle     = {International Conference on Artificial Intelligence and Statistics (AISTATS)},
  year          = {2026},
  eprint        = {2604.07622},
  archivePrefix = {arXiv}
}"""

#: known tasks: (description, Hub datasets, default quality metric)
TASKS: dict[str, tuple[str, list[str], str]] = {
    "gsm8k": ("GSM8K grade-school math word problems; quality is exact match of the final number.", ["openai/gsm8k"], "exact_match"),
    "xsum": ("XSum one-sentence news summaries; quality is ROUGE-2 F1.", ["EdinburghNLP/xsum"], "rouge2_f1"),
    "cnn_dailymail": ("CNN/DailyMail news summaries; quality is ROUGE-2 F1.", ["abisee/cnn_dailymail"], "rouge2_f1"),
    "mbpp": ("MBPP Python programming problems; quality is pass@1 of the unit tests.", ["google-research-datasets/mbpp"], "pass@1"),
    "arith": (
        "The `diversed_hf` testbed's GSM8K-style arithmetic task, generated offline "
        "(`diversed_hf.testbed.load_task(\"arith\")`); quality is exact match of the final number.",
        [],
        "exact_match",
    ),
    "summary": (
        "The `diversed_hf` testbed's XSum-style summary task, generated offline "
        "(`diversed_hf.testbed.load_task(\"summary\")`); quality is ROUGE-2 F1.",
        [],
        "rouge2_f1",
    ),
}
TASKS["cnndm"] = TASKS["cnn_dailymail"]

QUALITY_LABELS = {
    "exact_match": "accuracy (%)",
    "accuracy": "accuracy (%)",
    "rouge2_f1": "ROUGE-2 F1 (x100)",
    "rouge2": "ROUGE-2 F1 (x100)",
    "rouge-2": "ROUGE-2 F1 (x100)",
    "pass@1": "pass@1 (%)",
    "pass_at_1": "pass@1 (%)",
}

#: numeric row fields: (valid range low, high) - None for open
RESULT_FIELDS: dict[str, tuple[float, float | None]] = {
    "acceptance_rate": (0.0, 1.0),
    "quality": (0.0, 1.0),
    "seconds_per_sample": (0.0, None),
    "tokens_per_second": (0.0, None),
    "tokens_per_round": (1.0, None),
    "speedup_vs_target": (0.0, None),
    "speedup_vs_sd": (0.0, None),
}
TARGET_ONLY_METHODS = ("autoregressive", "target", "target-only", "target_only")
SD_METHODS = ("sd", "speculative_decoding", "speculative-decoding", "exact")


# Results -------------------------------------------------------------------------------------------


def load_results(source: Any) -> dict:
    """Validate benchmark results (a path, a list of rows or ``{"setting", "rows"}``) -> ``{"setting", "rows"}``.

    Rows come back with every field of :data:`RESULT_FIELDS` (``None`` where absent) plus ``method``
    and ``quality_metric``, and with missing speedups derived from the baselines' times.
    """
    where = "results"
    if isinstance(source, (str, os.PathLike)):
        where = str(source)
        if not Path(source).is_file():
            raise FileNotFoundError(f"Results file {where} not found.")
        source = hub.read_json(Path(source), "Results file")
    if isinstance(source, list):
        setting, raw_rows = {}, source
    elif isinstance(source, dict) and isinstance(source.get("rows"), list):
        setting, raw_rows = source.get("setting") or {}, source["rows"]
        if not isinstance(setting, dict):
            raise ValueError(f"{where}: `setting` must be a JSON object, got {type(setting).__name__}.")
    else:
        raise ValueError(
            f"{where} must be a list of result rows or an object {{\"setting\": {{...}}, \"rows\": [...]}}; "
            "see the format in the diversed_hf.cards docstring."
        )
    rows = []
    for index, raw in enumerate(raw_rows):
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: row {index} must be a JSON object, got {raw!r}.")
        method = raw.get("method")
        if not isinstance(method, str) or not method:
            raise ValueError(f"{where}: row {index} needs a non-empty string `method` (e.g. \"sd\", \"diversed\"), got {method!r}.")
        family = raw.get("family")
        row: dict[str, Any] = {"method": method, "family": family if isinstance(family, str) else None}
        for name, (low, high) in RESULT_FIELDS.items():
            value = raw.get(name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                    raise ValueError(f"{where}: row {index} ({method}) `{name}` must be a number or null, got {value!r}.")
                if value < low or (high is not None and value > high):
                    interval = f"[{low}, {high}]" if high is not None else f">= {low}"
                    hint = " Write fractions: 72.6 % is 0.726, ROUGE-2 7.09 is 0.0709." if high == 1.0 else ""
                    raise ValueError(f"{where}: row {index} ({method}) `{name}` = {value!r} is outside {interval}.{hint}")
                value = float(value)
            row[name] = value
        metric = raw.get("quality_metric")
        if metric is not None and not isinstance(metric, str):
            raise ValueError(f"{where}: row {index} ({method}) `quality_metric` must be a string, got {metric!r}.")
        row["quality_metric"] = metric
        rows.append(row)
    if not rows:
        raise ValueError(f"{where} has no result rows.")
    _derive_speedups(rows)
    return {"setting": setting, "rows": rows}


def _derive_speedups(rows: list[dict]) -> None:
    def base_time(names):
        for row in rows:
            if (row["method"].lower() in names or (row["family"] or "").lower() in names) and row["seconds_per_sample"]:
                return row["seconds_per_sample"]
        return None

    for field_name, names in (("speedup_vs_target", TARGET_ONLY_METHODS), ("speedup_vs_sd", SD_METHODS)):
        base = base_time(names)
        for row in rows:
            if row[field_name] is None and base is not None and row["seconds_per_sample"]:
                row[field_name] = base / row["seconds_per_sample"]


def write_results(path: Path, results: Any) -> None:
    """Validate ``results`` (a path or content) and write it to ``path`` as given."""
    load_results(results)
    if isinstance(results, (str, os.PathLike)):
        if Path(results).resolve() != Path(path).resolve():
            shutil.copyfile(results, path)
    else:
        hub.write_json(path, results)


def _quality_metric(results: dict, task: str | None) -> str | None:
    metrics = {row["quality_metric"] for row in results["rows"] if row["quality_metric"] and row["quality"] is not None}
    if len(metrics) > 1:
        raise ValueError(
            f"Result rows mix quality metrics {sorted(metrics)}: one card shows one task. Use the per-task results "
            "file (`diversed-hf bench` writes results_<task>.json) as the head's results.json."
        )
    if metrics:
        return metrics.pop()
    setting_metric = results["setting"].get("quality_metric")
    if isinstance(setting_metric, str):
        return setting_metric
    return TASKS[task][2] if task in TASKS else None


def _format_rows(results: dict) -> list[dict]:
    def fmt(value, pattern):
        return "-" if value is None else pattern.format(value)

    formatted = []
    for row in results["rows"]:
        cells = {
            "method": row["method"],
            "acceptance_rate": fmt(None if row["acceptance_rate"] is None else 100 * row["acceptance_rate"], "{:.1f} %"),
            "quality": fmt(None if row["quality"] is None else 100 * row["quality"], "{:.2f}"),
            "seconds_per_sample": fmt(row["seconds_per_sample"], "{:.3g}"),
            "tokens_per_second": fmt(row["tokens_per_second"], "{:.1f}"),
            "tokens_per_round": fmt(row["tokens_per_round"], "{:.2f}"),
            "speedup_vs_target": fmt(row["speedup_vs_target"], "{:.2f}x"),
            "speedup_vs_sd": fmt(row["speedup_vs_sd"], "{:.2f}x"),
        }
        if row["family"] == "diversed" or row["method"].lower().startswith("diversed"):
            cells = {key: f"**{value}**" for key, value in cells.items()}
        formatted.append(cells)
    return formatted


# Training configuration ----------------------------------------------------------------------------


def load_training_config(source: Any) -> dict:
    """A training configuration as a dict: from a dict, a dataclass or a JSON file holding an object."""
    if is_dataclass(source) and not isinstance(source, type):
        return asdict(source)
    if isinstance(source, (str, os.PathLike)):
        if not Path(source).is_file():
            raise FileNotFoundError(f"Training config file {source} not found.")
        source = hub.read_json(Path(source), "Training config")
    if not isinstance(source, dict):
        raise ValueError(f"A training config must be a JSON object (dict) or a dataclass, got {type(source).__name__}.")
    return source


def write_training_config(path: Path, training_config: Any) -> None:
    values = load_training_config(training_config)
    if isinstance(training_config, (str, os.PathLike)) and Path(training_config).resolve() == Path(path).resolve():
        return
    hub.write_json(path, values)


def _flatten(values: dict, prefix: str = "") -> list[tuple[str, str]]:
    rows = []
    for key in values:
        value = values[key]
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows.extend(_flatten(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            rows.append((name, str(text).replace("|", "\\|").replace("\n", " ")))
    return rows


# Rendering -----------------------------------------------------------------------------------------


def _hub_model_id(model_id: str | None) -> str | None:
    """``model_id`` if it can be a Hub repo id (not a local path), else None."""
    if not model_id or model_id.startswith((".", "/", "~")) or os.path.exists(model_id):
        return None
    try:
        validate_repo_id(model_id)
    except HFValidationError:
        return None
    return model_id


def _testbed_name(model_id: str | None) -> str | None:
    """``"target"`` / ``"draft"`` when ``model_id`` names a testbed model: the stable id set by
    ``testbed.load_pair()`` or a path into the shipped testbed's assets."""
    if not model_id:
        return None
    from .testbed import MODEL_ID_PREFIX, MODEL_NAMES

    if model_id.startswith(MODEL_ID_PREFIX) and model_id[len(MODEL_ID_PREFIX) :] in MODEL_NAMES:
        return model_id[len(MODEL_ID_PREFIX) :]
    parts = Path(model_id).parts
    if len(parts) >= 3 and parts[-3:-1] == ("testbed", "assets"):
        return parts[-1]
    return None


def _describe_model(model_id: str | None) -> str:
    if not model_id:
        return "not recorded"
    if _testbed_name(model_id):
        return f"`diversed_hf` testbed {_testbed_name(model_id)} (`diversed_hf.testbed.load_pair()`)"
    if _hub_model_id(model_id):
        return f"[`{model_id}`](https://huggingface.co/{model_id})"
    return f"`{model_id}` (local path)"


def _usage(config: DiversedHeadConfig, head_source: str, num_draft_tokens: int) -> str:
    load_head = f'head = DiversedHead.from_pretrained("{head_source}")'
    generate = (
        "output = target.generate(\n"
        "    **inputs, assistant_model=draft, diversed_head=head,\n"
        f"    num_assistant_tokens={num_draft_tokens}, do_sample=True, max_new_tokens=128,\n"
        ")\n"
        "print(tokenizer.decode(output[0, inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))"
    )
    if _testbed_name(config.target_model_id) and _testbed_name(config.draft_model_id):
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
    target = config.target_model_id or "TARGET_MODEL_ID"
    draft = config.draft_model_id or "DRAFT_MODEL_ID"
    return (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from diversed_hf import DiversedHead, enable_diversed\n\n"
        f"{load_head}\n"
        f'target = enable_diversed(AutoModelForCausalLM.from_pretrained("{target}"))\n'
        f'draft = AutoModelForCausalLM.from_pretrained("{draft}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{target}")\n\n'
        'inputs = tokenizer("Your prompt", return_tensors="pt")\n'
        f"{generate}"
    )


def card_data(config: DiversedHeadConfig, training_config: dict | None = None) -> ModelCardData:
    """Hub metadata: library, tags, base models (the pair, when they are Hub ids), datasets, license."""
    training_config = training_config or {}
    tags = set(DiversedHead._hub_mixin_info.model_card_data.tags or []) | {"diversed", "speculative-decoding", "ensemble-head"}
    if config.task:
        tags.add(config.task)
    base_models = [model for model in (_hub_model_id(config.target_model_id), _hub_model_id(config.draft_model_id)) if model]
    extra = {"base_model_relation": "adapter"} if base_models else {}
    return ModelCardData(
        library_name="diversed_hf",
        tags=sorted(tags),
        base_model=base_models or None,
        datasets=_datasets(config, training_config) or None,
        license=training_config.get("license") if isinstance(training_config.get("license"), str) else None,
        **extra,
    )


def _datasets(config: DiversedHeadConfig, training_config: dict) -> list[str]:
    recorded = training_config.get("datasets", training_config.get("dataset"))
    if isinstance(recorded, str):
        recorded = [recorded]
    if isinstance(recorded, list):
        return [name for name in recorded if isinstance(name, str) and _hub_model_id(name)]
    return list(TASKS[config.task][1]) if config.task in TASKS else []


def _num_parameters(config: DiversedHeadConfig) -> int:
    # Built on the meta device: no memory, and no draw from the global RNG (a card written from a
    # training loop must not change the run's random stream).
    with torch.device("meta"):
        return sum(parameter.numel() for parameter in DiversedHead(config).parameters())


def render_card(
    config: DiversedHeadConfig,
    *,
    repo_id: str | None = None,
    results: Any = None,
    training_config: Any = None,
    head_source: str | None = None,
) -> ModelCard:
    """Render the card of a head with ``config`` (``results`` / ``training_config``: content or paths).

    ``repo_id`` (or else ``head_source``, a local path) is what the usage snippet loads.
    """
    results = load_results(results) if results is not None else None
    training = load_training_config(training_config) if training_config is not None else None
    task = config.task
    if task in TASKS:
        task_description = TASKS[task][0]
    elif task:
        task_description = f"Trained for the task `{task}`."
    else:
        task_description = "The task this head was trained for was not recorded (`task` in config.json)."
    num_draft_tokens = 5
    if results and isinstance(results["setting"].get("num_draft_tokens"), int):
        num_draft_tokens = results["setting"]["num_draft_tokens"]
    mixture = (
        "`nu_t = w_t p_t + (1 - w_t) q_t` of the target distribution `p_t` and the draft distribution `q_t`"
        if config.mixing == "probs"
        else "`softmax(w_t z_p + (1 - w_t) z_q)` of the target and draft logits (the official code's logit mixing)"
    )
    name = (repo_id or "").split("/")[-1] or (f"{task} head" if task else "head")
    metric = _quality_metric(results, task) if results else None
    card = ModelCard.from_template(
        card_data(config, training),
        template_path=str(TEMPLATE_PATH),
        title=f"DIVERSED ensemble head: {name}",
        paper_url=PAPER_URL,
        mixture=mixture,
        head=config,
        num_parameters=f"{_num_parameters(config):,}",
        target_model=_describe_model(config.target_model_id),
        draft_model=_describe_model(config.draft_model_id),
        task_name=f"`{task}`" if task else "an unrecorded task",
        task_description=task_description,
        datasets=_datasets(config, training or {}),
        training_rows=_flatten(training) if training else [],
        results_rows=_format_rows(results) if results else [],
        results_setting=", ".join(f"{key} = {value}" for key, value in results["setting"].items()) if results else "",
        quality_label=QUALITY_LABELS.get((metric or "").lower(), f"{metric} (x100)" if metric else "quality (x100)"),
        usage=_usage(config, repo_id or head_source or "path/to/head", num_draft_tokens),
        citation=CITATION,
    )
    return card


def write_card(
    directory: str | os.PathLike,
    *,
    repo_id: str | None = None,
    results: Any = None,
    training_config: Any = None,
    output: str | os.PathLike | None = None,
) -> Path:
    """Render the card of the head saved in ``directory`` and write it (default ``directory/README.md``).

    ``results`` / ``training_config`` default to ``results.json`` / ``training_config.json`` in the directory.
    """
    directory = Path(directory)
    config = DiversedHeadConfig.from_json_file(hub.resolve_file(directory, hub.CONFIG_NAME))
    if results is None and (directory / hub.RESULTS_NAME).is_file():
        results = directory / hub.RESULTS_NAME
    if training_config is None and (directory / hub.TRAINING_CONFIG_NAME).is_file():
        training_config = directory / hub.TRAINING_CONFIG_NAME
    card = render_card(
        config, repo_id=repo_id, results=results, training_config=training_config, head_source=str(directory)
    )
    path = Path(output) if output is not None else directory / hub.CARD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    card.save(str(path))
    logger.info("wrote model card %s", path)
    return path


# Shipped heads -------------------------------------------------------------------------------------


def shipped_head_dirs() -> list[Path]:
    """Directories of the heads shipped in the testbed's assets (folders whose config.json is a head's)."""
    from .testbed import ASSETS_DIR

    heads = []
    candidates = [p for folder in (ASSETS_DIR, ASSETS_DIR / "heads") if folder.is_dir() for p in sorted(folder.iterdir())]
    for candidate in candidates:
        config_path = candidate / hub.CONFIG_NAME
        if config_path.is_file():
            try:
                values = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(values, dict) and "draft_hidden_size" in values and "target_hidden_size" in values:
                heads.append(candidate)
    return heads


def render_shipped_cards(output_dir: str | os.PathLike = "model_cards") -> list[Path]:
    """Write ``<output_dir>/<head name>.md`` for every shipped head (and refresh its README.md)."""
    written = []
    for directory in shipped_head_dirs():
        write_card(directory)
        written.append(write_card(directory, output=Path(output_dir) / f"{directory.name}.md"))
    if not written:
        logger.warning("no shipped heads found in the testbed assets; nothing rendered")
    return written
