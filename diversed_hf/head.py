"""The DIVERSED ensemble head: ``w_t = f_theta(h^q_t, h^p_t)`` (SPEC §3).

A small network reads the last-layer hidden state of the draft and of the target at the
position that produced ``q_t`` / ``p_t`` and outputs the weight ``w_t`` in (0, 1) that the
verification mixture puts on the **target**. Both models stay frozen; only the head trains.

- ``linear``: ``w = sigmoid(W [h^q; h^p] + b)`` (the official release: one linear layer with a
  2-way softmax, which is a sigmoid of the difference of its two logits).
- ``mlp``: ``w = sigmoid(W_2 gelu(W_1 LayerNorm([h^q; h^p])) + b_2)``.

The output layer starts at zero weight and bias ``logit(w_0)``, so a freshly built head outputs
exactly ``w_0`` everywhere and behaves as the static ensemble with that weight.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import nn

from .verifiers import MIXING_SPACES

ARCHITECTURES = ("linear", "mlp")
HEAD_FORMAT_VERSION = 1


def hidden_size_of(model) -> int:
    """Size of the last-layer hidden state of a Hugging Face causal LM."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.hidden_size)


def model_id_of(model) -> str | None:
    """The Hub id or local path a model was loaded from, if known."""
    return getattr(model.config, "_name_or_path", None) or getattr(model, "name_or_path", None) or None


