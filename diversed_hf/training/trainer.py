"""``DiversedTrainer``: trains a DIVERSED head with REINFORCE++ and the acceptance regulariser (docs/method.md §5).

Why a ``GRPOTrainer`` subclass. GRPO is TRL's trainer for exactly this loop -- sample ``G``
completions per prompt, score them with reward functions, reuse one rollout batch for
``num_iterations`` clipped-ratio updates -- and its machinery carries over unchanged: the
``RepeatSampler`` that groups the ``G`` samples of a prompt (also across processes), the
rollout buffer that splits one generation batch over ``steps_per_generation`` optimizer steps and
reuses it for the inner epochs, the metric averaging in ``log``, the reward-function convention
(``f(prompts, completions, completion_ids, **columns)``) and the config. What differs is the
policy: not one causal LM but the mixture ``nu_theta = w_theta p + (1 - w_theta) q`` over a frozen
target and a frozen draft, where only the head trains. So this class does not run
``GRPOTrainer.__init__`` (which builds a trainable causal LM, a reference model, fused LM heads and
generation backends for it; :mod:`diversed_hf.compat` says precisely why neither it nor TRL's base
constructor applies): :func:`diversed_hf.compat.init_grpo_trainer` initialises ``transformers.Trainer``
with the **head** as the model and sets the state GRPO's reused methods read. The three places where
the policy appears are public methods here, which :class:`diversed_hf.compat.GRPOHooks` plugs into
GRPO's hooks: :meth:`generate_and_score` (rollouts from ``nu_theta``, see :mod:`diversed_hf.rollout`),
:meth:`compute_head_loss` (REINFORCE++ plus the acceptance term, see :mod:`.objective`) and
checkpointing (head-only, pair-checked). Every TRL / transformers private this needs is touched in
:mod:`diversed_hf.compat` only. RLOO's trainer shares GRPO's structure but bakes in its leave-one-out
baseline; GRPO's is the more general base.

Because both models are frozen, a rollout fixes ``p_t(x_t)``, ``q_t(x_t)``, ``TV(p_t, q_t)``,
both hidden states and the head's distribution features; the loss recomputes only
``w_t = head(h^q_t, h^p_t, f_t)``, so inner epochs cost a head forward, not a model forward.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase
from trl import GRPOTrainer
from trl.trainer.utils import get_callable_name

from .. import compat
from ..head import DiversedHead
from ..pairs import check_head_matches, verification_vocab_size
from ..rollout import mixture_logprobs, sample_from_mixture
from ..tasks import check_columns
from . import objective, scoring
from .checkpoint import (
    PAIR_FILE,
    REF_HEAD_DIR,
    RUN_FILE,
    TRAINER_EXTRA_STATE,
    check_pair,
    check_run,
    load_head_state,
    missing_checkpoint_files,
    newest_own_checkpoint,
    pair_record,
    read_run,
    run_record,
    save_head,
)
from .config import DiversedConfig

logger = logging.getLogger(__name__)


RewardFunc = Callable[..., list]


def _check_writable(directory: str) -> None:
    """Fail before training when ``directory`` cannot be created or written."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test_"):
            pass
    except OSError as error:
        raise ValueError(
            f"`output_dir` {directory!r} is not writable ({error.strerror or error}); checkpoints and the trained head go "
            "there. Pass a directory you can write to."
        ) from error


def _extra_state_path(checkpoint_dir: str, process_index: int) -> str:
    """Process 0's loop state is ``TRAINER_EXTRA_STATE``; process ``i > 0`` of several writes its own file."""
    if process_index == 0:
        return os.path.join(checkpoint_dir, TRAINER_EXTRA_STATE)
    stem, suffix = os.path.splitext(TRAINER_EXTRA_STATE)
    return os.path.join(checkpoint_dir, f"{stem}_{process_index}{suffix}")


