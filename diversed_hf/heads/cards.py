"""Model cards for DIVERSED heads, rendered from ``diversed_hf/templates/model_card.md``.

Every saved head gets a ``README.md`` card: the pair, the task and training data, the training
configuration, a results table in the paper's format, a usage snippet, limitations and the
citation, under Hub metadata (``library_name``, tags, ``base_model``, ``datasets``). The card is
rendered from the files in the head's directory:

``config.json`` (required)
    the :class:`~diversed_hf.heads.head.DiversedHeadConfig`.
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
          "quality_metric": "exact_match",   # "exact_match" | "rouge2_f1" | "pass@1" | other (aliases
                                         #   such as "accuracy" are read as in diversed_hf.lab.tasks)
          "seconds_per_sample": 1.9,     # mean wall-clock seconds per prompt
          "tokens_per_second": 67.4,     # generated tokens / second
          "tokens_per_round": 3.4,       # mean tokens emitted per round (E[T_N] estimate)
          "speedup_vs_target": 2.1,      # target-only seconds_per_sample / this row's
          "speedup_vs_sd": 1.3,          # SD seconds_per_sample / this row's
          "quality_delta": -0.004,       # quality minus the target distribution's, paired over prompts,
          "quality_delta_low": -0.013,   #   with its 95 % interval (fractions; `diversed-hf bench` writes
          "quality_delta_high": 0.005,   #   them: target-only and SD samples pooled as the target's)
          "head_task": "arith"           # DIVERSED rows: the task the head was trained for
        }

    An optional ``selection`` object says why this head was chosen among heads trained with several values of a
    setting (``benchmarks/ablation.py --front`` writes it for a ``lambda_acceptance`` sweep); the card shows it
    under "Operating point"::

        "selection": {
          "rule": "the head with the highest acceptance whose ...",   # required: the rule, in words
          "chosen": "lambda 0.1",                                      # required: a method of `front`
          "lambda_acceptance": 0.1,                                    # the chosen head's value
          "front": [{"method": "lambda 0.1", "lambda_acceptance": 0.1, "acceptance_rate": 0.83,
                     "acceptance_ratio_vs_sd": 1.45, "quality": 0.79, "quality_delta": 0.0,
                     "quality_delta_low": -0.03, "quality_delta_high": 0.03}, ...],
          "command": "python benchmarks/ablation.py ..."                 # what measured the front
        }

    Every field but ``method`` may be omitted or ``null`` (shown as "-"). Missing speedups are
    computed from ``seconds_per_sample`` when an ``"autoregressive"`` / ``"target-only"`` or an
    ``"sd"`` row (by ``method``, or by ``family`` as ``diversed-hf bench`` writes it) has it. Other
    keys are allowed and ignored. DIVERSED rows (``family`` ``"diversed"``, or a method name
    starting with ``diversed``) are shown in bold, except rows of a head trained for another task
    (``head_task`` differs from the setting's ``task``: the transfer experiment). ``diversed-hf bench`` writes one
    such file per task (``results_<task>.json``): copy it next to the head as ``results.json``.

The task's description, Hub datasets and default metric come from ``training_config.json``'s ``task_card`` (name,
aliases, description, metric, hub_datasets), which the lab writes from its task registry when it trains a head or
re-cards one (``diversed-hf card``; :func:`diversed_hf.lab.tasks.task_card`), or from ``task_card=`` given to
:func:`render_card`: rendering a card loads no task. Without either the card names the task and no more.

Re-render after adding a results file with ``diversed-hf card DIR`` (or :func:`write_card`);
render the cards of the heads shipped with the package into ``model_cards/`` with
``diversed-hf card --shipped --output-dir model_cards`` (which re-renders the real pair's drafts' and adapter's cards
too: :func:`render_template`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from . import hub
from .card_results import (  # noqa: F401  (re-exported: the results schema is part of the cards' API)
    RESULT_FIELDS,
    TASK_CARD_KEY,
    WARNINGS_KEY,
    _format_calibration,
    _format_rows,
    _format_selection,
    _quality_metric,
    goal_text,
    load_results,
    task_facts,
    write_results,
)
from .hub import HUB_TAGS, LIBRARY_NAME, PAPER_URL  # noqa: F401  (re-exported: the cards' names for them)
from .metrics import metric_label

#: written next to a head by training/calibrate_head.py; the card shows it as the head's operating point
CALIBRATION_NAME = "calibration.json"

if TYPE_CHECKING:
    from .config import DiversedHeadConfig

logger = logging.getLogger(__name__)


__all__ = [
    "MODEL_DESCRIPTIONS",
    "RESULT_FIELDS",
    "card_data",
    "load_results",
    "load_training_config",
    "register_model_description",
    "register_pair_usage",
    "render_card",
    "render_template",
    "stage_result_files",
    "write_card",
    "write_results",
    "write_training_config",
]

TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "templates" / "model_card.md"

CITATION = """@inproceedings{wang2026diversed,
  title         = {{DIVERSED}: Relaxed Speculative Decoding via Dynamic Ensemble Verification},
  author        = {Wang and Kasa and {M S} and Kasa and Zou and Negi and Zhang and Jiang and Song},
  booktitle     = {International Conference on Artificial Intelligence and Statistics (AISTATS)},
  year          = {2026},
  eprint        = {2604.07622},
  archivePrefix = {arXiv}
}"""

MIXIN_TAG = "model_hub_mixin"

#: What a card says of a model id it names: ``{model_id: description}``. The project's own pairs register theirs
#: (:func:`register_model_description`, called by :mod:`diversed_hf.testbed` when it loads); any other id is linked
#: to the Hub or named as a local path.
MODEL_DESCRIPTIONS: dict[str, str] = {}


#: Usage snippets of the pairs whose models load by a call of their own (the project's testbed and real pair):
#: ``{(target_id, draft_id): usage}``, ``usage(config, head_source, load_head, generate, temperature) -> str`` with
#: the card's default head-loading and ``generate`` lines (:func:`register_pair_usage`).
PAIR_USAGES: dict[tuple[str, str], Callable[..., str]] = {}


def register_pair_usage(target_id: str, draft_id: str, usage: Callable[..., str]) -> None:
    """Make the cards of heads trained on ``(target_id, draft_id)`` show ``usage``'s snippet."""
    if not callable(usage):
        raise TypeError(f"`usage` must be a function, got {type(usage).__name__}.")
    PAIR_USAGES[(target_id, draft_id)] = usage


