"""``DiversedTrainer``: trains a DIVERSED head with REINFORCE++ and the acceptance regulariser (docs/method.md §5).

A ``transformers.Trainer`` whose model is the **head**, configured by :class:`DiversedConfig` (TRL's public
``GRPOConfig`` with DIVERSED's fields). The loop is GRPO's -- sample ``G`` completions per prompt, score them with
TRL-style reward functions, reuse one rollout batch for ``num_iterations`` clipped-ratio updates over
``steps_per_generation`` micro-steps -- but the policy is the mixture ``nu_theta = w_theta p + (1 - w_theta) q``
over a frozen target and a frozen draft, of which only the head trains. ``GRPOTrainer.__init__`` cannot take that
policy (it builds a trainable causal LM, a reference copy of it, a fused LM head and a generation backend), and its
rollout, reward and advantage steps are private methods; so this class is built on ``Trainer``'s public hooks only
(docs/architecture.md, "Why DiversedTrainer is a transformers Trainer"):

* ``get_train_dataloader`` / ``get_eval_dataloader``: prompts grouped ``G`` at a time (:mod:`.batches`);
* ``training_step``: the rollout buffer (:class:`~.batches.RolloutBuffer`) serves this step's micro-batch, making a
  rollout batch with :meth:`generate_and_score` when one is due; ``compute_loss`` is :meth:`compute_head_loss`;
* ``prediction_step``: a fresh rollout and the loss, for ``evaluate``;
* ``log``: the metrics of :mod:`.logs` and the completions table;
* ``save_model`` / ``train``: head-only checkpoints, pair- and run-checked (:mod:`.checkpoint`).

Because both models are frozen, a rollout fixes ``p_t(x_t)``, ``q_t(x_t)``, ``TV(p_t, q_t)``,
both hidden states and the head's distribution features; the loss recomputes only
``w_t = head(h^q_t, h^p_t, f_t)``, so inner epochs cost a head forward, not a model forward.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..drafting.protocol import verification_vocab
from ..heads.head import DiversedHead
from . import objective, scoring
from .batches import GroupedSampler, RolloutBuffer, rows_collator, rows_loader
from .checkpoint import (
    PAIR_FILE,
    REF_HEAD_DIR,
    RUN_FILE,
    check_writable,
    load_checkpoint_heads,
    loop_state_path,
    pair_record,
    read_loop_state,
    resolve_resume,
    run_record,
    save_head,
)
from .config import DiversedConfig
from .logs import CompletionLog, MetricLog
from .rollout import mixture_logprobs, sample_from_mixture
from .setup import check_datasets, checked_head, checked_rewards, eos_token_ids

logger = logging.getLogger(__name__)

RewardFunc = Callable[..., list]


class DiversedTrainer(Trainer):
    """Train a :class:`~diversed_hf.DiversedHead` for a frozen (target, draft) pair.

    Args:
        target, draft: the two causal LMs (frozen here: ``requires_grad_(False)``, eval mode).
        head: the head to train; default a fresh ``DiversedHead.for_pair`` built from
            ``args.head_architecture`` / ``args.head_w_0`` / ``args.head_features`` / ``args.head_use_hidden_states``.
        reward_funcs: one or more TRL-style reward functions
            ``f(prompts=..., completions=..., completion_ids=..., **dataset_columns) -> list[float]``
            (e.g. :func:`diversed_hf.lab.tasks.reward_for_task`; what a reward may be: :mod:`.scoring`). Pass
            ``lambda completions, **_: [0.0] * len(completions)`` to train on acceptance alone.
        args: a :class:`DiversedConfig`.
        train_dataset / eval_dataset: ``datasets.Dataset`` with a ``prompt`` column (plain text or
            chat messages) and whatever columns the reward functions read.
        processing_class: the tokenizer shared by both models.

    Logged metrics (train and eval): ``reward`` (and per function), ``mean_w``, ``acceptance_proxy``
    (mean ``1 - w_t TV_t`` over rollout tokens: the expected acceptance rate of speculative decoding
    with this head), ``acceptance_exact_sd`` (mean ``1 - TV_t``: that of lossless SD on the same
    tokens), ``kl`` (k3 estimate of KL to the initial head), ``clip_fraction``, completion lengths, and what reward
    functions log with ``log_metric``; :meth:`log` averages them over each logging step (``eval_``-prefixed in
    evaluation). Reward functions may be ``async`` and may add columns to the completions table with ``log_extra``
    (:mod:`.scoring`, :mod:`.logs`).
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
        check_writable(args.output_dir)

        self.vocab_size = verification_vocab(target, draft)  # raises on a vocabulary mismatch
        for model in (target, draft):
            model.requires_grad_(False)
            model.eval()
        self.target, self.draft = target, draft
        head = checked_head(head, target, draft, args)
        self.ref_head = copy.deepcopy(head).requires_grad_(False).eval()  # the initial head, for the KL
        self.pair = pair_record(target, draft, self.vocab_size)
        if processing_class is None:
            raise ValueError("`processing_class` (the tokenizer shared by the target and the draft) is required.")
        self.tokenizer = processing_class
        self.eos_token_ids = eos_token_ids(target, self.tokenizer)  # sets the pad token to EOS when it has none
        self.reward_funcs, self.reward_func_names, self.reward_weights = checked_rewards(reward_funcs, args)
        train_rows = check_datasets(train_dataset, eval_dataset, args)

        # Rollout and loss settings (GRPO's names) -----------------------------------------------------
        self.num_generations = args.num_generations
        self.num_generations_eval = args.num_generations_eval or args.num_generations
        self.max_completion_length = args.max_completion_length
        self.temperature, self.top_k, self.top_p = args.temperature, args.top_k, args.top_p
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.beta = args.beta
        self.total_train_tokens = 0  # completion tokens trained on so far (the `num_tokens` metric)
        self.rollouts = RolloutBuffer(args.steps_per_generation, args.num_iterations)
        self.step_metrics = MetricLog()
        self.completion_log = CompletionLog(args.generation_batch_size)
        self.step_seconds = 0.0  # time of this optimizer step's micro-steps so far (the `step_time` metric)

        super().__init__(
            model=head,
            args=args,
            data_collator=rows_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=None,  # checkpoints hold the head only
            callbacks=callbacks,
            optimizers=optimizers,
        )
        if args.n_gpu > 1:
            raise ValueError(
                f"{args.n_gpu} GPUs are visible to one process, so `Trainer` would wrap the head in nn.DataParallel, "
                "which the rollout does not support. Launch with `accelerate launch` or `torchrun`, or make one GPU "
                "visible with CUDA_VISIBLE_DEVICES."
            )
        self.ref_head.to(self.accelerator.device)
        self.run = run_record(args, self.pair, asdict(head.config), self.reward_func_names, train_rows)
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
            "every `prompt` must be a string, or a list of chat messages ({'role': ..., 'content': ...}); this "
            f"batch has prompts of types {kinds}. Make the dataset's 'prompt' column all text or all conversations."
        )

    def _global_advantages(
        self, rewards: torch.Tensor, mask: torch.Tensor, token_kl: torch.Tensor | None, group_size: int
    ):
        """REINFORCE++ advantages whitened over the whole batch: every process's rollouts, not just this one's."""
        several = self.accelerator.num_processes > 1
        return objective.reinforce_pp_advantages(
            rewards,
            mask,
            group_size=group_size,
            use_group_baseline=self.args.use_group_baseline,
            token_kl=token_kl,
            kl_coef=self.beta if self.args.kl_estimator == "k1" else 0.0,
            gather=self.accelerator.gather if several else None,
            reduce_sum=(lambda tensor: self.accelerator.reduce(tensor, reduction="sum")) if several else None,
            rank=self.accelerator.process_index,
        )

    def generate_and_score(self, inputs: list[dict], mode: str = "train") -> dict[str, torch.Tensor]:
        """Sample completions of ``inputs`` (dataset rows) from ``nu_theta``, score them, and return the rollout batch.

        The batch holds what :meth:`compute_head_loss` needs, per token: mask, ``p_t(x_t)``, ``q_t(x_t)``, TV, both
        hidden states, old / reference log-probabilities and REINFORCE++ advantages. In training, the rollout
        buffer splits it over ``steps_per_generation`` micro-steps; ``mode`` ("train" / "eval") says where its
        metrics go and which group size (``num_generations`` / ``num_generations_eval``) the advantages' baseline
        uses.
        """
        prompts = [row["prompt"] for row in inputs]
        texts, rollout = self._sample_rollout(prompts)
        head_device = self.accelerator.device
        mask = rollout.completion_mask.to(head_device).float()  # (B, T)
        lengths = rollout.completion_mask.sum(dim=1).tolist()
        completion_ids = [row[:n].tolist() for row, n in zip(rollout.completion_ids, lengths)]
        completions = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        rewards_per_func = scoring.score_completions(
            self.reward_funcs,
            self.reward_func_names,
            inputs,
            prompts,
            completions,
            completion_ids,
            self.state,
            log_metric=self.step_metrics.log_metric,
            log_extra=self.completion_log.log_extra,
        )  # (B, F), NaN where a function did not score a completion
        rewards = scoring.weighted_rewards(rewards_per_func, self.reward_weights).to(head_device)  # (B,)

        batch = {
            "completion_mask": mask,
            "target_token_probs": rollout.target_token_probs.to(head_device),
            "draft_token_probs": rollout.draft_token_probs.to(head_device),
            "total_variation": rollout.total_variation.to(head_device),
            # the head trains in float32, whatever dtype the models run in (bfloat16, float64)
            "draft_hidden": rollout.draft_hidden.to(head_device, torch.float32),  # (B, T, d_draft)
            "target_hidden": rollout.target_hidden.to(head_device, torch.float32),  # (B, T, d_target)
            "features": rollout.features.to(head_device, torch.float32),  # (B, T, F) as generation computes them
            "old_logprobs": rollout.logprobs.to(head_device),
        }
        with torch.no_grad():
            ref_w = self.ref_head(batch["draft_hidden"], batch["target_hidden"], batch["features"])  # (B, T)
            batch["ref_logprobs"] = mixture_logprobs(ref_w, batch["target_token_probs"], batch["draft_token_probs"])
        token_kl = objective.kl_k1(batch["old_logprobs"], batch["ref_logprobs"]) if self.beta else None
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        batch["advantages"] = self._global_advantages(rewards, mask, token_kl, group_size)  # (B, T)

        self._log_rollout(mode, rollout.target_weight.to(head_device), batch, rewards_per_func, rewards, completion_ids)
        self.completion_log.record(
            texts,
            completions,
            {name: rewards_per_func[:, i].tolist() for i, name in enumerate(self.reward_func_names)},
            batch["advantages"][:, 0].tolist(),  # a sequence's advantage (its first token's; constant without k1)
        )
        return batch

    def _sample_rollout(self, prompts: list):
        """``(prompt texts, Rollout)``: the prompts tokenized (left-padded) and completed from ``nu_theta``."""
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
        return texts, rollout

    def _log_rollout(self, mode, w, batch, rewards_per_func, rewards, completion_ids) -> None:
        """A rollout batch's metrics, over every process: rewards, ``mean_w``, acceptance, lengths, tokens."""
        mask, tv = batch["completion_mask"], batch["total_variation"]
        metrics = self.step_metrics[mode]
        gathered = self.accelerator.gather(rewards_per_func.to(mask.device))
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(gathered[:, i].nanmean().item())  # over the completions it scored
        all_rewards = self.accelerator.gather(rewards)
        metrics["reward"].append(all_rewards.mean().item())
        metrics["reward_std"].append(all_rewards.std().item() if all_rewards.numel() > 1 else 0.0)
        sums = torch.stack(
            [mask.sum(), (w * mask).sum(), (objective.expected_acceptance(w, tv) * mask).sum(), ((1 - tv) * mask).sum()]
        )
        sums = self.accelerator.reduce(sums, reduction="sum")
        count = sums[0].clamp(min=1)
        metrics["mean_w"].append((sums[1] / count).item())
        metrics["acceptance_proxy"].append((sums[2] / count).item())
        metrics["acceptance_exact_sd"].append((sums[3] / count).item())
        all_lengths = self.accelerator.gather(mask.sum(dim=1))
        metrics["completions/mean_length"].append(all_lengths.mean().item())
        ended = torch.tensor([any(t in self.eos_token_ids for t in ids) for ids in completion_ids], device=mask.device)
        metrics["completions/clipped_ratio"].append(1.0 - self.accelerator.gather(ended.float()).mean().item())
        if mode == "train":
            self.total_train_tokens += int(self.accelerator.gather(mask.sum()).sum().item())
            metrics["num_tokens"] = [self.total_train_tokens]
        self.step_metrics.flush_pending(self.accelerator, mode)  # what reward functions logged, over every process

    # ---------------------------------------------------------------------------------------------
    # Trainer's public hooks: batches, steps, evaluation, logs

    def get_train_dataloader(self) -> DataLoader:
        """Rows of ``steps_per_generation`` micro-batches per step, each prompt ``num_generations`` times in a row
        (:class:`~.batches.GroupedSampler`), the same draw repeated for each of the ``num_iterations`` passes."""
        args = self.args
        sampler = GroupedSampler(
            self.train_dataset,
            group_size=self.num_generations,
            prompts_per_batch=args.generation_batch_size // self.num_generations,
            repeat_count=args.num_iterations * args.steps_per_generation,
            shuffle=args.shuffle_dataset,
            seed=args.seed,
        )
        batch_size = args.train_batch_size * args.steps_per_generation  # one rollout batch's rows, on this process
        return rows_loader(self.train_dataset, sampler, batch_size, args, self.accelerator)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        """Each prompt ``num_generations_eval`` times in a row, in a seeded order (the same at every evaluation)."""
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("Evaluation needs an `eval_dataset`: pass one to DiversedTrainer or to `evaluate`.")
        sampler = GroupedSampler(dataset, group_size=self.num_generations_eval, seed=self.args.seed)
        return rows_loader(dataset, sampler, self.args.eval_batch_size, self.args, self.accelerator)

    def training_step(self, model: nn.Module, inputs: list[dict], num_items_in_batch=None) -> torch.Tensor:
        """One micro-step on this step's slice of the buffered rollout batch (a new rollout when one is due)."""
        start = time.perf_counter()
        batch = self.rollouts.micro_batch(inputs, self.generate_and_score)
        loss = super().training_step(model, batch, num_items_in_batch)
        self.rollouts.step += 1
        self.step_seconds += time.perf_counter() - start
        if self.rollouts.step % self.current_gradient_accumulation_steps == 0:
            self.step_metrics["train"]["step_time"].append(self.step_seconds)
            self.step_seconds = 0.0
        return loss

    def compute_loss(self, model: nn.Module, inputs: dict, return_outputs: bool = False, num_items_in_batch=None):
        if return_outputs:  # the loss is :meth:`compute_head_loss`'s; there are no model outputs
            raise ValueError(
                "DiversedTrainer.compute_loss has no model outputs to return; call it with return_outputs=False."
            )
        return self.compute_head_loss(model, inputs)

    def prediction_step(self, model: nn.Module, inputs: list[dict], prediction_loss_only: bool, ignore_keys=None):
        """Evaluation: a fresh rollout of ``inputs`` from the current head, and its loss (no predictions)."""
        batch = self.generate_and_score(inputs, mode="eval")
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, batch)
        return loss.mean().detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """``Trainer.log`` with the metrics averaged since the last log (:mod:`.logs`), then the completions table."""
        mode = "train" if self.model.training else "eval"
        metrics = self.step_metrics.averages(mode)
        if mode == "eval":
            metrics = {f"eval_{key}": value for key, value in metrics.items()}
        logs.update(metrics)  # in place: `evaluate` returns the dict it logs
        super().log(logs, start_time)
        if self.args.log_completions and self.accelerator.is_main_process:
            self.completion_log.write(
                self.args.output_dir,
                self.state.global_step,
                num_to_print=self.args.num_completions_to_print,
                report_to=self.args.report_to,
                unique_prompts=self.args.log_unique_prompts,
            )

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

        metrics = self.step_metrics[mode]
        with torch.no_grad():
            terms = torch.stack([policy_term, acceptance_term, loss]).detach()
            sums = self.accelerator.reduce(
                torch.stack([mask.sum(), (clipped.float() * mask).sum(), (kl * mask).sum(), (~terms.isfinite()).sum()]),
                reduction="sum",
            )  # every process sees a non-finite loss anywhere, and stops with the others
            if sums[3] > 0:
                raise FloatingPointError(
                    f"The loss is not finite at step {self.state.global_step} (this process's policy term, "
                    f"acceptance term and loss: {terms.tolist()}): the head would become NaN. Lower `learning_rate`, "
                    "check the rewards, and check that the models' hidden states are finite in their dtype "
                    "(bfloat16 overflows sooner)."
                )
            count = sums[0].clamp(min=1)
            metrics["clip_fraction"].append((sums[1] / count).item())
            metrics["kl"].append((sums[2] / count).item())
            metrics["loss/policy"].append(self.accelerator.gather(policy_term.detach()).mean().item())
            metrics["loss/acceptance"].append(self.accelerator.gather(acceptance_term.detach()).mean().item())
        return loss

    # ---------------------------------------------------------------------------------------------
    # Checkpoints: the head (and the pair it belongs to), optimizer, scheduler, RNG, rollout buffer

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the head (Hub-ready), the pair record and the training arguments to ``output_dir``.

        ``Trainer`` calls it first when it writes ``checkpoint-<step>``: the trainer's own checkpoint files
        (:meth:`save_checkpoint_extras`) go there before the head, and ``Trainer``'s files, which end with
        ``trainer_state.json``, after it -- so a checkpoint holding every file is complete (see :mod:`.checkpoint`).
        As ``Trainer.save_model`` (whose signature this keeps), a call of the user's pushes ``output_dir`` to the Hub
        when ``push_to_hub=True``; ``Trainer``'s own calls (``_internal_call=True``) do not.
        """
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if Path(output_dir).name == f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}":
            self.save_checkpoint_extras(output_dir)  # every process: each has its own rollout buffer and sampling RNG
        if self.args.should_save:
            self.save_head_files(output_dir)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def save_head_files(self, output_dir: str) -> None:
        """Write the head (Hub-ready), the pair record and the training arguments to ``output_dir``."""
        head = self.accelerator.unwrap_model(self.model)
        save_head(head, output_dir)
        Path(output_dir, PAIR_FILE).write_text(json.dumps(self.pair, indent=2) + "\n")
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """``Trainer.train``, resuming only from complete checkpoints of this run (:func:`.checkpoint.resolve_resume`:
        ``True`` takes the newest, skipping incomplete ones and other runs' with a warning). The head (strictly, after
        checking its pair and config) and the rollout loop's state are restored here; ``Trainer`` restores the
        optimizer, scheduler, RNG and global step (and reloads the same head weights)."""
        resume_from_checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir, self.run)
        if resume_from_checkpoint is not None:
            self.load_head_checkpoint(resume_from_checkpoint)
            self.load_checkpoint_extras(resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def save_checkpoint_extras(self, checkpoint_dir: str) -> None:
        """Before the head and ``Trainer``'s files (which end with ``trainer_state.json``): the initial head and
        the loop's state.

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
                **self.rollouts.state(),  # step, buffered_inputs
                "rollout_generator": self._rollout_generator.get_state(),
                "total_train_tokens": self.total_train_tokens,
                "num_processes": self.accelerator.num_processes,
            },
            loop_state_path(checkpoint_dir, index),
        )

    def load_head_checkpoint(self, checkpoint_dir: str) -> None:
        """Load the head (and the initial head) of a checkpoint, refusing one trained for another pair or head."""
        load_checkpoint_heads(checkpoint_dir, self.pair, self.accelerator.unwrap_model(self.model), self.ref_head)

    def load_checkpoint_extras(self, checkpoint_dir: str) -> None:
        """Restore what :meth:`save_checkpoint_extras` wrote: the rollout buffer, step, sampling RNG, token count."""
        extra = read_loop_state(checkpoint_dir, self.accelerator.process_index, self.accelerator.num_processes)
        if extra is None:
            return  # a checkpoint without a rollout buffer: a fresh rollout batch is generated
        self.total_train_tokens = extra["total_train_tokens"]
        if "step" not in extra:
            return  # written by another number of processes: only the token count carries over
        buffered = extra["buffered_inputs"]
        if buffered is not None:
            device = self.accelerator.device
            buffered = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in b.items()} for b in buffered]
        self.rollouts.load_state({"step": extra["step"], "buffered_inputs": buffered})
        self._rollout_generator.set_state(extra["rollout_generator"])

    def create_model_card(self, *args, **kwargs) -> None:
        """No TRL causal-LM card: a head's card comes from ``DiversedHead.save_pretrained`` (see
        training/train_head.py)."""
        return
