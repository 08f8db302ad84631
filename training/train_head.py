"""Train a DIVERSED head and save it as a Hub-ready repo (config, weights, card, training config, results).

    python training/train_head.py --config training/configs/testbed_arith.yaml
    python training/train_head.py --config training/configs/gsm8k_llama.yaml --lambda_acceptance 6
    python training/train_head.py --config training/configs/testbed_arith.yaml --resume_from_checkpoint true
    python training/train_head.py --dataset my_prompts.jsonl --prompt_column question --answer_column answer \
        --reward exact_match --target_model testbed          # your data and reward (docs/your_task.md)
    python training/train_head.py --dataset my_chats.jsonl --reward my_rewards:score   # any TRL reward function

Arguments are :class:`ScriptArguments` (what to train on) plus every field of
:class:`diversed_hf.training.DiversedConfig` (how to train), parsed by TRL's ``TrlParser``: a YAML
``--config`` file supplies defaults and command-line flags override it. ``--help`` lists them in
groups (:func:`build_parser`): the script's, DIVERSED's own fields, the GRPO/Trainer fields whose
defaults DIVERSED changes, and last the hundreds of inherited GRPO/Trainer flags. The run writes

* ``<output_dir>/checkpoint-*``: head-only checkpoints (resume with ``--resume_from_checkpoint``),
* ``<output_dir>/train_log.jsonl``: the logged metrics of every step,
* ``<head_dir>`` (default ``<output_dir>/head``): the trained head with ``README.md`` card, a copy of ``train_log.jsonl``,
  ``training_config.json`` and ``results.json`` from a held-out evaluation (target-only, SD and the
  head, same prompts and temperature; skip with ``--eval_num_examples 0``).

Both directories are checked before the models load. The testbed recipes write to ``runs/``; a shipped head is
replaced only when asked, e.g. ``--head_dir diversed_hf/testbed/assets/heads/arith``. A bad argument or config
ends as one line with exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import GRPOConfig, TrlParser

from diversed_hf import DiversedHead
from diversed_hf.cli.evaluation import task_help
from diversed_hf.cli.ship import save_location
from diversed_hf.lab.cli_utils import check_output_dir, run_script
from diversed_hf.lab.tasks import get_task, task_card
from diversed_hf.lab.tasks.dense_rewards import (
    add_target_columns,
    check_reward_mode,
    dense_reward,
    likelihood_reward,
    target_completions,
)
from diversed_hf.lab.tasks.user_task import trl_reward
from diversed_hf.training import DiversedConfig, DiversedTrainer

REPO = Path(__file__).resolve().parents[1]

logger = logging.getLogger("train_head")


@dataclass
class ScriptArguments:
    task: str | None = field(default=None, metadata={"help": f"A registered task: {task_help()}. Or --dataset."})
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Your own prompts instead of a task: a .jsonl / .json / .csv / .parquet file, a directory "
            "datasets.save_to_disk wrote, or a dataset name (its train/test splits, else 90/10 of its rows); with "
            "--prompt_column, --answer_column and --reward (docs/your_task.md)."
        },
    )
    prompt_column: str = field(default="prompt", metadata={"help": "With --dataset: the column of the prompts."})
    answer_column: str | None = field(
        default=None, metadata={"help": "With --dataset: the column of the answers the reward compares with."}
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "With --dataset: render each prompt as one user turn of this chat template (smollm2)."},
    )
    target_model: str = field(
        default="testbed", metadata={"help": "Target model id or path; 'testbed' for the CPU testbed."}
    )
    draft_model: str | None = field(default=None, metadata={"help": "Draft model id or path (not with the testbed)."})
    device: str | None = field(
        default=None, metadata={"help": "Device of the frozen models (default: cuda if available)."}
    )
    dtype: str = field(default="float32", metadata={"help": "dtype of the frozen models (float32, bfloat16, float16)."})
    train_split: str = field(default="train", metadata={"help": "Split the training prompts come from."})
    num_train_examples: int | None = field(default=400, metadata={"help": "Training prompts (the paper uses ~400)."})
    num_shots: int = field(default=0, metadata={"help": "Few-shot exemplars in each prompt (Hub tasks only)."})
    train_data_files: str | None = field(default=None, metadata={"help": "Local training file (Hub dataset schema)."})
    eval_data_files: str | None = field(default=None, metadata={"help": "Local held-out file (Hub dataset schema)."})
    shots_data_files: str | None = field(default=None, metadata={"help": "Local few-shot exemplars file."})
    max_source_words: int | None = field(
        default=None, metadata={"help": "Truncate summarisation articles to this many words."}
    )
    eval_split: str = field(default="test", metadata={"help": "Split of the held-out evaluation after training."})
    eval_num_examples: int = field(
        default=100, metadata={"help": "Held-out prompts evaluated after training (0: skip)."}
    )
    eval_seed: int = field(default=0, metadata={"help": "Seed selecting the held-out prompts and sampling them."})
    eval_max_new_tokens: int = field(default=128, metadata={"help": "Max new tokens in the evaluation."})
    eval_batch_size: int = field(default=50, metadata={"help": "Prompts per generate call in the evaluation."})
    head_dir: str | None = field(
        default=None, metadata={"help": "Where the Hub-ready head goes (default <output_dir>/head)."}
    )
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's choice)."})
    goal_acceptance_ratio: float | None = field(
        default=None,
        metadata={
            "help": "The head's goal: acceptance at least this many times lossless SD's (recorded in "
            "training_config.json; the card says whether the measured results meet it)."
        },
    )
    goal_max_quality_loss: float | None = field(
        default=None,
        metadata={
            "help": "The head's goal: quality at most this far below the target distribution's (a fraction: "
            "0.01 = one point), with goal_acceptance_ratio."
        },
    )
    reward: str = field(
        default="task",
        metadata={
            "help": "The training reward: 'task' (the task's own), 'task_minus_target' (minus the target's "
            "greedy score on the prompt), 'target_agreement' (agreement with the target's greedy answer; "
            "exact-match and ROUGE tasks) or 'target_likelihood' (the target's own log-likelihood of the text: any "
            "task, chat included). The second and third generate the target's greedy answers once, cached in "
            "<output_dir>/target_completions.json. With --dataset: exact_match, rouge2, rougeL (against "
            "--answer_column), target_agreement or target_likelihood (no answers needed), or "
            "package.module:function (TRL's reward signature). See docs/training.md and docs/your_task.md."
        },
    )
    max_unknown_share: float = field(
        default=0.05,
        metadata={
            "help": "Refuse, before training, prompts whose tokens are more than this share unknown to the target's "
            "tokenizer (its unknown token): the run would teach nothing. 1 turns the check off (tiny random models)."
        },
    )
    calibration_logit_offset: float = field(
        default=0.0,
        metadata={
            "help": "Added to the head's output logit after training: > 0 moves every w toward the target (quality up, "
            "acceptance down). Choose it on training-split prompts, never on the held-out ones."
        },
    )

    def __post_init__(self):
        self.reward_source = self.reward  # what the user asked for (recorded); a --dataset reward becomes 'task'
        if (self.task is None) == (self.dataset is None):
            raise ValueError(
                "Pass --task (a registered task) or --dataset (your prompts, with --reward), one of them: got "
                f"--task {self.task!r} and --dataset {self.dataset!r}."
            )
        if self.dataset is not None:
            self._register_dataset()
        if not 0 <= self.max_unknown_share <= 1:
            raise ValueError(f"--max_unknown_share must be in [0, 1], got {self.max_unknown_share}.")
        ratio, loss = self.goal_acceptance_ratio, self.goal_max_quality_loss
        if (ratio is None) != (loss is None):
            raise ValueError(
                f"`goal_acceptance_ratio` is {ratio} and `goal_max_quality_loss` is {loss}: a goal needs both "
                "(e.g. 1.6 and 0.01), or neither."
            )
        if ratio is not None and not ratio > 0:
            raise ValueError(f"`goal_acceptance_ratio` is {ratio}; it must be > 0 (e.g. 1.6: 1.6x SD's acceptance).")
        if loss is not None and not 0 <= loss < 1:
            raise ValueError(f"`goal_max_quality_loss` is {loss}; it must be a fraction in [0, 1) (0.01: one point).")
        if self.dtype not in DTYPES:
            raise ValueError(f"`--dtype {self.dtype}`: the frozen models load in one of {', '.join(DTYPES)}.")
        for name in ("num_train_examples", "eval_num_examples"):
            value = getattr(self, name, None)
            if value is not None and value < (1 if name == "num_train_examples" else 0):
                least = "1" if name == "num_train_examples" else "0 (no held-out evaluation)"
                raise ValueError(f"`--{name} {value}`: it must be at least {least}, or unset for every prompt.")
        import diversed_hf.testbed  # noqa: F401 - registers the testbed's tasks, which the check looks up

        check_reward_mode(self.reward, self.task)

    def _register_dataset(self) -> None:
        """``--dataset``: register its task (diversed_hf.lab.tasks.user_task) and train on it."""
        from diversed_hf.lab.tasks.user_task import AGREEMENT_REWARDS, dataset_task

        if self.reward in ("task", "task_minus_target"):
            raise ValueError(
                f"`--reward {self.reward}` names a registered task's own reward; with --dataset pass one of "
                "exact_match, rouge2, rougeL, target_agreement, or package.module:function."
            )
        self.task = dataset_task(
            self.dataset,
            prompt_column=self.prompt_column,
            answer_column=self.answer_column,
            reward=self.reward,
            chat_template=self.chat_template,
        )
        if self.reward not in AGREEMENT_REWARDS:
            self.reward = "task"  # the dataset task's own reward is the one asked for


ScriptArguments._argument_group_name = "train_head.py options (what to train on)"  # HfArgumentParser's group title

DIVERSED_GROUP = "DIVERSED options (diversed_hf.training.DiversedConfig)"
DEFAULTS_GROUP = "GRPO/Trainer options whose default DIVERSED changes"
INHERITED_GROUP = "inherited GRPO/Trainer options (trl.GRPOConfig, transformers.TrainingArguments)"
USAGE = "%(prog)s [--config YAML] (--task TASK | --dataset DATA --reward REWARD) [--OPTION VALUE ...]"
DESCRIPTION = (
    "Train a DIVERSED head and save it as a Hub-ready repo. A YAML file given with --config supplies defaults (any "
    "option below, by its name) and command-line flags override it. An option shown as [BOOL] also takes a bare "
    "flag (true); --name_with_underscores may also be written --name-with-hyphens."
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Lists each option once, by its ``--name_with_underscores``, with its value's type (``INT``, ``BOOL``)
    and its default unless that is ``None``.

    HfArgumentParser also registers ``--name-with-hyphens`` for every multi-word field and names each
    value after the field (``--eval_seed EVAL_SEED``); argparse would print both spellings, each with that
    metavar, doubling the help of most options. Both spellings still parse.
    """

    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)

    def _get_help_string(self, action):
        if action.default is None:  # unset: the help says what that means; "(default: None)" only adds a line
            return action.help
        return super()._get_help_string(action)

    def _get_default_metavar_for_optional(self, action):
        name = getattr(action.type, "__name__", "value")  # TRL's parser wraps converters but keeps their names
        return "BOOL" if name == "string_to_bool" else name.upper()

    def _format_action_invocation(self, action):
        shown = copy.copy(action)
        shown.option_strings = [o for o in action.option_strings if "-" not in o.lstrip("-")] or action.option_strings
        return super()._format_action_invocation(shown)


