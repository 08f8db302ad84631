"""What ``additional_config["diversed"]`` may say, checked, and the verifier it builds (no vLLM import here).

An engine verifies against the DIVERSED mixture when its ``additional_config`` holds a ``"diversed"`` entry::

    {"diversed": {"target_weight": 0.5}}                       # static ensemble, nu = 0.5 p + 0.5 q
    {"diversed": {"head": "org/head-gsm8k", "revision": "v1"}} # DIVERSED head: w_t from DiversedHead.from_pretrained

Keys:

============= ===============================================================================================
``target_weight`` the static ensemble's weight on the target, in [0, 1] (``StaticEnsembleVerifier``)
``mixing``        ``"probs"`` (default, the paper) or ``"logits"``; only with ``target_weight`` (a head carries its own)
``head``          a directory written by ``DiversedHead.save_pretrained`` or a Hub repo id
``revision``      the head's Hub revision (only with ``head``)
``local_files_only`` do not reach the Hub for the head (only with ``head``; ``HF_HUB_OFFLINE=1`` does the same)
============= ===============================================================================================

Exactly one of ``target_weight`` and ``head``. Heads that read hidden states (``use_hidden_states=True``) are
refused: vLLM's draft proposer and target pass do not hand the plugin the models' last-layer hidden states at the
verified positions, so only heads on distribution features (``use_hidden_states=False``) run here.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import is_real
from ..head import DiversedHead
from ..verifiers import MIXING_SPACES, HeadVerifier, StaticEnsembleVerifier, Verifier

__all__ = ["CONFIG_KEY", "DiversedVllmSettings", "settings_from_additional_config"]

#: the key of vLLM's ``additional_config`` this plugin reads
CONFIG_KEY = "diversed"
_KEYS = ("target_weight", "mixing", "head", "revision", "local_files_only")
_EXAMPLE = '{"diversed": {"target_weight": 0.5}} or {"diversed": {"head": "<dir or repo id>"}}'


@dataclass(frozen=True)
class DiversedVllmSettings:
    """The checked ``additional_config["diversed"]`` of one engine."""

    target_weight: float | None = None
    mixing: str = "probs"
    head: str | None = None
    revision: str | None = None
    local_files_only: bool = False

    def __post_init__(self):
        where = f'additional_config["{CONFIG_KEY}"]'
        if (self.target_weight is None) == (self.head is None):
            raise ValueError(
                f"{where} must name exactly one of `target_weight` (a static ensemble) and `head` (a DIVERSED head), "
                f"got target_weight={self.target_weight!r}, head={self.head!r}. Example: {_EXAMPLE}."
            )
        if self.target_weight is not None:
            value = self.target_weight
            if not is_real(value) or math.isnan(value) or not 0.0 <= value <= 1.0:
                raise ValueError(
                    f"{where}[\"target_weight\"] must be a number in [0, 1] (the weight on the target; 1 is lossless "
                    f"SD, 0 accepts every draft), got {value!r}."
                )
            if self.mixing not in MIXING_SPACES:
                raise ValueError(f"{where}[\"mixing\"] must be one of {MIXING_SPACES}, got {self.mixing!r}.")
            for name in ("revision",):
                if getattr(self, name) is not None:
                    raise ValueError(f"{where}[\"{name}\"] is for a head; it means nothing with `target_weight`.")
        else:
            if not isinstance(self.head, str) or not self.head:
                raise ValueError(
                    f"{where}[\"head\"] must be a directory written by DiversedHead.save_pretrained or a Hub repo id, "
                    f"got {self.head!r}."
                )
            if self.mixing != "probs":
                raise ValueError(
                    f"{where}[\"mixing\"] is for `target_weight`; a head mixes in its own config's space "
                    f"(`mixing` in its config.json). Remove `mixing`, got {self.mixing!r}."
                )
            if self.revision is not None and not isinstance(self.revision, str):
                raise ValueError(f"{where}[\"revision\"] must be a string, got {self.revision!r}.")
        if not isinstance(self.local_files_only, bool):
            raise ValueError(f"{where}[\"local_files_only\"] must be true or false, got {self.local_files_only!r}.")

    def describe(self) -> str:
        """One line for the logs: the rule and, for a head, where it came from."""
        if self.head is None:
            return f"static ensemble, target_weight={self.target_weight}, mixing={self.mixing!r}"
        revision = f"@{self.revision}" if self.revision else ""
        return f"DIVERSED head {self.head}{revision}"

    def build_verifier(self, device: Any = "cpu") -> tuple[Verifier, str]:
        """The verifier whose ``verification_probs`` gives ``nu_t``, and a line naming it for the logs."""
        if self.head is None:
            return StaticEnsembleVerifier(self.target_weight, mixing=self.mixing), self.describe()
        head = DiversedHead.from_pretrained(
            self.head, revision=self.revision, local_files_only=self.local_files_only, device=device
        )
        if head.config.use_hidden_states:
            raise ValueError(
                f'additional_config["{CONFIG_KEY}"]["head"] = {self.head!r} is a head that reads hidden states '
                "(use_hidden_states=True): vLLM's draft proposer and verification pass do not give the plugin both "
                "models' last-layer hidden states at the verified positions. In vLLM, use a head on distribution "
                "features only (DiversedHead.for_pair(..., use_hidden_states=False, features=[...]), trained with "
                "the project's trainer) or a static weight ({\"target_weight\": w}); serve hidden-state heads with the "
                "project's own `generate`."
            )
        return HeadVerifier(head), f"{self.describe()} ({_head_identity(head, self.head)})"


def _head_identity(head: DiversedHead, source: str) -> str:
    """What identifies a loaded head: its architecture, features, recorded pair and the digest of its weights."""
    config = head.config
    digest = hashlib.sha256()
    for name, tensor in sorted(head.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    local = Path(source).expanduser()
    where = "local directory" if local.is_dir() else "Hub repo"
    return (
        f"{where}; architecture={config.architecture!r}, mixing={config.mixing!r}, features={config.features}, "
        f"task={config.task!r}, pair=({config.target_model_id!r}, {config.draft_model_id!r}), "
        f"weights sha256={digest.hexdigest()[:16]}"
    )


def settings_from_additional_config(additional_config: Any) -> DiversedVllmSettings | None:
    """The engine's DIVERSED settings, or ``None`` when ``additional_config`` has no ``"diversed"`` entry."""
    if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
        return None
    values = additional_config[CONFIG_KEY]
    if not isinstance(values, dict):
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] must be a JSON object, got {type(values).__name__} {values!r}. '
            f"Example: {_EXAMPLE}."
        )
    unknown = sorted(set(values) - set(_KEYS))
    if unknown:
        raise ValueError(f'additional_config["{CONFIG_KEY}"] has unknown keys {unknown}; the keys are {list(_KEYS)}.')
    return DiversedVllmSettings(**values)
