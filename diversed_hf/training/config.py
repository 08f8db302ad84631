"""``DiversedConfig``: GRPO's configuration, reused where its fields mean the same thing (see the class)."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields

from transformers import TrainingArguments

from .. import compat

compat.check_trl_version()  # installed and in the tested range, before its names are read

from trl import GRPOConfig  # noqa: E402

from ..heads.head import ARCHITECTURES, MLP_HIDDEN_SIZE  # noqa: E402
from ..verifiers.distribution_features import FEATURE_NAMES, check_feature_names  # noqa: E402

KL_ESTIMATORS = ("k1", "k3")
#: GRPO's own fields (beyond ``TrainingArguments``) that DIVERSED reads; any other GRPO field set away from GRPO's
#: default is refused, naming it (``DiversedConfig.__post_init__``): nothing is accepted and silently ignored
HONOURED_GRPO_FIELDS = frozenset(
    {
        "beta",  # KL to the initial head (`kl_estimator` says how)
        "epsilon",
        "epsilon_high",  # the PPO clip
        "num_iterations",  # inner epochs over one rollout batch
        "num_generations",
        "num_generations_eval",  # G in training and evaluation
        "generation_batch_size",
        "steps_per_generation",  # how rollouts are batched
        "max_completion_length",
        "temperature",
        "top_k",
        "top_p",  # rollouts and log-probabilities, both models
        "reward_weights",
        "shuffle_dataset",
        "log_completions",
        "num_completions_to_print",
        "log_unique_prompts",
        "log_completions_hub_repo",  # refused below with its own message
        "use_vllm",
        "use_transformers_continuous_batching",
        "use_transformers_paged",  # generation backends: refused below with their own message
    }
)
#: fields that take "no": YAML 1.1 (PyYAML, which TRL's ``--config`` loader uses) reads a bare `no` as False
STRATEGY_FIELDS = ("save_strategy", "eval_strategy", "logging_strategy")


@dataclass
class DiversedConfig(GRPOConfig):
    r"""Configuration of :class:`DiversedTrainer` (docs/method.md §5).

    GRPO fields keep their meaning: ``num_generations`` is ``G`` (samples per prompt),
    ``max_completion_length`` the rollout length, ``temperature`` / ``top_k`` / ``top_p`` the
    processors applied to *both* models in rollouts and log-probabilities, ``epsilon`` /
    ``epsilon_high`` the PPO clip, ``num_iterations`` the inner epochs over one rollout batch,
    ``beta`` the KL coefficient (KL to the *initial head*), ``reward_weights`` the weights of
    several reward functions. GRPO's advantage and loss options (``scale_rewards``, ``loss_type``,
    importance-sampling and vLLM options) do not apply: the advantage is REINFORCE++'s.
    ``log_completions`` works as in GRPO (this process's prompts, completions, rewards and per-sequence
    advantages, written under ``<output_dir>/completions``); uploading them (``log_completions_hub_repo``) does not.

    Defaults that differ from GRPO's (paper-era settings; the head is small and trains in fp32):
    ``learning_rate=5e-4``, ``num_generations=4``, ``max_completion_length=128``, ``bf16=False``,
    activation (gradient) checkpointing off, ``logging_steps=1``, ``save_only_model=False``.
    """

    lambda_acceptance: float = field(
        default=4.0,
        metadata={"help": "lambda: weight of the acceptance term lambda * sum_t (1 - w_t TV(p_t, q_t)); >= 0."},
    )
    use_group_baseline: bool = field(
        default=True,
        metadata={
            "help": "Subtract the mean reward of the G samples of a prompt before whitening (REINFORCE++-baseline)."
        },
    )
    kl_estimator: str = field(
        default="k3",
        metadata={
            "help": "How `beta` applies the KL to the initial head: 'k1' folded into the return, 'k3' as a loss."
        },
    )
    head_architecture: str = field(
        default="linear",
        metadata={"help": f"Architecture of a head the trainer builds itself: one of {ARCHITECTURES}."},
    )
    head_w_0: float = field(
        default=0.5, metadata={"help": "Initial weight on the target of a head the trainer builds."}
    )
    head_mlp_hidden_size: int = field(
        default=MLP_HIDDEN_SIZE,
        metadata={"help": "Hidden width of an 'mlp' head the trainer builds (not for 'linear')."},
    )
    head_features: list[str] = field(
        default_factory=list,
        metadata={
            "help": f"Distribution features of p_t and q_t a head the trainer builds reads, from {FEATURE_NAMES}."
        },
    )
    head_use_hidden_states: bool = field(
        default=True,
        metadata={"help": "Whether a head the trainer builds reads both models' hidden states (False: features only)."},
    )
    num_draft_tokens: int = field(
        default=5, metadata={"help": "N, drafts per round, for evaluating the trained head with speculative decoding."}
    )

    # Overridden GRPO / TrainingArguments defaults
    learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate (the paper uses 5e-4)."})
    num_generations: int | None = field(default=4, metadata={"help": "G: samples from nu_theta per prompt."})
    max_completion_length: int | None = field(default=128, metadata={"help": "Maximum new tokens per rollout."})
    bf16: bool | None = field(default=False, metadata={"help": "bf16 autocast; the head is tiny, fp32 is the default."})
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of `activation_checkpointing`; unused: only the head trains."}
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every X optimizer steps."})
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "DDP (several processes): every head parameter is used, so no extra search pass."},
    )

    def __post_init__(self):
        for name in STRATEGY_FIELDS:
            value = getattr(self, name)
            if value is False:
                setattr(self, name, "no")  # `save_strategy: no` in a YAML file
            elif value is True:
                raise ValueError(
                    f"`{name}` is True (YAML reads a bare `yes` / `on` / `true` as True); give the strategy by name: "
                    f"'no', 'steps' or 'epoch' (quote it in YAML: `{name}: \"steps\"`)."
                )
        self._check_finite()
        self._refuse_unimplemented_grpo_fields()
        super().__post_init__()
        if self.lambda_acceptance < 0:
            raise ValueError(
                f"`lambda_acceptance` is {self.lambda_acceptance}; it must be >= 0 (a negative weight lowers "
                "acceptance, the sign error of the official trainer)."
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"`kl_estimator` is {self.kl_estimator!r}; use one of {KL_ESTIMATORS}.")
        if self.beta < 0:
            raise ValueError(f"`beta` (KL coefficient) is {self.beta}; it must be >= 0.")
        for name in ("epsilon", "epsilon_high"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(
                    f"`{name}` (the PPO clip) is {value}; it must be >= 0: the ratio is clipped to [1 - epsilon, "
                    "1 + epsilon_high] (0.2 is usual)."
                )
        if self.head_architecture not in ARCHITECTURES:
            raise ValueError(f"`head_architecture` is {self.head_architecture!r}; use one of {ARCHITECTURES}.")
        if self.head_architecture == "linear" and self.head_mlp_hidden_size != MLP_HIDDEN_SIZE:
            raise ValueError(
                f"`head_mlp_hidden_size` is {self.head_mlp_hidden_size}, but it sizes the hidden layer of an 'mlp' "
                "head and `head_architecture` is 'linear': drop it, or set `head_architecture='mlp'`."
            )
        if not 0.0 < self.head_w_0 < 1.0:
            raise ValueError(f"`head_w_0` is {self.head_w_0}; it must be in the open interval (0, 1).")
        self.head_features = check_feature_names(self.head_features or [], argument="head_features")
        if not self.head_use_hidden_states and not self.head_features:
            raise ValueError(
                "`head_use_hidden_states=False` needs `head_features` (the head would read nothing); pick some of "
                f"{list(FEATURE_NAMES)}."
            )
        if self.num_draft_tokens < 1:
            raise ValueError(f"`num_draft_tokens` is {self.num_draft_tokens}; it must be >= 1.")
        if self.max_completion_length is None or self.max_completion_length < 1:
            raise ValueError(f"`max_completion_length` is {self.max_completion_length}; it must be >= 1.")
        # GRPO's generation backends; `use_transformers_paged` is TRL < 1.8's name of continuous batching.
        for name in ("use_vllm", "use_transformers_continuous_batching", "use_transformers_paged"):
            if getattr(self, name, False):
                raise ValueError(
                    f"`{name}=True` is not supported: rollouts sample from the two-model mixture nu_theta. Set it to "
                    "False."
                )
        if self.log_completions_hub_repo is not None:
            raise ValueError(
                f"`log_completions_hub_repo` is {self.log_completions_hub_repo!r}, but DiversedTrainer does not upload "
                "completion logs; `log_completions=True` still writes them under `<output_dir>/completions`. Unset it."
            )
        if compat.activation_checkpointing(self):
            raise ValueError(
                "`activation_checkpointing=True` (or `gradient_checkpointing=True`) does not apply: only the head "
                "trains and the models run without gradients. Set it to False."
            )

    def _refuse_unimplemented_grpo_fields(self) -> None:
        """A GRPO field this trainer does not read, set away from GRPO's default, is an error naming it (GRPO's loss
        variants, importance sampling, entropy terms, reference-model sync, vLLM settings, ...): the advantage and
        loss are REINFORCE++'s (docs/training.md, "What GRPO's configuration means here")."""
        base = {spec.name for spec in fields(TrainingArguments)}
        changed = []
        for spec in fields(GRPOConfig):
            if spec.name in base or spec.name in HONOURED_GRPO_FIELDS or not hasattr(self, spec.name):
                continue
            default = spec.default_factory() if spec.default_factory is not MISSING else spec.default
            if default is MISSING:
                continue
            if getattr(self, spec.name) != default:
                changed.append(f"`{spec.name}={getattr(self, spec.name)!r}` (GRPO's default: {default!r})")
        if changed:
            raise ValueError(
                "DiversedTrainer does not implement " + ", ".join(changed) + ": these GRPO options have no effect on "
                "REINFORCE++ with the acceptance term (docs/method.md §5). Remove them."
            )

    def _check_finite(self) -> None:
        """Every float field (and each float of a list field, such as ``reward_weights``) must be a finite number:
        NaN passes every ``<`` / ``>`` check and would train, and save, a NaN head."""
        for spec in fields(self):
            value = getattr(self, spec.name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            bad = [v for v in values if isinstance(v, float) and not math.isfinite(v)]
            if bad:
                raise ValueError(
                    f"`{spec.name}` is {value!r}; {'each entry' if value is not bad[0] else 'it'} must be a finite "
                    "number (NaN passes every range check, and NaN or infinity would train and save a NaN head). "
                    "Give a number."
                )