def _config_groups() -> list[type]:
    """DiversedConfig's fields split into three dataclasses, one per ``--help`` group, in this order.

    HfArgumentParser groups arguments per dataclass (``_argument_group_name``), and DiversedConfig is one
    dataclass whose own fields would drown among GRPOConfig's hundreds. The fields declared in
    diversed_hf/training/config.py come first: new ones, then the GRPO/Trainer fields it gives other
    defaults; everything inherited comes after. :func:`parse_arguments` rebuilds one DiversedConfig
    from the three, so parsing and ``__post_init__`` checks are those of DiversedConfig itself.
    """
    hints = typing.get_type_hints(DiversedConfig)  # resolved types: HfArgumentParser reads them
    declared = set(vars(DiversedConfig).get("__annotations__", {}))  # in config.py, overrides included
    grpo = {f.name for f in dataclasses.fields(GRPOConfig)}
    members = {DIVERSED_GROUP: [], DEFAULTS_GROUP: [], INHERITED_GROUP: []}
    for f in dataclasses.fields(DiversedConfig):
        if not f.init:
            continue
        title = INHERITED_GROUP if f.name not in declared else DEFAULTS_GROUP if f.name in grpo else DIVERSED_GROUP
        same = field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)
        members[title].append((f.name, hints[f.name], same))
    groups = []
    for title, fields in members.items():
        group = dataclasses.make_dataclass(f"DiversedConfig_{len(groups)}", fields, kw_only=True)
        group._argument_group_name = title
        groups.append(group)
    return groups