def register_model_description(model_id: str, description: str) -> None:
    """Make the cards describe ``model_id`` (a ``config._name_or_path``) as ``description`` (Markdown)."""
    if not isinstance(model_id, str) or not model_id or not isinstance(description, str) or not description:
        raise ValueError(f"`model_id` and `description` must be non-empty strings, got {model_id!r}, {description!r}.")
    MODEL_DESCRIPTIONS[model_id] = description


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


def stage_result_files(
    staging: Path, directory: Path, results: Any, training_config: Any, same_head: bool
) -> tuple[dict[str, Any], list[str]]:
    """The result files of a save into ``directory``, written first into its ``staging`` directory.

    ``results.json`` / ``training_config.json`` are written from ``results`` / ``training_config`` when given; else
    the file already in ``directory`` is kept when it describes this very head (``same_head``) and removed
    otherwise. Returns the card's inputs (``{"results": ..., "training_config": ...}``, content or None) and the
    names of the files to remove from ``directory``.
    """
    card_inputs, stale = {}, []
    for name, filename, value, write in (
        ("results", hub.RESULTS_NAME, results, write_results),
        ("training_config", hub.TRAINING_CONFIG_NAME, training_config, write_training_config),
    ):
        staged, kept = Path(staging) / filename, Path(directory) / filename
        if value is not None:
            write(staged, value)
        source = staged if staged.is_file() else kept if kept.is_file() and same_head else None
        card_inputs[name] = hub.read_json(source, name.replace("_", " ").capitalize()) if source else None
        stale += [filename] if source is None and kept.is_file() else []
    return card_inputs, stale


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


def _describe_model(model_id: str | None) -> str:
    if not model_id:
        return "not recorded"
    if model_id in MODEL_DESCRIPTIONS:
        return MODEL_DESCRIPTIONS[model_id]
    if _hub_model_id(model_id):
        return f"[`{model_id}`](https://huggingface.co/{model_id})"
    return f"`{model_id}` (local path)"


def _usage(config: SimpleNamespace, head_source: str, num_draft_tokens: int, temperature: float = 0.7) -> str:
    load_head = f'head = DiversedHead.from_pretrained("{head_source}")'
    generate = (  # laid out as `ruff format` lays it out (it formats the Python blocks of Markdown files too)
        "output = target.generate(\n"
        "    **inputs,\n"
        "    assistant_model=draft,\n"
        "    diversed_head=head,\n"
        f"    num_assistant_tokens={num_draft_tokens},\n"
        "    do_sample=True,\n"
        "    max_new_tokens=128,\n"
        ")\n"
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))'
    )
    usage = PAIR_USAGES.get((config.target_model_id, config.draft_model_id))
    if usage is not None:  # a pair of the project's own: its models load by a call, not by a Hub id
        return usage(config, head_source, load_head, generate, temperature)
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


