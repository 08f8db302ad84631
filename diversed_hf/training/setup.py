"""What :class:`~.trainer.DiversedTrainer` checks and builds from its arguments before ``Trainer`` starts: the head,
the EOS ids, the reward functions and their weights, the datasets. Each error names the argument and the fix."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..common.pairs import check_head_matches
from ..heads.head import DiversedHead
from ..verifiers.checks import check_columns
from .batches import callable_name
from .config import DiversedConfig
from .rollout import check_trainable_mixing

__all__ = ["check_datasets", "checked_head", "checked_rewards", "eos_token_ids", "named_datasets"]


def checked_head(head: DiversedHead | None, target: nn.Module, draft: nn.Module, args: DiversedConfig) -> DiversedHead:
    """``head`` (or a fresh one built from ``args.head_*``) checked against the pair, in float32."""
    if head is None:
        head = DiversedHead.for_pair(
            target,
            draft,
            architecture=args.head_architecture,
            w_0=args.head_w_0,
            mlp_hidden_size=args.head_mlp_hidden_size,
            features=args.head_features,
            use_hidden_states=args.head_use_hidden_states,
        )
    if not isinstance(head, DiversedHead):
        raise TypeError(
            f"`head` must be a DiversedHead, got {type(head).__name__}. Pass `DiversedHead.for_pair(target, draft)`, "
            "or None to let the trainer build one from `args`."
        )
    check_head_matches(head, target, draft)
    check_trainable_mixing(head)
    return head.float()


def eos_token_ids(target: nn.Module, tokenizer) -> list[int]:
    """The ids that end a completion: the target's generation config's and the tokenizer's EOS. A tokenizer without a
    pad token gets its EOS as one (rollouts are left-padded)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = target.generation_config.eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos = [tokenizer.eos_token_id, *eos]
    return eos


def checked_rewards(reward_funcs, args: DiversedConfig) -> tuple[list, list[str], torch.Tensor]:
    """``(functions, names, weights)``: one or more callables, their names, one weight each (``args.reward_weights``,
    default 1)."""
    if reward_funcs is None:
        raise ValueError(
            "`reward_funcs` is required. For acceptance-only training pass a zero reward: "
            "`reward_funcs=lambda completions, **kwargs: [0.0] * len(completions)`."
        )
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    for func in funcs:
        if not callable(func) or isinstance(func, (str, nn.Module)):
            raise TypeError(
                f"reward functions must be Python callables returning one float per completion, got {func!r}."
            )
    if args.reward_weights is not None and len(args.reward_weights) != len(funcs):
        raise ValueError(
            f"`reward_weights` has {len(args.reward_weights)} entries ({args.reward_weights}) for {len(funcs)} reward "
            "functions; give one weight per function, in the same order."
        )
    weights = torch.tensor(args.reward_weights or [1.0] * len(funcs), dtype=torch.float32)
    return funcs, [callable_name(func) for func in funcs], weights


def named_datasets(dataset) -> list[tuple[str, Any]]:
    """``[(argument name, dataset)]`` of an eval dataset: none, one, or a dict of named ones."""
    if dataset is None:
        return []
    if isinstance(dataset, dict):
        return [(f"eval_dataset[{name!r}]", value) for name, value in dataset.items()]
    return [("eval_dataset", dataset)]


def check_datasets(train_dataset, eval_dataset, args: DiversedConfig) -> int:
    """Check the datasets (a ``prompt`` column, a length, enough prompts for one rollout batch, no empty eval set);
    returns the number of training rows."""
    if train_dataset is None:
        raise ValueError("`train_dataset` is required: a datasets.Dataset with a 'prompt' column.")
    check_columns(train_dataset, ["prompt"], "`train_dataset`")
    for name, dataset in [("train_dataset", train_dataset), *named_datasets(eval_dataset)]:
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                f"`{name}` is a {type(dataset).__name__} without a length (an iterable dataset); prompts are drawn in "
                "seeded groups of `num_generations` by index. Pass a map-style datasets.Dataset (for a streamed one, "
                "`Dataset.from_list(list(dataset.take(n)))`)."
            )
    train_rows = len(train_dataset)
    prompts_per_batch = args.generation_batch_size // args.num_generations
    if train_rows < prompts_per_batch:
        raise ValueError(
            f"`train_dataset` has {train_rows} rows, but one rollout batch takes {prompts_per_batch} prompts "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}): GRPO's "
            f"sampler would yield no batch, and the run would train 0 of its steps. Give at least {prompts_per_batch} "
            "prompts, or lower `per_device_train_batch_size` / `steps_per_generation`."
        )
    for where, dataset in named_datasets(eval_dataset):
        check_columns(dataset, ["prompt"], f"`{where}`")
        if len(dataset) == 0:
            raise ValueError(f"`{where}` has no rows: evaluation would measure nothing. Give it prompts, or pass None.")
    return train_rows
