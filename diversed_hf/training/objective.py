"""The head's training objective (docs/method.md §5) as small pure tensor functions.

Maximised over the head parameters theta:

    J(theta) = E_{x ~ nu_theta}[R(x)] + lambda E[sum_t (1 - TV(q_t, nu_theta,t))],
    1 - TV(q_t, nu_t) = 1 - w_t TV(p_t, q_t)        (the expected acceptance of position t).

* Reward term: REINFORCE++ (Hu, 2025). No critic. The return of token t is the sequence reward
  (minus the mean reward of the ``G`` samples of the same prompt with ``use_group_baseline``,
  "REINFORCE++-baseline"; minus ``kl_coef * sum_{s >= t} k1_s`` when the KL is folded into the
  reward), then whitened by the mean and standard deviation over **all valid tokens of the whole
  batch**. The policy-gradient loss is PPO's clipped surrogate
  ``-min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)``, ``r_t = nu_theta(x_t) / nu_old(x_t)``.
  (GRPO's ``scale_rewards="batch"`` differs: it keeps the group mean and divides by the std of
  the raw rewards, per sequence.)
* Acceptance term: enters the loss pathwise, ``-lambda sum_t (1 - w_t TV_t)``, with a *positive*
  lambda. (The official trainer multiplies it by a negative factor, which lowers acceptance.)
* Optional KL to the initial head: ``k1 = log nu_old - log nu_ref`` folded into the return, or
  ``k3 = exp(log nu_ref - log nu) - (log nu_ref - log nu) - 1`` as a loss (Schulman's estimators).

All per-token tensors are ``(batch, T)`` with a 0/1 ``mask`` of valid completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "group_baseline",
    "whiten",
    "reinforce_pp_advantages",
    "clipped_policy_loss",
    "expected_acceptance",
    "kl_k1",
    "kl_k3",
    "masked_mean",
]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B, T), (B, T) -> ()
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def group_baseline(rewards: torch.Tensor, group_size: int) -> torch.Tensor:  # (B,) -> (B,)
    """``r_i - mean_{j in group(i)} r_j``; rows ``[k G, (k + 1) G)`` are the ``G`` samples of one prompt."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of {group_size}.")
    grouped = rewards.view(-1, group_size)  # (B / G, G)
    return (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)


def whiten(
    values: torch.Tensor,  # (B, T)
    mask: torch.Tensor,  # (B, T)
    eps: float = 1e-8,
    *,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:  # (B, T)
    """``(x - mean) / (std + eps)`` over the valid tokens (population std); 0 on invalid tokens.

    ``reduce_sum`` sums a tensor over the processes that hold the rest of the batch (``accelerator.reduce(t, "sum")``);
    the mean and the variance are then the whole batch's, computed the same way as in one process (float32, the
    variance as the mean of squared deviations from the global mean).
    """
    reduce_sum = reduce_sum or (lambda tensor: tensor)
    values, mask = values.to(torch.float32), mask.to(torch.float32)
    count, total = reduce_sum(torch.stack([mask.sum(), (values * mask).sum()]))
    count = count.clamp(min=1)
    mean = total / count
    var = reduce_sum(((values - mean) ** 2 * mask).sum()) / count
    return (values - mean) / (var.sqrt() + eps) * mask


def reverse_cumsum(values: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T): out_t = sum_{s >= t} x_s
    return values.flip(-1).cumsum(-1).flip(-1)


def reinforce_pp_advantages(
    rewards: torch.Tensor,  # (B,) sequence rewards of this process's rows
    mask: torch.Tensor,  # (B, T)
    *,
    group_size: int = 1,
    use_group_baseline: bool = False,
    token_kl: torch.Tensor | None = None,  # (B, T) k1 per token
    kl_coef: float = 0.0,
    eps: float = 1e-8,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rank: int = 0,
) -> torch.Tensor:  # (B, T)
    """REINFORCE++ advantages: (baselined) sequence reward minus the KL-to-go, whitened over the batch's valid
    tokens.

    In one process the batch is ``rewards``. Over several, each holds ``B`` rows of it: ``gather`` concatenates a
    tensor over the processes in rank order (``accelerator.gather``; a group baseline needs every reward of a group,
    and groups may span processes), ``reduce_sum`` sums one (whitening needs the batch's moments) and ``rank`` is
    this process's index. One process and several give the same advantages on the same batch.
    """
    rewards = rewards.to(torch.float32)
    if use_group_baseline:
        every = rewards if gather is None else gather(rewards)  # (processes * B,)
        start = rank * rewards.numel()
        rewards = group_baseline(every, group_size)[start : start + rewards.numel()]
    mask = mask.to(torch.float32)
    returns = rewards[:, None] * mask  # (B, T)
    if token_kl is not None and kl_coef:
        returns = returns - kl_coef * reverse_cumsum(token_kl.to(torch.float32) * mask)
    return whiten(returns, mask, eps, reduce_sum=reduce_sum)


def clipped_policy_loss(
    logprobs: torch.Tensor,  # (B, T) log nu_theta(x_t)
    old_logprobs: torch.Tensor,  # (B, T) log nu_old(x_t), from the rollout
    advantages: torch.Tensor,  # (B, T)
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T) loss, (B, T) bool clipped
    """PPO's clipped surrogate, per token: ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``.

    ``clipped`` marks tokens whose gradient the clip removed (the clipped branch is strictly smaller).
    """
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    ratio = (logprobs - old_logprobs).exp()  # (B, T)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def expected_acceptance(
    target_weight: torch.Tensor,  # (B, T)
    total_variation: torch.Tensor,  # (B, T) TV(p_t, q_t)
) -> torch.Tensor:  # (B, T)
    """Expected acceptance of each position, ``beta_t = 1 - TV(q_t, nu_t) = 1 - w_t TV(p_t, q_t)`` (docs/method.md
    §2)."""
    return 1.0 - target_weight * total_variation.to(target_weight.dtype)


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:  # (B, T)
    """k1 = log nu(x) - log nu_ref(x), unbiased for KL(nu || nu_ref) when x ~ nu."""
    return logprobs - ref_logprobs


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:  # (B, T)
    """k3 = exp(d) - d - 1 with d = log nu_ref(x) - log nu(x): unbiased, non-negative, low variance."""
    delta = ref_logprobs - logprobs
    return delta.exp() - delta - 1.0
