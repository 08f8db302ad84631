"""Every use of transformers internals lives here. Tested with transformers 5.24.

The speculative loop keeps each model's KV cache as a plain :class:`~transformers.DynamicCache`
(full layers, also for sliding-window models: the sliding window is applied by the attention mask,
which transformers builds from column indices, so it stays exact in our left-padded layout) and
edits it per row: crop, shift rows right, drop leading columns, select rows.
"""

from __future__ import annotations

import contextlib

import torch
import transformers
from packaging import version
from transformers import DynamicCache, RepetitionPenaltyLogitsProcessor
from transformers.cache_utils import DynamicLayer

TESTED_TRANSFORMERS = (version.parse("5.19.0"), version.parse("5.25.0"))  # [low, high)


def _check_tested(package: str, installed: str, tested: tuple, what: str) -> None:
    """Raise an ImportError naming the tested range and the pip command when ``installed`` is outside it."""
    low, high = tested
    if not low <= version.parse(installed) < high:
        raise ImportError(
            f"{what} is tested with {package} >={low},<{high}; found {installed}. Install a tested version: "
            f"pip install '{package}>={low},<{high}'."
        )


def check_transformers_version() -> None:
    """Raise an ImportError unless the installed transformers is in :data:`TESTED_TRANSFORMERS`."""
    _check_tested("transformers", transformers.__version__, TESTED_TRANSFORMERS, "diversed_hf's speculative loop")


def new_cache() -> DynamicCache:
    """An empty cache whose layers all keep every position (no sliding-window eviction)."""
    return DynamicCache()