def build_parser(full_help: bool = False) -> TrlParser:
    """The TrlParser of this script: ScriptArguments, then DiversedConfig's fields in :func:`_config_groups`.
    ``--help`` lists the inherited GRPO/Trainer options by count only (they still parse); ``--help-all`` lists them."""
    parser = TrlParser(
        (ScriptArguments, *_config_groups()), usage=USAGE, description=DESCRIPTION, formatter_class=HelpFormatter
    )
    parser.add_argument("--help-all", action="store_true", help="List every option, the inherited ones included.")
    if not full_help:
        for group in parser._action_groups:  # argparse's own groups: the one way to show a group's title alone
            if group.title == INHERITED_GROUP:
                group.description = (
                    f"{len(group._group_actions)} more options of trl.GRPOConfig and transformers.TrainingArguments "
                    "(--save_steps, --learning_rate's scheduler, --report_to, ...): `--help-all` lists them; any of "
                    "them may also go in the --config YAML."
                )
                for action in group._group_actions:
                    action.help = argparse.SUPPRESS
    return parser


def parse_arguments(argv=None) -> tuple[ScriptArguments, DiversedConfig]:
    """``--config`` YAML, then flags, into the script's arguments and one validated DiversedConfig."""
    if "--help-all" in (sys.argv[1:] if argv is None else argv):
        build_parser(full_help=True).print_help()
        raise SystemExit(0)
    script, *parts = build_parser().parse_args_and_config(args=argv)
    parts = [part for part in parts if dataclasses.is_dataclass(part)]  # not the namespace holding --help-all
    return script, DiversedConfig(**{k: v for part in parts for k, v in vars(part).items()})