class DiversedTrainer(compat.GRPOHooks, GRPOTrainer):
    """Train a :class:`~diversed_hf.DiversedHead` for a frozen (target, draft) pair.

    Args:
        target, draft: the two causal LMs (frozen here: ``requires_grad_(False)``, eval mode).
        head: the head to train; default a fresh ``DiversedHead.for_pair`` built from
            ``args.head_architecture`` / ``args.head_w_0`` / ``args.head_features`` / ``args.head_use_hidden_states``.
        reward_funcs: one or more TRL-style reward functions
            ``f(prompts=..., completions=..., completion_ids=..., **dataset_columns) -> list[float]``
            (e.g. :func:`diversed_hf.tasks.reward_for_task`; what a reward may be: :mod:`.scoring`). Pass
            ``lambda completions, **_: [0.0] * len(completions)`` to train on acceptance alone.
        args: a :class:`DiversedConfig`.
        train_dataset / eval_dataset: ``datasets.Dataset`` with a ``prompt`` column (plain text or
            chat messages) and whatever columns the reward functions read.
        processing_class: the tokenizer shared by both models.

    Logged metrics (train and eval): ``reward`` (and per function), ``mean_w``, ``acceptance_proxy``
    (mean ``1 - w_t TV_t`` over rollout tokens: the expected acceptance rate of speculative decoding
    with this head), ``acceptance_exact_sd`` (mean ``1 - TV_t``: that of lossless SD on the same
    tokens), ``kl`` (k3 estimate of KL to the initial head), ``clip_fraction``, completion lengths. TRL's
    ``GRPOTrainer.log`` averages and reports them (``eval_``-prefixed in evaluation).
    """

    loss_is_scaled_for_ga = False  # compute_loss returns a per-micro-batch mean; Trainer divides by GA steps

    def __init__(
        self,
        target: nn.Module,
        draft: nn.Module,
        head: DiversedHead | None = None,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: DiversedConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks=None,
        optimizers=(None, None),
    ):
        if args is None:
            args = DiversedConfig(output_dir="diversed-head")
        if not isinstance(args, DiversedConfig):
            raise TypeError(
                f"`args` must be a DiversedConfig, got {type(args).__name__}. Build it with "
                "`diversed_hf.training.DiversedConfig(output_dir=...)` (it takes every GRPOConfig field)."
            )
        _check_writable(args.output_dir)

        # Models and head ------------------------------------------------------------------------
        self.vocab_size = verification_vocab_size(target, draft)  # raises on a vocabulary mismatch
        for model in (target, draft):
            model.requires_grad_(False)
            model.eval()
        self.target, self.draft = target, draft
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
        if head.config.mixing != "probs":
            raise ValueError(
                "Training supports only heads with `mixing='probs'` (the paper's mixture); the logit-space pool of the "
                "official code has no closed-form acceptance. Build the head with `mixing='probs'`."
            )
        head.float()
        self.ref_head = copy.deepcopy(head).requires_grad_(False).eval()  # the initial head, for the KL
        self.pair = pair_record(target, draft, self.vocab_size)

        # Tokenizer -------------------------------------------------------------------------------
        if processing_class is None:
            raise ValueError("`processing_class` (the tokenizer shared by the target and the draft) is required.")
        self.tokenizer = processing_class
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        eos = target.generation_config.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos = [self.tokenizer.eos_token_id, *eos]
        self.eos_token_ids = eos

        # Rewards ---------------------------------------------------------------------------------
        if reward_funcs is None:
            raise ValueError(
                "`reward_funcs` is required. For acceptance-only training pass a zero reward: "
                "`reward_funcs=lambda completions, **kwargs: [0.0] * len(completions)`."
            )
        self.reward_funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        for func in self.reward_funcs:
            if not callable(func) or isinstance(func, (str, nn.Module)):
                raise TypeError(
                    f"reward functions must be Python callables returning one float per completion, got {func!r}."
                )
        self.reward_func_names = [get_callable_name(f) for f in self.reward_funcs]
        if args.reward_weights is not None and len(args.reward_weights) != len(self.reward_funcs):
            raise ValueError(
                f"`reward_weights` has {len(args.reward_weights)} entries ({args.reward_weights}) for "
                f"{len(self.reward_funcs)} reward functions; give one weight per function, in the same order."
            )
        self.reward_weights = torch.tensor(args.reward_weights or [1.0] * len(self.reward_funcs), dtype=torch.float32)

        # Data ------------------------------------------------------------------------------------
        if train_dataset is None:
            raise ValueError("`train_dataset` is required: a datasets.Dataset with a 'prompt' column.")
        check_columns(train_dataset, ["prompt"], "`train_dataset`")
        train_rows = len(train_dataset) if hasattr(train_dataset, "__len__") else None
        prompts_per_batch = args.generation_batch_size // args.num_generations
        if train_rows is not None and train_rows < prompts_per_batch:
            raise ValueError(
                f"`train_dataset` has {train_rows} rows, but one rollout batch takes {prompts_per_batch} prompts "
                f"(generation_batch_size {args.generation_batch_size} / num_generations {args.num_generations}): GRPO's "
                f"sampler would yield no batch, and the run would train 0 of its steps. Give at least {prompts_per_batch} "
                "prompts, or lower `per_device_train_batch_size` / `steps_per_generation`."
            )
        if eval_dataset is not None:
            for name, dataset in (eval_dataset.items() if isinstance(eval_dataset, dict) else [("", eval_dataset)]):
                where = f"`eval_dataset`{'[' + repr(name) + ']' if name else ''}"
                check_columns(dataset, ["prompt"], where)
                if hasattr(dataset, "__len__") and len(dataset) == 0:
                    raise ValueError(f"{where} has no rows: evaluation would measure nothing. Give it prompts, or pass None.")

        # Rollout and loss settings (GRPO's public names) ---------------------------------------------
        self.max_completion_length = args.max_completion_length
        self.temperature, self.top_k, self.top_p = args.temperature, args.top_k, args.top_p
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.beta = args.beta
        self.total_train_tokens = 0  # completion tokens trained on so far (the `num_tokens` metric)

        compat.init_grpo_trainer(
            self,
            model=head,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self.ref_head.to(self.accelerator.device)
        self.run = run_record(args, self.pair, head.config.to_dict(), self.reward_func_names, train_rows)
        seed = args.seed + self.accelerator.process_index
        self._rollout_generator = torch.Generator(device=self._model_device(target)).manual_seed(seed)

    @staticmethod
    def _model_device(model: nn.Module) -> torch.device:
        return next(model.parameters()).device

    # ---------------------------------------------------------------------------------------------
    # Rollouts and rewards

    def _prompt_texts(self, prompts: list) -> tuple[list[str], bool]:
        if all(isinstance(p, str) for p in prompts):
            return prompts, True
        if all(isinstance(p, list) for p in prompts):
            texts = [self.tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
            return texts, False
        kinds = sorted({type(p).__name__ for p in prompts})
        raise TypeError(
            f"every `prompt` must be a string, or a list of chat messages ({{'role': ..., 'content': ...}}); this batch "
            f"has prompts of types {kinds}. Make the dataset's 'prompt' column all text or all conversations."
        )

    def _global_advantages(self, rewards: torch.Tensor, mask: torch.Tensor, token_kl: torch.Tensor | None):
        """REINFORCE++ advantages whitened over the whole batch: every process's rollouts, not just this one's."""
        if self.accelerator.num_processes == 1:
            return objective.reinforce_pp_advantages(
                rewards, mask, group_size=self.num_generations_for_mode, use_group_baseline=self.args.use_group_baseline,
                token_kl=token_kl, kl_coef=self.beta if self.args.kl_estimator == "k1" else 0.0,
            )  # fmt: skip
        # Group baselines need all rewards of a group (groups may span processes); whitening needs global moments.
        all_rewards = self.accelerator.gather(rewards)
        if self.args.use_group_baseline:
            all_rewards = objective.group_baseline(all_rewards, self.num_generations_for_mode)
        start = self.accelerator.process_index * rewards.numel()
        returns = all_rewards[start : start + rewards.numel()][:, None] * mask
        if token_kl is not None and self.args.kl_estimator == "k1" and self.beta:
            returns = returns - self.beta * objective.reverse_cumsum(token_kl * mask)
        moments = torch.stack([mask.sum(), (returns * mask).sum(), (returns**2 * mask).sum()])
        count, total, squares = self.accelerator.reduce(moments, reduction="sum")
        mean = total / count.clamp(min=1)
        std = (squares / count.clamp(min=1) - mean**2).clamp(min=0).sqrt()
        return (returns - mean) / (std + 1e-8) * mask

    @property
    def num_generations_for_mode(self) -> int:
        return self.num_generations if self.model.training else self.num_generations_eval

    def generate_and_score(self, inputs: list[dict]) -> dict[str, torch.Tensor]:
        """Sample completions of ``inputs`` (dataset rows) from ``nu_theta``, score them, and return the rollout batch.

        The batch holds what :meth:`compute_head_loss` needs, per token: mask, ``p_t(x_t)``, ``q_t(x_t)``, TV, both
        hidden states, old / reference log-probabilities and REINFORCE++ advantages. GRPO's ``_prepare_inputs``
        buffers it and splits it over ``steps_per_generation`` micro-steps.
        """
        mode = "train" if self.model.training else "eval"
        prompts = [row["prompt"] for row in inputs]
        texts, plain = self._prompt_texts(prompts)
        device = self._model_device(self.target)
        encoded = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=plain
        )
        head = self.accelerator.unwrap_model(self.model)
        was_training = head.training
        head.eval()
        rollout = sample_from_mixture(
            self.target,
            self.draft,
            head,
            encoded["input_ids"].to(device),
            encoded["attention_mask"].to(device),
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            vocab_size=self.vocab_size,
            generator=self._rollout_generator,
        )
        head.train(was_training)

        head_device = self.accelerator.device
        mask = rollout.completion_mask.to(head_device).float()  # (B, T)
        lengths = rollout.completion_mask.sum(dim=1).tolist()
        completion_ids = [row[:n].tolist() for row, n in zip(rollout.completion_ids, lengths)]
        completions = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        rewards_per_func = scoring.score_completions(
            self.reward_funcs, self.reward_func_names, inputs, prompts, completions, completion_ids, self.state
        )  # (B, F), NaN where a function did not score a completion
        rewards = scoring.weighted_rewards(rewards_per_func, self.reward_weights).to(head_device)  # (B,)

        target_token_probs = rollout.target_token_probs.to(head_device)
        draft_token_probs = rollout.draft_token_probs.to(head_device)
        old_logprobs = rollout.logprobs.to(head_device)
        # The head trains in float32, whatever dtype the models run in (bfloat16, float64).
        draft_hidden = rollout.draft_hidden.to(head_device, torch.float32)  # (B, T, d_draft)
        target_hidden = rollout.target_hidden.to(head_device, torch.float32)  # (B, T, d_target)
        features = rollout.features.to(head_device, torch.float32)  # (B, T, F): the head's inputs as generation computes them
        with torch.no_grad():
            ref_w = self.ref_head(draft_hidden, target_hidden, features)  # (B, T)
            ref_logprobs = mixture_logprobs(ref_w, target_token_probs, draft_token_probs)  # (B, T)
        token_kl = objective.kl_k1(old_logprobs, ref_logprobs) if self.beta else None
        advantages = self._global_advantages(rewards, mask, token_kl)  # (B, T)

        # Metrics ---------------------------------------------------------------------------------
        w = rollout.target_weight.to(head_device)
        tv = rollout.total_variation.to(head_device)
        metrics = compat.grpo_metrics(self, mode)
        gathered = self.accelerator.gather(rewards_per_func.to(head_device))
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(gathered[:, i].nanmean().item())  # over the completions it scored
        all_rewards = self.accelerator.gather(rewards)
        metrics["reward"].append(all_rewards.mean().item())
        metrics["reward_std"].append(all_rewards.std().item() if all_rewards.numel() > 1 else 0.0)
        sums = self.accelerator.reduce(
            torch.stack([mask.sum(), (w * mask).sum(), (objective.expected_acceptance(w, tv) * mask).sum(), ((1 - tv) * mask).sum()]),
            reduction="sum",
        )
        count = sums[0].clamp(min=1)
        metrics["mean_w"].append((sums[1] / count).item())
        metrics["acceptance_proxy"].append((sums[2] / count).item())
        metrics["acceptance_exact_sd"].append((sums[3] / count).item())
        all_lengths = self.accelerator.gather(mask.sum(dim=1))
        metrics["completions/mean_length"].append(all_lengths.mean().item())
        ended = torch.tensor([any(t in self.eos_token_ids for t in ids) for ids in completion_ids], device=head_device)
        metrics["completions/clipped_ratio"].append(1.0 - self.accelerator.gather(ended.float()).mean().item())
        if mode == "train":
            self.total_train_tokens += int(self.accelerator.gather(mask.sum()).sum().item())
            metrics["num_tokens"] = [self.total_train_tokens]
        compat.record_completions(
            self,
            texts,
            completions,
            {name: rewards_per_func[:, i].tolist() for i, name in enumerate(self.reward_func_names)},
            advantages[:, 0].tolist(),  # a sequence's advantage (its first token's; constant along it without k1)
        )

        return {
            "completion_mask": mask,
            "target_token_probs": target_token_probs,
            "draft_token_probs": draft_token_probs,
            "total_variation": tv,
            "draft_hidden": draft_hidden,
            "target_hidden": target_hidden,
            "features": features,
            "old_logprobs": old_logprobs,
            "ref_logprobs": ref_logprobs,
            "advantages": advantages,
        }

    # ---------------------------------------------------------------------------------------------
    # Loss

    def compute_head_loss(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(sum over valid tokens of clipped PG - lambda * acceptance [+ beta * k3]) / number of sequences.

        ``inputs`` is one micro-batch of :meth:`generate_and_score`'s batch; only the head runs.
        """
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"]  # (b, T)
        num_sequences = max(mask.shape[0], 1)
        w = model(inputs["draft_hidden"], inputs["target_hidden"], inputs["features"]).float()  # (b, T)
        logprobs = mixture_logprobs(w, inputs["target_token_probs"], inputs["draft_token_probs"])  # (b, T)
        policy_loss, clipped = objective.clipped_policy_loss(
            logprobs, inputs["old_logprobs"], inputs["advantages"], self.epsilon_low, self.epsilon_high
        )  # (b, T), (b, T)
        accepted = objective.expected_acceptance(w, inputs["total_variation"])  # (b, T)
        kl = objective.kl_k3(logprobs, inputs["ref_logprobs"])  # (b, T)
        policy_term = (policy_loss * mask).sum() / num_sequences
        acceptance_term = (accepted * mask).sum() / num_sequences
        loss = policy_term - self.args.lambda_acceptance * acceptance_term
        if self.beta and self.args.kl_estimator == "k3":
            loss = loss + self.beta * (kl * mask).sum() / num_sequences

        metrics = compat.grpo_metrics(self, mode)
        with torch.no_grad():
            terms = torch.stack([policy_term, acceptance_term, loss]).detach()
            sums = self.accelerator.reduce(
                torch.stack([mask.sum(), (clipped.float() * mask).sum(), (kl * mask).sum(), (~terms.isfinite()).sum()]),
                reduction="sum",
            )  # every process sees a non-finite loss anywhere, and stops with the others
            if sums[3] > 0:
                raise FloatingPointError(
                    f"The loss is not finite at step {self.state.global_step} (this process's policy term, acceptance "
                    f"term and loss: {terms.tolist()}): the head would become NaN. Lower `learning_rate`, check the rewards, "
                    "and check that the models' hidden states are finite in their dtype (bfloat16 overflows sooner)."
                )
            count = sums[0].clamp(min=1)
            metrics["clip_fraction"].append((sums[1] / count).item())
            metrics["kl"].append((sums[2] / count).item())
            metrics["loss/policy"].append(self.accelerator.gather(policy_term.detach()).mean().item())
            metrics["loss/acceptance"].append(self.accelerator.gather(acceptance_term.detach()).mean().item())
        return loss

    # ---------------------------------------------------------------------------------------------
    # Checkpoints: the head (and the pair it belongs to), optimizer, scheduler, RNG, rollout buffer

    def save_head_files(self, output_dir: str) -> None:
        """Write the head (Hub-ready), the pair record and the training arguments to ``output_dir``."""
        head = self.accelerator.unwrap_model(self.model)
        save_head(head, output_dir)
        Path(output_dir, PAIR_FILE).write_text(json.dumps(self.pair, indent=2) + "\n")
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """``Trainer.train``, resuming only from complete checkpoints (see :mod:`.checkpoint`).

        ``resume_from_checkpoint=True`` takes the newest complete ``checkpoint-<step>`` of ``output_dir`` written by
        this run, and skips newer incomplete ones (a run killed while saving) and other runs' with a warning naming
        them; an explicit checkpoint that is incomplete, or another run's, is refused with an error naming the
        missing file or the fields that differ.
        """
        if resume_from_checkpoint is True:
            resume_from_checkpoint = newest_own_checkpoint(self.args.output_dir, self.run)
        elif resume_from_checkpoint not in (None, False) and Path(resume_from_checkpoint).is_dir():
            missing = missing_checkpoint_files(resume_from_checkpoint)
            if missing == [RUN_FILE]:
                raise ValueError(
                    f"`resume_from_checkpoint` {str(resume_from_checkpoint)!r} has no {RUN_FILE}: it was written by an "
                    "older diversed_hf, which did not record its run. Start a new run from its head "
                    "(`DiversedHead.from_pretrained(checkpoint)`), or resume with the release that wrote it."
                )
            if missing:
                raise ValueError(
                    f"`resume_from_checkpoint` {str(resume_from_checkpoint)!r} is incomplete: `{missing[0]}` is missing (the "
                    "run was interrupted while saving it). Resume from an earlier checkpoint, or pass "
                    "`resume_from_checkpoint=True` to take the newest complete one."
                )
            check_run(read_run(resume_from_checkpoint), self.run, str(resume_from_checkpoint))
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def save_checkpoint_extras(self, checkpoint_dir: str) -> None:
        """Before ``Trainer``'s files (which end with ``trainer_state.json``): the initial head and the loop's state.

        Called on every process: the main one writes the initial head and its loop state, every other process its
        own loop state (its rollout buffer and sampling RNG differ from the main one's).
        """
        os.makedirs(checkpoint_dir, exist_ok=True)
        index = self.accelerator.process_index
        if self.args.should_save:
            save_head(self.ref_head, os.path.join(checkpoint_dir, REF_HEAD_DIR))
            Path(checkpoint_dir, RUN_FILE).write_text(json.dumps(self.run, indent=2) + "\n")
        elif index == 0:
            return
        torch.save(
            {
                **compat.grpo_loop_state(self),  # step, buffered_inputs
                "rollout_generator": self._rollout_generator.get_state(),
                "total_train_tokens": self.total_train_tokens,
                "num_processes": self.accelerator.num_processes,
            },
            _extra_state_path(checkpoint_dir, index),
        )

    def load_head_checkpoint(self, checkpoint_dir: str, model: nn.Module | None = None) -> None:
        """Load the head (and the initial head) of a checkpoint, refusing one trained for another pair or head."""
        pair_path = Path(checkpoint_dir, PAIR_FILE)
        if not pair_path.is_file():
            raise ValueError(
                f"`resume_from_checkpoint` {str(checkpoint_dir)!r} has no {PAIR_FILE}: it is not a DiversedTrainer "
                "checkpoint. Pass a checkpoint-<step> directory written by DiversedTrainer."
            )
        check_pair(json.loads(pair_path.read_text()), self.pair, str(checkpoint_dir))
        config, state = load_head_state(checkpoint_dir)
        head = self.accelerator.unwrap_model(self.model if model is None else model)
        ignored = ("target_model_id", "draft_model_id")
        if {k: v for k, v in config.to_dict().items() if k not in ignored} != {
            k: v for k, v in head.config.to_dict().items() if k not in ignored
        }:
            raise ValueError(
                f"The head in {checkpoint_dir} has config {config.to_dict()}, but the head being trained has "
                f"{head.config.to_dict()}. Resume with the same head architecture and options."
            )
        head.load_state_dict(state, strict=True)
        ref_dir = Path(checkpoint_dir, REF_HEAD_DIR)
        if ref_dir.is_dir():
            _, ref_state = load_head_state(ref_dir)
            self.ref_head.load_state_dict(ref_state, strict=True)

    def load_checkpoint_extras(self, checkpoint_dir: str) -> None:
        """Restore what :meth:`save_checkpoint_extras` wrote: the rollout buffer, step, sampling RNG, token count."""
        path = os.path.join(checkpoint_dir, TRAINER_EXTRA_STATE)
        if not os.path.isfile(path):
            return  # a checkpoint without a rollout buffer: GRPO generates a fresh batch
        extra: dict[str, Any] = torch.load(path, weights_only=False, map_location="cpu")
        saved_processes = extra.get("num_processes", 1)
        if saved_processes != self.accelerator.num_processes:
            # Every process decides alike (from process 0's file): all drop the buffer and generate afresh together.
            logger.warning(
                "The checkpoint %s was written by %d process(es), this run has %d: its rollout buffer and sampling RNG "
                "are dropped (a fresh rollout batch is generated); the head, optimizer, scheduler and global step are restored.",
                checkpoint_dir, saved_processes, self.accelerator.num_processes,
            )  # fmt: skip
            self.total_train_tokens = extra["total_train_tokens"]
            return
        if self.accelerator.process_index > 0:
            own = _extra_state_path(checkpoint_dir, self.accelerator.process_index)
            if not os.path.isfile(own):
                raise ValueError(
                    f"`resume_from_checkpoint` {str(checkpoint_dir)!r} lacks {os.path.basename(own)}, the rollout state of "
                    f"process {self.accelerator.process_index} (the run was interrupted while saving it). Resume from an "
                    "earlier checkpoint."
                )
            extra = {**torch.load(own, weights_only=False, map_location="cpu"), "total_train_tokens": extra["total_train_tokens"]}
        buffered = extra["buffered_inputs"]
        if buffered is not None:
            device = self.accelerator.device
            buffered = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in b.items()} for b in buffered]
        compat.restore_grpo_loop_state(self, {"step": extra["step"], "buffered_inputs": buffered})
        self._rollout_generator.set_state(extra["rollout_generator"])
        self.total_train_tokens = extra["total_train_tokens"]

    def create_model_card(self, *args, **kwargs) -> None:
        """No TRL causal-LM card: a head's card comes from ``DiversedHead.save_pretrained`` (see training/train_head.py)."""
        return
