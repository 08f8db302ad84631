"""Scoring rollouts with TRL-style reward functions: what a reward may be, and the checks that refuse the rest.

A reward function is called as in TRL's ``GRPOTrainer``,
``f(prompts=..., completions=..., completion_ids=..., **dataset_columns, trainer_state=...)``, and returns
one value per completion, in order. A value is

* a real number: ``int``, ``float``, ``bool`` (``True`` = 1), a NumPy scalar or 0-d array, a 0-d tensor;
* ``None``: this function does not score this completion (TRL's convention, e.g. a function for one task of a
  mixed dataset): the weighted sum over functions leaves it out, as TRL's ``nansum`` does. A completion that
  *no* function scores is an error here (TRL warns and gives it no advantage; REINFORCE++'s baseline and
  whitening have no place for it).

Anything else is refused with the function, the completion and the value named: a string (``"42"`` is not
42), a container, a complex number, NaN (return ``None`` for "not scored"), an infinity, or a number beyond
float32's range, where the advantages are computed.

As in TRL, a reward function also receives ``log_metric(name, value)`` and ``log_extra(column, values)`` (see
:mod:`.logs`), and may be ``async`` (an ``async def`` function, a ``functools.partial`` of one, or an object with
an ``async def __call__``): the synchronous functions run first, in order, then the async ones concurrently, on one
event loop kept in a daemon thread for the whole run (so clients an async function opens may be reused, and a
caller already inside an event loop, a notebook say, is not disturbed).

TRL's reward computation itself (``GRPOTrainer``'s) is a private method of a trainer this package does not run
(docs/architecture.md, "Why DiversedTrainer is a transformers Trainer"); this module follows its calling convention.
Reward *models* (a model id or an ``nn.Module``) are not supported: wrap one in a function.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import threading
from typing import Callable, Sequence

import numpy as np
import torch

__all__ = [
    "FLOAT32_LIMIT",
    "RewardTypeError",
    "is_async_reward",
    "reward_value",
    "score_completions",
    "weighted_rewards",
]


class RewardTypeError(TypeError, ValueError):
    """A reward function returned something of the wrong type (a string, a container): a ``TypeError``, and a bad
    value from the user's code, so a command ends it as it ends a NaN reward (one line, exit status 2)."""


# Advantages are whitened in float32: squares of rewards must stay finite there.
FLOAT32_LIMIT = float(torch.finfo(torch.float32).max) ** 0.5 / 1e3


def reward_value(value, name: str, index: int, completion: str) -> float | None:
    """``value`` (one reward of function ``name`` for completion ``index``) as a float, or None for "not scored"."""
    where = f"The reward function {name!r} returned {value!r} for completion {index} ({completion[:80]!r})"
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        real = value.ndim == 0 and not value.is_complex()
    elif isinstance(value, (np.ndarray, np.generic)):
        real = value.ndim == 0 and value.dtype.kind in "biuf"
    else:
        real = isinstance(value, numbers.Real)
    if not real:
        raise RewardTypeError(
            f"{where}, of type {type(value).__name__}: a reward must be a real number (int, float, bool, a NumPy "
            "scalar or a 0-d tensor), or None for a completion the function does not score. Return numbers, not "
            "strings or containers."
        )
    number = float(value)
    if math.isnan(number):
        raise ValueError(
            f"{where}: rewards must be finite floats. Return None for a completion the function does not score, "
            "and give failed or unscorable completions a low reward."
        )
    if not abs(number) <= FLOAT32_LIMIT:
        raise ValueError(
            f"{where}: beyond float32's range (|r| <= {FLOAT32_LIMIT:.3g}), where the advantages are computed; rewards "
            "must be finite floats. Scale the reward down (rewards in [0, 1] or a few units work best)."
        )
    return number


def is_async_reward(func: Callable) -> bool:
    """Whether calling ``func`` returns a coroutine: an ``async def`` function (through ``functools.partial``) or an
    object whose ``__call__`` is ``async def``."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


_event_loop: asyncio.AbstractEventLoop | None = None
_event_loop_lock = threading.Lock()


def reward_event_loop() -> asyncio.AbstractEventLoop:
    """The event loop async reward functions run on: started once, in a daemon thread, on first use."""
    global _event_loop
    with _event_loop_lock:
        if _event_loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                ready.set()
                loop.run_forever()

            threading.Thread(target=run, name="diversed-hf-rewards", daemon=True).start()
            ready.wait()
            _event_loop = loop
    return _event_loop


def score_completions(
    reward_funcs: Sequence[Callable],
    names: Sequence[str],
    inputs: list[dict],
    prompts: list,
    completions: list[str],
    completion_ids: list[list[int]],
    trainer_state,
    *,
    log_metric: Callable[[str, float], None] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
) -> torch.Tensor:  # (B, num_funcs), NaN where a function returned None
    """Call every reward function on the batch and check what it returns (see the module docstring)."""
    columns = {key: [row[key] for row in inputs] for key in inputs[0] if key not in ("prompt", "completion")}
    columns["trainer_state"] = trainer_state
    if log_metric is not None:
        columns["log_metric"] = log_metric
    if log_extra is not None:
        columns["log_extra"] = log_extra
    kwargs = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    outputs = {i: func(**kwargs) for i, func in enumerate(reward_funcs) if not is_async_reward(func)}
    waiting = {i: func for i, func in enumerate(reward_funcs) if is_async_reward(func)}
    if waiting:

        async def run_all() -> list:
            return await asyncio.gather(*(func(**kwargs) for func in waiting.values()))

        results = asyncio.run_coroutine_threadsafe(run_all(), reward_event_loop()).result()
        outputs.update(zip(waiting, results))
    rewards = torch.full((len(prompts), len(reward_funcs)), math.nan)  # (B, F)
    for i, name in enumerate(names):
        values = outputs[i]
        try:
            got = len(values) if not isinstance(values, (str, bytes, dict)) else None
        except TypeError:
            got = None
        if got is None:  # iterating a dict would score its keys, a string its characters
            raise RewardTypeError(
                f"The reward function {name!r} returned a {type(values).__name__} ({str(values)[:80]!r}); it must "
                f"return a list of {len(prompts)} floats, one per completion, in order."
            )
        if got != len(prompts):
            raise ValueError(
                f"The reward function {name!r} returned {got} rewards for {len(prompts)} completions; it must return "
                "one float per completion, in order."
            )
        for j, value in enumerate(values):
            number = reward_value(value, name, j, completions[j])
            if number is not None:
                rewards[j, i] = number
    unscored = torch.isnan(rewards).all(dim=1).nonzero()[:, 0].tolist()
    if unscored:
        j = unscored[0]
        raise ValueError(
            f"No reward function scored completion {j} ({completions[j][:80]!r}): every one returned None "
            f"({list(names)}), and {len(unscored)} completion(s) of this batch are in that case; rewards must be "
            "finite floats. Make at least one function score every completion (give failed or unscorable ones a low "
            "reward)."
        )
    return rewards


def weighted_rewards(
    rewards_per_func: torch.Tensor,  # (B, F), NaN where not scored
    weights: torch.Tensor,  # (F,)
) -> torch.Tensor:  # (B,)
    """``sum_f weight_f r_f`` over the functions that scored each completion (TRL's ``nansum``)."""
    return (rewards_per_func * weights[None].to(rewards_per_func.device)).nansum(dim=1)