def load_data(script: ScriptArguments, split: str, num_examples: int | None, seed: int, data_files):
    """The task's prompts through the registry, with the loader options the task takes."""
    from diversed_hf.cli.evaluation import load_task_data

    return load_task_data(
        script.task,
        split,
        num_examples,
        seed,
        num_shots=script.num_shots,
        data_files=data_files,
        shots_data_files=script.shots_data_files,
        max_source_words=script.max_source_words,
    )


class JsonlLogger:
    """A TrainerCallback writing every log dict as one JSON line."""

    def __init__(self, path: Path):
        from transformers import TrainerCallback

        self.path = path

        class _Callback(TrainerCallback):
            def on_log(inner, args, state, control, logs=None, **kwargs):  # noqa: N805
                if state.is_world_process_zero and logs:
                    with open(path, "a") as handle:
                        handle.write(json.dumps({"step": state.global_step, **logs}) + "\n")

        self.callback = _Callback()


def training_record(script: ScriptArguments, config: DiversedConfig, seconds: float, trainer) -> dict:
    keys = (
        "learning_rate",
        "num_train_epochs",
        "max_steps",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "num_generations",
        "num_iterations",
        "max_completion_length",
        "temperature",
        "top_k",
        "top_p",
        "epsilon",
        "beta",
        "kl_estimator",
        "lambda_acceptance",
        "use_group_baseline",
        "head_architecture",
        "head_w_0",
        "head_features",
        "head_use_hidden_states",
        "lr_scheduler_type",
        "warmup_steps",
        "seed",
    )
    values = {k: getattr(config, k) for k in keys}
    values["lr_scheduler_type"] = str(values["lr_scheduler_type"]).split(".")[-1].lower()
    values.update(
        algorithm="REINFORCE++ (group baseline, batch-whitened advantages, PPO clip) + lambda * sum_t (1 - w_t TV_t)",
        trainer="diversed_hf.training.DiversedTrainer (transformers.Trainer with GRPO's batching, trl.GRPOConfig)",
        task=script.task,
        reward=script.reward_source,
        **({"dataset": script.dataset} if script.dataset else {}),
        num_train_examples=script.num_train_examples,
        num_shots=script.num_shots,
        target_model=script.target_model,
        draft_model=script.draft_model,
        train_seconds=round(seconds, 1),
        calibration_logit_offset=script.calibration_logit_offset,
        **{
            key: getattr(script, key)
            for key in ("goal_acceptance_ratio", "goal_max_quality_loss")
            if getattr(script, key) is not None
        },
        global_steps=trainer.state.global_step,
        torch_threads=torch.get_num_threads(),
        task_card=task_card(script.task),  # what the head's card says of its task (diversed_hf.heads.cards)
    )
    hub_datasets = get_task(script.task).hub_datasets
    if hub_datasets:
        values["dataset"] = hub_datasets[0] if len(hub_datasets) == 1 else list(hub_datasets)
    return values