@dataclass
class DiversedHeadConfig:
    """Configuration of a :class:`DiversedHead`."""

    draft_hidden_size: int = field(metadata={"help": "Hidden size of the draft model's last layer."})
    target_hidden_size: int = field(metadata={"help": "Hidden size of the target model's last layer."})
    architecture: str = field(default="linear", metadata={"help": f"One of {ARCHITECTURES}."})
    w_0: float = field(
        default=0.5, metadata={"help": "Initial weight on the target, in (0, 1): a fresh head outputs exactly this."}
    )
    mixing: str = field(
        default="probs",
        metadata={"help": "'probs': nu = w p + (1-w) q (the paper). 'logits': softmax(w z_p + (1-w) z_q) (official code)."},
    )
    mlp_hidden_size: int = field(default=256, metadata={"help": "Width of the hidden layer of the 'mlp' architecture."})
    target_model_id: str | None = field(default=None, metadata={"help": "Hub id or path of the target model."})
    draft_model_id: str | None = field(default=None, metadata={"help": "Hub id or path of the draft model."})
    task: str | None = field(default=None, metadata={"help": "Task the head was trained for (e.g. 'gsm8k')."})
    format_version: int = field(default=HEAD_FORMAT_VERSION, metadata={"help": "Version of this config's format."})

    def __post_init__(self):
        for name in ("draft_hidden_size", "target_hidden_size", "mlp_hidden_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"`architecture` must be one of {ARCHITECTURES}, got {self.architecture!r}.")
        if self.mixing not in MIXING_SPACES:
            raise ValueError(f"`mixing` must be one of {MIXING_SPACES}, got {self.mixing!r}.")
        if isinstance(self.w_0, bool) or not isinstance(self.w_0, (int, float)) or not 0.0 < self.w_0 < 1.0:
            raise ValueError(
                f"`w_0` must be in the open interval (0, 1), got {self.w_0!r}. A head cannot start at exactly 0 or 1 "
                "(its sigmoid would saturate and never train); use `StaticEnsembleVerifier` for a fixed weight."
            )
        if not isinstance(self.format_version, int) or self.format_version > HEAD_FORMAT_VERSION:
            raise ValueError(
                f"`format_version` {self.format_version!r} is newer than this diversed_hf supports "
                f"({HEAD_FORMAT_VERSION}). Upgrade diversed_hf: pip install -U diversed_hf."
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "DiversedHeadConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown DiversedHeadConfig fields {unknown}; known fields are {sorted(known)}.")
        missing = sorted(f.name for f in fields(cls) if f.name in ("draft_hidden_size", "target_hidden_size") and f.name not in values)
        if missing:
            raise ValueError(f"DiversedHeadConfig is missing the required fields {missing}.")
        return cls(**values)


class DiversedHead(nn.Module):
    """Ensemble head: ``head(draft_hidden, target_hidden) -> w``, the weight on the target.

    Example::

        head = DiversedHead.for_pair(target, draft, architecture="linear", w_0=0.5)
        target.generate(input_ids, assistant_model=draft, diversed_head=head, do_sample=True)
    """

    def __init__(self, config: DiversedHeadConfig | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = DiversedHeadConfig(**kwargs)
        elif kwargs:
            raise TypeError(f"Pass either a `config` or keyword arguments, not both (got {sorted(kwargs)}).")
        if not isinstance(config, DiversedHeadConfig):
            raise TypeError(f"`config` must be a DiversedHeadConfig, got {type(config).__name__}.")
        self.config = config
        input_size = config.draft_hidden_size + config.target_hidden_size
        if config.architecture == "linear":
            self.net = nn.Sequential(nn.Linear(input_size, 1))
        else:
            self.net = nn.Sequential(
                nn.LayerNorm(input_size),
                nn.Linear(input_size, config.mlp_hidden_size),
                nn.GELU(),
                nn.Linear(config.mlp_hidden_size, 1),
            )
        self.reset_output_layer()

    def reset_output_layer(self) -> None:
        """Zero the output layer and set its bias to ``logit(w_0)``: the head then outputs ``w_0`` everywhere."""
        output_layer = self.net[-1]
        with torch.no_grad():
            output_layer.weight.zero_()
            output_layer.bias.fill_(math.log(self.config.w_0 / (1.0 - self.config.w_0)))

    @classmethod
    def for_pair(cls, target, draft, architecture: str = "linear", w_0: float = 0.5, mixing: str = "probs", **kwargs):
        """A fresh head sized for a loaded ``target`` and ``draft``, recording their model ids."""
        config = DiversedHeadConfig(
            draft_hidden_size=hidden_size_of(draft),
            target_hidden_size=hidden_size_of(target),
            architecture=architecture,
            w_0=w_0,
            mixing=mixing,
            target_model_id=model_id_of(target),
            draft_model_id=model_id_of(draft),
            **kwargs,
        )
        return cls(config)

    def logit(
        self,
        draft_hidden: torch.Tensor,  # (batch, tokens, d_draft)
        target_hidden: torch.Tensor,  # (batch, tokens, d_target)
    ) -> torch.Tensor:  # (batch, tokens)
        """Pre-sigmoid score; ``w = sigmoid(logit)``."""
        if draft_hidden.shape[-1] != self.config.draft_hidden_size or target_hidden.shape[-1] != self.config.target_hidden_size:
            raise ValueError(
                f"This head expects hidden sizes (draft {self.config.draft_hidden_size}, target "
                f"{self.config.target_hidden_size}), got (draft {draft_hidden.shape[-1]}, target {target_hidden.shape[-1]})."
            )
        if draft_hidden.shape[:-1] != target_hidden.shape[:-1]:
            raise ValueError(
                f"`draft_hidden` {tuple(draft_hidden.shape)} and `target_hidden` {tuple(target_hidden.shape)} must "
                "agree on every dimension but the last: (batch, tokens, hidden)."
            )
        features = torch.cat([draft_hidden, target_hidden], dim=-1)  # (batch, tokens, d_draft + d_target)
        return self.net(features).squeeze(-1)  # (batch, tokens)

    def forward(
        self,
        draft_hidden: torch.Tensor,  # (batch, tokens, d_draft)
        target_hidden: torch.Tensor,  # (batch, tokens, d_target)
    ) -> torch.Tensor:  # (batch, tokens)
        logit = self.logit(draft_hidden, target_hidden)  # (batch, tokens)
        # The sigmoid runs in float64 so that a fresh head returns w_0 rounded once, exactly as a
        # static weight would be.
        return torch.sigmoid(logit.double()).to(logit.dtype)

    def extra_repr(self) -> str:
        return f"architecture={self.config.architecture!r}, w_0={self.config.w_0}, mixing={self.config.mixing!r}"