def _layers(cache: DynamicCache):
    """The cache's filled layers, each checked to be a full (non-sliding) :class:`DynamicLayer`."""
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.is_sliding:
            raise TypeError(f"diversed_hf edits only full DynamicLayer caches, got {type(layer).__name__}.")
        if layer.get_seq_length() > 0:
            yield layer


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of every row (transformers' ``Cache.crop``); no-op if shorter."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def drop_leading_positions(cache: DynamicCache, count: int) -> None:
    """Remove the first ``count`` positions (columns that are padding in every row)."""
    if count <= 0:
        return
    for layer in _layers(cache):
        layer.keys = layer.keys[..., count:, :]  # (batch, heads, length - count, head_dim)
        layer.values = layer.values[..., count:, :]


def shift_rows_right(
    cache: DynamicCache,
    shifts: torch.Tensor,  # (batch,) non-negative
) -> None:
    """Roll each row right by ``shifts[b]`` positions; what wraps around lands on padding columns."""
    for layer in _layers(cache):
        batch, heads, length, head_dim = layer.keys.shape
        index = (torch.arange(length, device=shifts.device) - shifts.unsqueeze(-1)) % length  # (batch, length)
        index = index.to(layer.keys.device)[:, None, :, None].expand(batch, heads, length, head_dim)
        layer.keys = layer.keys.gather(2, index)  # (batch, heads, length, head_dim)
        layer.values = layer.values.gather(2, index.expand(*layer.values.shape[:3], layer.values.shape[-1]))


def realign_cache(
    cache: DynamicCache,
    *,
    kept: torch.Tensor | None,  # (kept,) rows that continue; None keeps all
    length: int,
    shifts: torch.Tensor | None,  # (kept,) non-negative; None: no row moves
    leading: int,
) -> None:
    """One round's cache edit of the batched loop: keep rows ``kept`` (``Cache.batch_select_indices``),
    crop every row to ``length`` positions (``Cache.crop``), roll row ``b`` right by ``shifts[b]``,
    then drop the first ``leading`` positions."""
    if kept is not None:
        cache.batch_select_indices(kept)
    crop_cache(cache, length)
    if shifts is not None:
        shift_rows_right(cache, shifts)
    drop_leading_positions(cache, leading)


#: transformers 5.23 made ``RepetitionPenaltyLogitsProcessor.prompt_ignore_length`` a count per row (a ``(batch,)``
#: tensor; ``generate`` passes each row's left padding when it keeps an attention mask); before, one int or None.
ROW_PROMPT_IGNORE_LENGTH = version.parse(transformers.__version__) >= version.parse("5.23.0")


class _RowRepetitionPenalty(RepetitionPenaltyLogitsProcessor):
    """transformers 5.23's per-row ``prompt_ignore_length`` for 5.19-5.22: ignored columns become id ``vocab``,
    which the processor's 2-D path (the one the loop calls) clamps into a spare slot and drops."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (batch, L), (batch, vocab)
        ignored = self.prompt_ignore_length.to(input_ids.device)  # (batch,)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (L,)
        input_ids = input_ids.masked_fill(positions[None, :] < ignored[:, None], scores.shape[-1])  # (batch, L)
        return RepetitionPenaltyLogitsProcessor(self.penalty)(input_ids, scores)


def realign_logits_processors(
    logits_processor,
    *,
    kept: torch.Tensor | None,  # (kept,) rows that continue; None keeps all
    shifts: torch.Tensor | None,  # (kept,) non-negative; None: no row moves
    leading: int,
) -> None:
    """The same edit for the processors that hold per-row positions: transformers'
    ``RepetitionPenaltyLogitsProcessor.prompt_ignore_length`` (generate sets it to each row's left padding; a
    user may set each row's prompt length): keep rows ``kept``, add ``shifts[b]``, subtract ``leading``.

    An int or None (transformers before 5.23; 5.23+ when ``generate`` dropped an all-ones attention mask) becomes a
    count per row once rows move: the columns a shift brings in hold rejected drafts, which must not be penalised.
    Before 5.23 the processor is replaced, in ``logits_processor``, by one that reads such a count."""
    for i, processor in enumerate(logits_processor):
        if not isinstance(processor, RepetitionPenaltyLogitsProcessor):
            continue
        ignored = processor.prompt_ignore_length  # (batch,), an int for every row, or None
        if not isinstance(ignored, torch.Tensor):
            if shifts is None:  # every row moves alike
                if ignored is not None:
                    processor.prompt_ignore_length = max(int(ignored) - leading, 0)
                continue
            ignored = torch.full_like(shifts, int(ignored or 0))  # (kept,) already the continuing rows
            if not ROW_PROMPT_IGNORE_LENGTH:
                processor = logits_processor[i] = _RowRepetitionPenalty(processor.penalty)
        elif kept is not None:
            ignored = ignored.to(kept.device)[kept]
        if shifts is not None:
            ignored = ignored + shifts.to(ignored.device)
        processor.prompt_ignore_length = (ignored - leading).clamp(min=0)


def special_token_ids(
    generation_config,
    device: torch.device,
) -> tuple[int, torch.Tensor | None]:  # pad id, (num_eos,) or None
    """The pad token id (falling back to the first EOS id, then 0) and the EOS ids that ``generate``
    prepared on ``generation_config`` (its private ``_pad_token_tensor`` / ``_eos_token_tensor``)."""
    pad = generation_config._pad_token_tensor
    eos = generation_config._eos_token_tensor
    pad_token_id = int(pad) if pad is not None else (int(eos.flatten()[0]) if eos is not None else 0)
    return pad_token_id, None if eos is None else eos.flatten().to(device)


#: The forward keyword that takes the KV cache. transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old
#: name still works there, with a deprecation warning); before 5.24 a model takes ``cache=`` into ``**kwargs``,
#: ignores it and builds a fresh cache, so every call would silently run without the past.
CACHE_KWARG = "cache" if version.parse(transformers.__version__) >= version.parse("5.24.0") else "past_key_values"


def forward_with_cache(
    model,
    input_ids: torch.Tensor,  # (batch, chunk)
    attention_mask: torch.Tensor,  # (batch, cached + chunk)
    cache: DynamicCache,
    *,
    logits_to_keep: int,
    output_hidden_states: bool,
):
    """One forward pass of ``chunk`` new tokens on top of ``cache``; positions follow the attention mask."""
    position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]  # (batch, chunk)
    cached = cache.get_seq_length()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        output_hidden_states=output_hidden_states,
        **{CACHE_KWARG: cache},
    )
    # A model that does not know the keyword takes it into **kwargs and runs on a fresh cache of its own.
    assert cache.get_seq_length() == cached + input_ids.shape[1], (
        f"{type(model).__name__} did not extend the cache passed as `{CACHE_KWARG}=` ({cached} + {input_ids.shape[1]} "
        f"positions expected, {cache.get_seq_length()} found)"
    )
    return out


def split_stopping_criteria(criteria):
    """Split transformers' prepared criteria into (handled natively: length and EOS, the rest)."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    rest = StoppingCriteriaList([c for c in criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])
    return rest


#: transformers 5.23 renamed ``TrainingArguments.gradient_checkpointing`` to ``activation_checkpointing`` (the old name
#: became a deprecated alias of it); before 5.23 only ``gradient_checkpointing`` exists.
_ACTIVATION_CHECKPOINTING = version.parse(transformers.__version__) >= version.parse("5.23.0")


def activation_checkpointing(args) -> bool:
    """Whether ``args`` (``TrainingArguments``) ask for activation (gradient) checkpointing, under either name."""
    name = "activation_checkpointing" if _ACTIVATION_CHECKPOINTING else "gradient_checkpointing"
    return bool(getattr(args, name))


@contextlib.contextmanager
def assisted_decoding_candidates(model, build):
    """Within the block, transformers' own assisted decoding on ``model`` (``model.generate(..., assistant_model=...)``,
    which runs ``GenerationMixin._assisted_decoding``) drafts with the candidate generator that ``build(**arguments)``
    returns; ``arguments`` are those transformers passes to its ``AssistedCandidateGenerator`` (``input_ids,
    assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor``).

    Why a private: transformers (5.24) offers no public way to choose the candidate generator of its assisted loop;
    it builds one in ``GenerationMixin._get_candidate_generator``, which is shadowed on the instance for the block.
    ``tests/test_candidate_contract.py`` uses it to drive :class:`~diversed_hf.candidates.DiversedCandidateGenerator`
    through transformers' loop.
    """

    def get_candidate_generator(*, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                                assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
        return build(input_ids=input_ids, assistant_model=assistant_model, generation_config=generation_config,
                     model_kwargs=model_kwargs, inputs_tensor=inputs_tensor, logits_processor=logits_processor)

    model._get_candidate_generator = get_candidate_generator
    try:
        yield model
    finally:
        del model._get_candidate_generator


# =================================================================================================
# TRL (the ``train`` extra): every TRL / transformers.Trainer private that DiversedTrainer sets,
# reads or overrides lives below. Nothing here imports TRL at module level: ``import diversed_hf``
# (which imports this module) never imports TRL. Tested with TRL 1.16.
#
# Why DiversedTrainer does not run ``GRPOTrainer.__init__`` (TRL 1.16). That constructor is written
# for one trainable causal-LM policy, and on the way it
#   * reads ``model.config.get_text_config()`` / ``model.generation_config`` to mirror the pad token and
#     collect EOS ids, and ``model.config.get_text_config().router_aux_loss_coef`` (MoE options);
#   * with ``beta != 0`` builds a reference model with
#     ``create_model_from_path(get_config_model_id(model.config), ...)``: a second copy of the policy;
#   * patches the policy with ``add_fused_lm_head`` (a fused log-prob / entropy LM head) and, optionally,
#     casts its ``lm_head`` to fp32;
#   * builds a generation backend for it (vLLM, continuous batching or a ``GenerationConfig``) and
#     calls ``model.add_model_tags``.
# Our policy is the mixture ``nu_theta = w_theta p + (1 - w_theta) q`` over two *frozen* causal LMs,
# and the trained module is the small head (a ``DiversedHead``: an ``nn.Module`` without a
# transformers config, generation config or LM head). None of the above applies to it; passing the
# target as ``model`` instead would make ``transformers.Trainer`` optimise the target.
#
# Why not TRL's ``_BaseTrainer.__init__`` either. It is ``transformers.Trainer.__init__`` plus (a) a
# shim for transformers < 5.19 (we require 5.24, where ``Trainer`` honours ``loss_is_scaled_for_ga``
# itself) and (b) ``_send_telemetry()``, which reads ``self.model.config.model_type``, the policy's
# transformers architecture, which a head config does not have. So :func:`init_grpo_trainer` runs
# ``transformers.Trainer.__init__`` with the head as the model, after setting the state that the
# GRPOTrainer methods DiversedTrainer reuses read (listed, method by method, in
# :func:`init_grpo_state`). :func:`check_trl_version` pins the TRL versions this was checked against.
# =================================================================================================

TESTED_TRL = (version.parse("1.16.0"), version.parse("1.17.0"))  # [low, high)

#: GRPOTrainer / Trainer methods DiversedTrainer inherits unchanged, and the hooks it overrides (through
#: :class:`GRPOHooks`). Re-check both lists, and :func:`init_grpo_state`, when widening :data:`TESTED_TRL`.
GRPO_REUSED_METHODS = (
    "get_train_dataloader", "_get_train_sampler", "get_eval_dataloader", "_get_eval_sampler",
    "_set_signature_columns_if_needed", "training_step", "_prepare_inputs", "compute_loss", "prediction_step", "log",
    "_save_checkpoint", "_load_optimizer_and_scheduler",
)  # fmt: skip
GRPO_OVERRIDDEN_HOOKS = (
    "_generate_and_score_completions", "_compute_loss", "_save", "_save_checkpoint", "_load_from_checkpoint",
    "_load_optimizer_and_scheduler",
)  # fmt: skip


def check_trl_version() -> None:
    """Raise an ImportError unless the installed TRL is in :data:`TESTED_TRL` (``diversed_hf.training`` calls it)."""
    import trl

    _check_tested("trl", trl.__version__, TESTED_TRL, "diversed_hf.training (it reuses GRPOTrainer internals)")


def init_grpo_state(trainer, args) -> None:
    """Set the attributes that the GRPOTrainer methods DiversedTrainer reuses read (``GRPOTrainer.__init__`` sets them).

    Each line names the TRL 1.16 methods that read the attribute.
    """
    from collections import defaultdict, deque

    size = args.generation_batch_size
    # RepeatSampler arguments: `_get_train_sampler`, `get_train_dataloader`; `_prepare_inputs` (num_iterations)
    trainer.num_generations = args.num_generations
    trainer.num_iterations = args.num_iterations
    trainer.shuffle_dataset = args.shuffle_dataset
    trainer.num_generations_eval = args.num_generations_eval or args.num_generations  # `_get_eval_sampler`, `get_eval_dataloader`
    trainer._step = 0  # `_prepare_inputs` (when to generate, which buffered slice), `training_step` (counts micro-steps)
    trainer._buffered_inputs = None  # `_prepare_inputs`: the rollout batch split into `steps_per_generation` slices
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}  # `log` averages them; `training_step`
    trainer._current_train_step_time = 0.0  # `training_step` (the `step_time` metric)
    trainer.use_adaptive_entropy = False  # `_save_checkpoint`, `_load_optimizer_and_scheduler` (entropy controller off)
    # `log`: the completions table (printed with rich, written as parquet, sent to wandb / trackio)
    trainer.log_completions = args.log_completions
    trainer.log_unique_prompts = args.log_unique_prompts
    trainer.num_completions_to_print = args.num_completions_to_print
    trainer._logs = {
        "images": deque(maxlen=size),
        "prompt": deque(maxlen=size),
        "completion": deque(maxlen=size),
        "rewards": defaultdict(lambda: deque(maxlen=size)),
        "advantages": deque(maxlen=size),
        "extra": defaultdict(lambda: deque(maxlen=size)),
    }


def init_grpo_trainer(trainer, *, model, args, train_dataset, eval_dataset, callbacks, optimizers) -> None:
    """``transformers.Trainer.__init__`` with ``model`` (the head) as the trained module, after :func:`init_grpo_state`.

    Rows reach the rollout hook as a list of dicts (no collation), as in GRPOTrainer; checkpoints hold the head
    only (no ``processing_class``).
    """
    import os

    from transformers import Trainer

    init_grpo_state(trainer, args)
    Trainer.__init__(
        trainer,
        model=model,
        args=args,
        data_collator=_identity_collator,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=None,
        callbacks=callbacks,
        optimizers=optimizers,
    )
    if trainer.log_completions and trainer.accelerator.is_main_process:
        os.makedirs(os.path.join(args.output_dir, "completions"), exist_ok=True)  # `log` writes parquet files there


def _identity_collator(features: list) -> list:
    return features


def grpo_metrics(trainer, mode: str) -> dict:
    """The ``{name: [values]}`` lists of ``mode`` ("train" / "eval") that GRPOTrainer's ``log`` averages and clears.

    Append one value per rollout batch or loss call; a name whose list holds one running total is logged as it is.
    """
    return trainer._metrics[mode]


def record_completions(trainer, prompts: list, completions: list, rewards: dict, advantages: list) -> None:
    """Feed the completions table GRPOTrainer's ``log`` shows when ``log_completions=True`` (this process's rows)."""
    logs = trainer._logs
    logs["prompt"].extend(prompts)
    logs["completion"].extend(completions)
    for name, values in rewards.items():
        logs["rewards"][name].extend(values)
    logs["advantages"].extend(advantages)


def grpo_loop_state(trainer) -> dict:
    """GRPO's rollout-loop state, for a checkpoint: the micro-step counter and the buffered rollout batch."""
    return {"step": trainer._step, "buffered_inputs": trainer._buffered_inputs}


def restore_grpo_loop_state(trainer, state: dict) -> None:
    """Inverse of :func:`grpo_loop_state` (tensors of the buffered batch already on the right device)."""
    trainer._step = state["step"]
    trainer._buffered_inputs = state["buffered_inputs"]


def checkpoint_dir(trainer, trial) -> str:
    """The ``checkpoint-<global step>`` directory ``Trainer._save_checkpoint`` writes for ``trial``."""
    import os

    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return os.path.join(trainer._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")


class GRPOHooks:
    """The GRPOTrainer / ``transformers.Trainer`` hooks DiversedTrainer overrides, as delegations to public methods.

    Put it before ``GRPOTrainer`` in the bases. The subclass provides:

    * ``generate_and_score(inputs) -> dict``: the rollout batch (GRPOTrainer's ``_prepare_inputs`` buffers and
      splits it);
    * ``compute_head_loss(model, inputs) -> Tensor``: the loss of one micro-batch (GRPOTrainer's ``compute_loss``
      and ``prediction_step`` call it);
    * ``save_head_files(output_dir)``: what ``Trainer.save_model`` writes (also inside every checkpoint);
    * ``save_checkpoint_extras(checkpoint_dir)`` / ``load_checkpoint_extras(checkpoint_dir)``: extra state
      written before ``Trainer``'s own checkpoint files and restored after the optimizer and scheduler;
    * ``load_head_checkpoint(checkpoint_dir, model)``: restore the trained module instead of
      ``Trainer``'s model loading.
    """

    def _generate_and_score_completions(self, inputs):  # read by GRPOTrainer._prepare_inputs
        return self.generate_and_score(inputs)

    def _compute_loss(self, model, inputs):  # read by GRPOTrainer.compute_loss
        return self.compute_head_loss(model, inputs)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:  # Trainer.save_model
        if self.args.should_save:
            self.save_head_files(output_dir if output_dir is not None else self.args.output_dir)

    def _save_checkpoint(self, model, trial) -> None:  # Trainer's training loop
        # Our files first: Trainer's end with trainer_state.json, then rotate older checkpoints away, so a
        # checkpoint with trainer_state.json is complete (DiversedTrainer.train skips or refuses others).
        # Every process: each has its own rollout buffer and sampling RNG (the main one also writes the shared files).
        self.save_checkpoint_extras(checkpoint_dir(self, trial))
        super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:  # Trainer.train(resume_from_...)
        self.load_head_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:  # Trainer's training loop
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_checkpoint_extras(checkpoint)
