"""The configuration of a :class:`~diversed_hf.heads.head.DiversedHead`: sizes, architecture, mixing space, the features
it reads and the pair it was trained for, checked as a whole (``config.json`` of a saved head)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..verifiers.distribution_features import FEATURE_NAMES, HiddenLayerNorm, check_feature_names
from ..verifiers.ops import MIXING_SPACES
from . import hub
from .hub import HEAD_FORMAT_VERSION

__all__ = ["ARCHITECTURES", "MAX_SIZE", "MLP_HIDDEN_SIZE", "DiversedHeadConfig", "build_net", "config_from_file"]

ARCHITECTURES = ("linear", "mlp")
MLP_HIDDEN_SIZE = 256  #: default width of the 'mlp' head's hidden layer (a 'linear' head records it, unused)
MAX_SIZE = 1 << 17  #: bound on a config's sizes: above every LLM's hidden size (larger: a damaged config.json)


@dataclass
class DiversedHeadConfig:
    """Configuration of a :class:`DiversedHead`."""

    draft_hidden_size: int | None = field(
        default=None,
        metadata={
            "help": "Hidden size of the draft's last layer (a head without hidden states may omit it); 0 for a "
            "drafter without hidden states (prompt lookup): the head reads the target's alone."
        },
    )
    target_hidden_size: int | None = field(
        default=None,
        metadata={"help": "Hidden size of the target's last layer (a head without hidden states may omit it)."},
    )
    architecture: str = field(default="linear", metadata={"help": f"One of {ARCHITECTURES}."})
    w_0: float = field(
        default=0.5, metadata={"help": "Initial weight on the target, in (0, 1): a fresh head outputs exactly this."}
    )
    mixing: str = field(
        default="probs",
        metadata={
            "help": "'probs': nu = w p + (1-w) q (the paper). 'logits': softmax(w z_p + (1-w) z_q) (official code)."
        },
    )
    mlp_hidden_size: int = field(
        default=MLP_HIDDEN_SIZE,
        metadata={"help": "Width of the hidden layer of the 'mlp' architecture (not for 'linear')."},
    )
    target_model_id: str | None = field(default=None, metadata={"help": "Hub id or path of the target model."})
    draft_model_id: str | None = field(default=None, metadata={"help": "Hub id or path of the draft model."})
    task: str | None = field(default=None, metadata={"help": "Task the head was trained for (e.g. 'gsm8k')."})
    features: list[str] = field(
        default_factory=list, metadata={"help": f"Distribution features the head reads, from {FEATURE_NAMES}."}
    )
    use_hidden_states: bool = field(
        default=True, metadata={"help": "Read both models' hidden states; False needs `features` and fits any pair."}
    )
    format_version: int = field(default=HEAD_FORMAT_VERSION, metadata={"help": "Version of this config's format."})

    def __post_init__(self):
        if not isinstance(self.use_hidden_states, bool):
            raise TypeError(f"`use_hidden_states` must be True or False, got {self.use_hidden_states!r}.")
        self.features = check_feature_names(self.features)
        if not self.use_hidden_states and not self.features:
            raise ValueError(
                "`use_hidden_states=False` with no `features` leaves the head nothing to read (a constant weight). "
                f"Pick features from {list(FEATURE_NAMES)}, or use `StaticEnsembleVerifier` for a fixed weight."
            )
        for name in ("draft_hidden_size", "target_hidden_size", "mlp_hidden_size"):
            value = getattr(self, name)
            if value is None and name != "mlp_hidden_size" and not self.use_hidden_states:
                continue  # recorded when known; a head without hidden states never reads them
            if name == "draft_hidden_size" and value == 0 and not isinstance(value, bool):
                continue  # a drafter without hidden states (prompt lookup): the head reads the target's alone
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
            if value > MAX_SIZE:
                raise ValueError(
                    f"`{name}` is {value}, above {MAX_SIZE}: no model's hidden states are that wide, and the head "
                    "would not fit in memory. Use the sizes of the models' last layers (and a small "
                    "`mlp_hidden_size`)."
                )
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"`architecture` must be one of {ARCHITECTURES}, got {self.architecture!r}.")
        if self.architecture == "linear" and self.mlp_hidden_size != MLP_HIDDEN_SIZE:
            raise ValueError(
                f"`mlp_hidden_size` is {self.mlp_hidden_size}, but it sizes the hidden layer of the 'mlp' architecture "
                "and this head is 'linear' (no hidden layer): drop `mlp_hidden_size`, or use `architecture='mlp'`."
            )
        if self.mixing not in MIXING_SPACES:
            raise ValueError(f"`mixing` must be one of {MIXING_SPACES}, got {self.mixing!r}.")
        if isinstance(self.w_0, bool) or not isinstance(self.w_0, (int, float)) or not 0.0 < self.w_0 < 1.0:
            raise ValueError(
                f"`w_0` must be in the open interval (0, 1), got {self.w_0!r}. A head cannot start at exactly 0 or 1 "
                "(its sigmoid would saturate and never train); use `StaticEnsembleVerifier` for a fixed weight."
            )
        hub.check_format_version(self.format_version)
        self.format_version = HEAD_FORMAT_VERSION  # an older format reads as this one (new fields at their defaults)
        for name in ("target_model_id", "draft_model_id", "task"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"`{name}` must be a string or None, got {type(value).__name__} {value!r}.")

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "DiversedHeadConfig":
        """Read a saved ``config.json``: every field in :data:`~diversed_hf.heads.hub.REQUIRED_FILE_FIELDS` must be
        present."""
        return config_from_file(hub.read_json(Path(path), "Head config"), str(path))

    @property
    def num_parameters(self) -> int:
        """Number of parameters of a head with this config."""
        # Built on the meta device: no memory, and no draw from the global RNG (a card written from a
        # training loop must not change the run's random stream).
        with torch.device("meta"):
            return sum(parameter.numel() for parameter in build_net(self).parameters())


def build_net(config: DiversedHeadConfig) -> nn.Sequential:
    """The layers a head with ``config`` has (``DiversedHead.net``): ``[h^q; h^p; f] -> `` one logit."""
    hidden_size = config.draft_hidden_size + config.target_hidden_size if config.use_hidden_states else 0
    input_size = hidden_size + len(config.features)  # [h^q; h^p; f]
    if config.architecture == "linear":
        return nn.Sequential(nn.Linear(input_size, 1))
    return nn.Sequential(
        HiddenLayerNorm(hidden_size, len(config.features)) if hidden_size else nn.Identity(),
        nn.Linear(input_size, config.mlp_hidden_size),
        nn.GELU(),
        nn.Linear(config.mlp_hidden_size, 1),
    )


def config_from_file(values: Any, where: str) -> DiversedHeadConfig:
    """The config of the parsed ``config.json`` at ``where``, checked as a file and as a whole (errors name it)."""
    hub.check_head_config(values, where)  # first: a newer format may add fields this release does not know
    unknown = sorted(set(values) - {item.name for item in fields(DiversedHeadConfig)})
    if unknown:
        raise ValueError(
            f"Invalid head config {where}: Unknown DiversedHeadConfig fields {unknown}; known fields are "
            f"{sorted(item.name for item in fields(DiversedHeadConfig))}."
        )
    try:
        return DiversedHeadConfig(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Invalid head config {where}: {error}") from error