def _head_fields(config: "DiversedHeadConfig | Mapping[str, Any]") -> SimpleNamespace:
    """The fields of a head config (a ``DiversedHeadConfig`` or the object in its ``config.json``) for rendering."""
    if is_dataclass(config) and not isinstance(config, type):
        values = asdict(config)
    elif isinstance(config, Mapping):
        values = dict(config)
    else:
        raise TypeError(
            "`config` must be a DiversedHeadConfig or the dict of a head's config.json, got "
            f"{type(config).__name__}; pass `head.config`."
        )
    missing = [name for name in hub.REQUIRED_FILE_FIELDS if name not in values]
    if missing:
        raise ValueError(f"`config` lacks the head fields {missing}; pass `head.config` or a saved head's config.json.")
    optional = dict.fromkeys(("task", "target_model_id", "draft_model_id", "mlp_hidden_size", "w_0"))
    return SimpleNamespace(**{**optional, **values})


def card_data(
    config: "DiversedHeadConfig | Mapping[str, Any]",
    training_config: dict | None = None,
    task_card: Mapping[str, Any] | None = None,
) -> ModelCardData:
    """Hub metadata: library, tags, base models (the pair, when they are Hub ids), datasets, license."""
    config = _head_fields(config)
    training_config = training_config or {}
    facts = _facts(config.task, training_config, task_card)
    tags = {*HUB_TAGS, MIXIN_TAG}
    if isinstance(config.task, str) and config.task:
        tags.add(config.task)
    base_models = [
        model for model in (_hub_model_id(config.target_model_id), _hub_model_id(config.draft_model_id)) if model
    ]
    extra = {"base_model_relation": "adapter"} if base_models else {}
    return ModelCardData(
        library_name=LIBRARY_NAME,
        tags=sorted(tags),
        base_model=base_models or None,
        datasets=_datasets(training_config, facts) or None,
        license=training_config.get("license") if isinstance(training_config.get("license"), str) else None,
        **extra,
    )


def _facts(task: str | None, training_config: dict | None, task_card: Mapping[str, Any] | None):
    """What the card says of ``task``: the training record's ``task_card`` when it is about ``task``, else the
    caller's ``task_card``, else None."""
    return task_facts(task, (training_config or {}).get(TASK_CARD_KEY)) or task_facts(task, task_card)


def _datasets(training_config: dict, facts: SimpleNamespace | None) -> list[str]:
    recorded = training_config.get("datasets", training_config.get("dataset"))
    if isinstance(recorded, str):
        recorded = [recorded]
    if isinstance(recorded, list):
        return [name for name in recorded if isinstance(name, str) and _hub_model_id(name)]
    return list(facts.hub_datasets) if facts is not None else []


def _check_same_task(task: str | None, results: dict | None, facts: SimpleNamespace | None) -> None:
    """A card shows one task: results measured on another task than the head's are refused (the task's aliases, when
    recorded, name the same task)."""
    measured = results["setting"].get("task") if results else None
    if not task or not isinstance(measured, str):
        return

    def canonical(name: str) -> str:
        return facts.name if facts is not None and name in (facts.name, *facts.aliases) else name

    if canonical(measured) != canonical(task):
        raise ValueError(
            f"The results were measured on task {measured!r} but the head was trained for {task!r}; a card shows one "
            "task. Pass the results file of the head's task (`diversed-hf bench` writes results_<task>.json)."
        )