def with_target_answers(train, target, tokenizer, script: ScriptArguments, config: DiversedConfig, task: str):
    """``train`` with the target's greedy answers and their task reward as columns, for the rewards that compare
    with the target (docs/training.md, "Rewards for weak targets"); generated once, cached in the output directory."""
    completions = target_completions(
        target,
        tokenizer,
        list(train["prompt"]),
        max_new_tokens=config.max_completion_length,
        batch_size=script.eval_batch_size,
        cache=Path(config.output_dir) / "target_completions.json",
    )
    train = add_target_columns(train, task, completions)
    logger.info(
        "the target's greedy task reward on the training prompts: %.4f", sum(train["target_reward"]) / len(train)
    )
    return train


DTYPES = ("float32", "bfloat16", "float16")


def check_run_arguments(config: DiversedConfig) -> None:
    """Refuse what would silently train something else: a non-positive ``--max_steps`` other than the unset -1
    (transformers then trains ``num_train_epochs`` epochs), and a fresh run into an ``--output_dir`` that holds a run
    (its checkpoints, log and head would be mixed with this one's, and ``--save_total_limit`` could delete them)."""
    if config.max_steps == 0 or config.max_steps < -1:
        raise ValueError(
            f"`--max_steps {config.max_steps}`: transformers reads a non-positive value as 'train "
            f"{config.num_train_epochs:g} epochs instead'. Pass a positive number of steps, or leave it unset and set "
            "--num_train_epochs."
        )
    output_dir = Path(config.output_dir)
    if config.resume_from_checkpoint or not output_dir.is_dir():
        return
    held = sorted(p.name for p in output_dir.iterdir() if p.name.startswith("checkpoint-"))
    held += [name for name in ("train_log.jsonl", "head") if (output_dir / name).exists()]
    if held:
        raise ValueError(
            f"`--output_dir {output_dir}` holds a run ({', '.join(held[:4])}): a new run there would mix its "
            "checkpoints, log and head with that one's. Pass `--resume_from_checkpoint true` to continue it, or a new "
            "--output_dir."
        )


def run_training(trainer, config: DiversedConfig) -> float:
    """Train, from ``--resume_from_checkpoint`` when given (``true`` / ``last``: the last checkpoint in output_dir);
    the seconds it took."""
    began = time.perf_counter()
    resume = config.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "last"):
        resume = True  # the last checkpoint in output_dir
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - began
    logger.info("trained in %.0f s (%d steps)", seconds, trainer.state.global_step)
    return seconds


