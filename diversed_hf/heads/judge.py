"""``JudgeHead``: the classifier of judge decoding (Bachmann et al., 2025) and AutoJudge (Garipov et al., 2025) that
:class:`~diversed_hf.verifiers.relaxed.JudgeVerifier` reads (docs/method.md §9).

A linear layer on the target's last hidden state at a drafted token (the state after the target read it) gives the
probability that keeping the token does not change the answer. It is shared like a ``DiversedHead``: through
``huggingface_hub.PyTorchModelHubMixin`` (``config.json``, ``model.safetensors`` and a generated card ``README.md``),
``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``; ``training/train_judge.py`` trains one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from . import hub

__all__ = ["JudgeHead", "JudgeHeadConfig"]

CARD_TEMPLATE = """---
{{ card_data }}
---

# A judge head for relaxed speculative decoding

A linear classifier on the target's last hidden state at a drafted token: the probability that keeping the drafted
token does not change the task's answer (judge decoding, Bachmann et al., 2025; labels mined as AutoJudge does,
Garipov et al., 2025). Use it with `diversed_hf`:

```python
from diversed_hf import JudgeHead, enable_diversed
from diversed_hf.verifiers import JudgeVerifier

judge = JudgeHead.from_pretrained("{{ repo_id | default('path/to/judge', true) }}")
enable_diversed(target)
target.generate(**inputs, assistant_model=draft, verifier=JudgeVerifier(judge, threshold=0.5))
```

A draft is kept when the lossless test keeps it or the judge's probability is at least `threshold`; the output then
no longer follows the target's distribution exactly. A threshold above 1 is lossless speculative decoding.
"""


@dataclass(frozen=True)
class JudgeHeadConfig:
    """What a judge reads and was trained for: the target's hidden size, its model id and the task."""

    hidden_size: int
    target_model_id: str | None = None
    task: str | None = None


class JudgeHead(
    nn.Module,
    PyTorchModelHubMixin,
    library_name=hub.LIBRARY_NAME,
    tags=[*hub.HUB_TAGS, "judge-decoding"],
    model_card_template=CARD_TEMPLATE,
):
    """``judge(h) -> P(keep)``: a linear layer and a sigmoid over the target's hidden states ``(..., d)``."""

    def __init__(self, hidden_size: int, target_model_id: str | None = None, task: str | None = None):
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"`hidden_size` must be a positive integer (the target's), got {hidden_size!r}.")
        self._config = JudgeHeadConfig(hidden_size, target_model_id, task)
        self.linear = nn.Linear(hidden_size, 1)
        with torch.no_grad():  # untrained: it never fires at any threshold above 0.01, so it starts lossless
            self.linear.weight.zero_()
            self.linear.bias.fill_(-5.0)

    @property
    def config(self) -> JudgeHeadConfig:
        return self._config

    @classmethod
    def for_target(cls, target, task: str | None = None) -> JudgeHead:
        """An untrained judge for a loaded ``target`` (its width and model id), on its device."""
        text_config = target.config.get_text_config()
        model_id = getattr(target.config, "_name_or_path", None) or None
        return cls(int(text_config.hidden_size), target_model_id=model_id, task=task).to(target.device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., d) -> (...)
        return torch.sigmoid(self.linear(hidden).squeeze(-1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., d) -> (...): what training fits
        return self.linear(hidden).squeeze(-1)

    def save_pretrained(self, save_directory, **kwargs):
        """The mixin's ``save_pretrained`` (``config.json``, ``model.safetensors``, a card ``README.md``), refusing a
        directory that holds another model's ``config.json`` (a ``DiversedHead``, a draft): it would be overwritten."""
        _check_judge_directory(Path(save_directory))
        return super().save_pretrained(save_directory, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> JudgeHead:
        """The mixin's ``from_pretrained`` from a directory or Hub id, the source checked first (a missing directory
        or a malformed id is named, before any download)."""
        revision, local_files_only = kwargs.get("revision"), kwargs.get("local_files_only", False)
        source, _ = hub.check_source(
            pretrained_model_name_or_path,
            revision=revision,
            force_download=kwargs.get("force_download", False),
            local_files_only=local_files_only,
        )
        errors = hub.download_errors(
            source,
            hub.CONFIG_NAME,
            revision=revision,
            cache_dir=kwargs.get("cache_dir"),
            local_files_only=local_files_only,
        )
        with errors:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def _from_pretrained(cls, **kwargs) -> JudgeHead:
        """The mixin's loading, then refusing non-finite weights (a judge with NaN weights would never fire)."""
        judge = super()._from_pretrained(**kwargs)
        hub.check_finite(
            judge.state_dict(),
            f"The judge's weights in {kwargs.get('model_id')!r}",
            "the file is corrupt or training diverged; train it again (training/train_judge.py).",
        )
        return judge.eval()


def _check_judge_directory(directory: Path) -> None:
    config = directory / "config.json"
    if not config.is_file():
        return
    try:
        keys = set(json.loads(config.read_text()))
    except (OSError, ValueError, TypeError):
        keys = None
    if keys is None or not keys <= {field.name for field in fields(JudgeHeadConfig)}:
        held = "an unreadable config.json" if keys is None else f"another model's config.json (keys {sorted(keys)[:6]})"
        raise ValueError(
            f"`save_directory` {str(directory)!r} holds {held}: saving a judge there would overwrite that model's "
            "files. Pass a new or empty directory, or one a JudgeHead was saved in."
        )