def render_card(
    config: "DiversedHeadConfig | Mapping[str, Any]",
    *,
    repo_id: str | None = None,
    results: Any = None,
    training_config: Any = None,
    head_source: str | None = None,
    num_parameters: int | None = None,
    calibration: Any = None,
    task_card: Mapping[str, Any] | None = None,
) -> ModelCard:
    """Render the card of a head with ``config`` (``results`` / ``training_config`` / ``calibration``: content or
    paths; ``calibration`` is the ``calibration.json`` of ``training/calibrate_head.py``; ``task_card``: what to say
    of the head's task when ``training_config`` does not record it, e.g. :func:`diversed_hf.lab.tasks.task_card`).

    ``config`` is ``head.config`` or the dict of a saved ``config.json``. ``repo_id`` (or else
    ``head_source``, a local path) is what the usage snippet loads. ``num_parameters`` defaults to
    ``config.num_parameters`` (a ``DiversedHeadConfig`` knows it).
    """
    if num_parameters is None:
        num_parameters = getattr(config, "num_parameters", None)
    head = _head_fields(config)
    results = load_results(results) if results is not None else None
    training = load_training_config(training_config) if training_config is not None else None
    task = head.task
    facts = _facts(task, training, task_card)
    _check_same_task(task, results, facts)
    if facts is not None and facts.description:
        task_description = facts.description
    elif task:
        task_description = f"Trained for the task `{task}`."
    else:
        task_description = "The task this head was trained for was not recorded (`task` in config.json)."
    num_draft_tokens = 5
    if results and isinstance(results["setting"].get("num_draft_tokens"), int):
        num_draft_tokens = results["setting"]["num_draft_tokens"]
    mixture = (
        "`nu_t = w_t p_t + (1 - w_t) q_t` of the target distribution `p_t` and the draft distribution `q_t`"
        if head.mixing == "probs"
        else "`softmax(w_t z_p + (1 - w_t) z_q)` of the target and draft logits (the official code's logit mixing)"
    )
    name = (repo_id or "").split("/")[-1] or (f"{task} head" if task else "head")
    metric = _quality_metric(results, facts) if results else None
    warnings = [str(w) for w in (training or {}).get(WARNINGS_KEY) or []]  # what the run said it did not teach
    return ModelCard.from_template(
        card_data(config, training, task_card),
        template_path=str(TEMPLATE_PATH),
        title=f"DIVERSED ensemble head: {name}",
        paper_url=PAPER_URL,
        mixture=mixture,
        head=head,
        num_parameters=f"{num_parameters:,}" if isinstance(num_parameters, int) else "not recorded",
        target_model=_describe_model(head.target_model_id),
        draft_model=_describe_model(head.draft_model_id),
        task_name=f"`{task}`" if task else "an unrecorded task",
        task_description=task_description,
        datasets=_datasets(training or {}, facts),
        training_rows=_flatten({k: v for k, v in training.items() if k not in (TASK_CARD_KEY, WARNINGS_KEY)})
        if training
        else [],
        results_rows=_format_rows(results, highlight=not warnings) if results else [],
        warnings=warnings,
        results_setting=", ".join(f"{key} = {value}" for key, value in results["setting"].items()) if results else "",
        quality_label=metric_label(metric),
        goal=goal_text(training, results),
        selection=_format_selection(results.get("selection")) if results else None,
        calibration=_format_calibration(calibration, "calibration", metric or (facts.metric if facts else None)),
        usage=_usage(
            head,
            repo_id or head_source or "path/to/head",
            num_draft_tokens,
            # the real pair's snippet samples at the temperature the head was trained at
            float((training or {}).get("temperature") or 0.7),
        ),
        citation=CITATION,
    )


def write_card(
    directory: str | os.PathLike,
    *,
    repo_id: str | None = None,
    results: Any = None,
    training_config: Any = None,
    output: str | os.PathLike | None = None,
    task_card: Mapping[str, Any] | None = None,
) -> Path:
    """Render the card of the head saved in ``directory`` and write it (default ``directory/README.md``;
    ``task_card`` as in :func:`render_card`).

    ``results`` / ``training_config`` default to ``results.json`` / ``training_config.json`` in the directory;
    the parameter count is read from the header of its ``model.safetensors``.
    """
    directory = Path(directory)
    config = hub.read_head_config(hub.resolve_file(directory, hub.CONFIG_NAME))
    weights = directory / hub.WEIGHTS_NAME
    num_parameters = hub.count_parameters(weights) if weights.is_file() else None
    if results is None and (directory / hub.RESULTS_NAME).is_file():
        results = directory / hub.RESULTS_NAME
    if training_config is None and (directory / hub.TRAINING_CONFIG_NAME).is_file():
        training_config = directory / hub.TRAINING_CONFIG_NAME
    calibration = directory / CALIBRATION_NAME if (directory / CALIBRATION_NAME).is_file() else None
    card = render_card(
        config,
        repo_id=repo_id,
        results=results,
        training_config=training_config,
        head_source=str(directory),
        num_parameters=num_parameters,
        calibration=calibration,
        task_card=task_card,
    )
    path = Path(output) if output is not None else directory / hub.CARD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    card.save(str(path))
    logger.info("wrote model card %s", path)
    return path


def render_template(template: str, metadata: dict, **context) -> str:
    """A card of this package's other artifacts (drafts, adapters) from ``templates/<template>``, as heads' cards are
    rendered: huggingface_hub's ``ModelCard.from_template`` with ``metadata`` (``ModelCardData`` fields) as its YAML
    header and ``context`` filling the template."""
    path = TEMPLATE_PATH.parent / template
    card = ModelCard.from_template(ModelCardData(**metadata), template_path=str(path), **context)
    return str(card).rstrip("\n") + "\n"