def held_out_results(script: ScriptArguments, config: DiversedConfig, target, draft, tokenizer, head) -> dict:
    """The trained head against target-only and lossless SD on the held-out prompts (model-card results format)."""
    from diversed_hf.cli.evaluation import evaluate

    held_out = load_data(script, script.eval_split, script.eval_num_examples, script.eval_seed, script.eval_data_files)
    references = list(held_out["reference"])
    if script.dataset and script.answer_column is None:  # no answers: quality is agreement with the target's own
        references = target_completions(
            target,
            tokenizer,
            list(held_out["prompt"]),
            max_new_tokens=script.eval_max_new_tokens,
            batch_size=script.eval_batch_size,
            cache=Path(config.output_dir) / "held_out_target_completions.json",
        )
    results = evaluate(
        script.task,
        target,
        draft,
        tokenizer,
        head,
        list(held_out["prompt"]),
        references,
        temperature=config.temperature,
        num_draft_tokens=config.num_draft_tokens,
        max_new_tokens=script.eval_max_new_tokens,
        batch_size=script.eval_batch_size,
        seed=script.eval_seed,
    )
    logger.info("held-out results:\n%s", json.dumps(results, indent=2))
    return results


def main(argv=None):
    script, config = parse_arguments(argv)
    destination = save_location(
        script.head_dir or os.path.join(config.output_dir, "head"), "--head_dir", config.output_dir
    )
    head_dir = destination.folder  # a folder of the testbed's assets is written in the run, then shipped there
    check_output_dir(config.output_dir, "--output_dir")  # before the models load, not after training
    check_output_dir(head_dir, "--head_dir")
    check_run_arguments(config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if script.threads:
        torch.set_num_threads(script.threads)
    from diversed_hf.cli.evaluation import (  # also registers the testbed's tasks
        check_known_tokens,
        load_models,
        silent_reward,
        unmeasured_quality,
    )

    spec = get_task(script.task)  # an unknown task fails here, before any model is loaded
    device = script.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target, draft, tokenizer = load_models(script.target_model, script.draft_model, script.dtype, device)
    train = load_data(script, script.train_split, script.num_train_examples, config.seed, script.train_data_files)
    where = f"`--dataset {script.dataset}`" if script.dataset else f"`--task {script.task}`"
    check_known_tokens(tokenizer, list(train["prompt"]), where, script.max_unknown_share)  # mostly <unk>: refused
    log_path = Path(config.output_dir) / "train_log.jsonl"
    head = DiversedHead.for_pair(
        target,
        draft,
        architecture=config.head_architecture,
        w_0=config.head_w_0,
        mlp_hidden_size=config.head_mlp_hidden_size,
        features=config.head_features,
        use_hidden_states=config.head_use_hidden_states,
        task=spec.name,
    )
    if script.reward in ("task_minus_target", "target_agreement"):  # the target's greedy answers, once
        train = with_target_answers(train, target, tokenizer, script, config, spec.name)
    if script.reward == "target_likelihood":
        reward_funcs = likelihood_reward(target, tokenizer, spec.name)
    else:
        reward_funcs = trl_reward(script.task) or dense_reward(script.task, script.reward)
    trainer = DiversedTrainer(
        target,
        draft,
        head=head,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[JsonlLogger(log_path).callback],
    )
    head_dir.mkdir(parents=True, exist_ok=True)  # fail now, not after training, if it cannot be created
    seconds = run_training(trainer, config)

    if not trainer.accelerator.is_main_process:  # under accelerate launch: one process evaluates and saves
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()  # destroys the process group: no abort at exit
        return trainer, None
    head = trainer.accelerator.unwrap_model(trainer.model).eval()
    if script.calibration_logit_offset:
        with torch.no_grad():
            head.net[-1].bias.add_(script.calibration_logit_offset)  # w = sigmoid(logit + offset)
    results = None
    warnings = [silent_reward(trainer.state.log_history)]
    if script.eval_num_examples:
        results = held_out_results(script, config, target, draft, tokenizer, head)
        warnings.append(unmeasured_quality(results))
    record = training_record(script, config, seconds, trainer)
    record["warnings"] = [warning for warning in warnings if warning]  # the card shows them above its results
    for warning in record["warnings"]:
        logger.warning("THIS RUN: %s", warning)
    with torch.random.fork_rng(devices=[]):
        head.save_pretrained(str(head_dir), results=results, training_config=record)
    if log_path.is_file():  # the head travels with its training curve
        shutil.copyfile(log_path, head_dir / log_path.name)
    logger.info("saved the head to %s", head_dir)
    destination.finish()  # the main process only: the others returned above
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # destroys the process group: no abort at exit
    return trainer, results


if __name__ == "__main__":
    sys.exit(run_script(main))
