"""The supported transformers range: pyproject and compat agree, and compat's version-gated names fit the installed release."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
import transformers
from packaging import version
from tiny_models import ARCHITECTURES, make_model
from transformers import RepetitionPenaltyLogitsProcessor, TrainingArguments

from diversed_hf import compat

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_pyproject_admits_exactly_the_tested_range():
    match = re.search(r'"transformers>=([\d.]+),<([\d.]+)"', PYPROJECT.read_text())
    assert match, "pyproject.toml should pin transformers as >=low,<high"
    low, high = compat.TESTED_TRANSFORMERS
    assert (version.parse(match.group(1)), version.parse(match.group(2))) == (low, high)
    assert low <= version.parse(transformers.__version__) < high


def test_a_release_outside_the_range_is_refused_with_the_fix():
    with pytest.raises(ImportError, match=r"pip install 'transformers>=5.19.0,<5.25.0'"):
        compat._check_tested("transformers", "5.18.0", compat.TESTED_TRANSFORMERS, "diversed_hf")
    compat._check_tested("transformers", "5.19.0", compat.TESTED_TRANSFORMERS, "diversed_hf")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_cache_keyword_is_the_one_the_installed_models_take(architecture):
    """A model takes an unknown keyword into **kwargs and runs on a fresh cache: the loop would lose its past."""
    model = make_model(architecture)
    assert compat.CACHE_KWARG in inspect.signature(model.forward).parameters
    cache = compat.new_cache()
    mask = torch.ones(1, 3, dtype=torch.long)
    compat.forward_with_cache(
        model, torch.tensor([[2, 3, 4]]), mask, cache, logits_to_keep=1, output_hidden_states=False
    )
    assert cache.get_seq_length() == 3


def test_activation_checkpointing_reads_the_installed_releases_name(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert compat.activation_checkpointing(args) is False
    name = "activation_checkpointing" if compat._ACTIVATION_CHECKPOINTING else "gradient_checkpointing"
    setattr(args, name, True)
    assert compat.activation_checkpointing(args) is True


def test_the_repetition_penalty_skips_the_columns_shifted_in():
    """The realignment turns transformers' one count (or none) into a count per row, at every supported release."""
    scores = torch.zeros(2, 8)  # (batch, vocab)
    input_ids = torch.tensor([[5, 6, 1, 2], [1, 2, 3, 4]])  # row 0: columns 0-1 were shifted in (rejected drafts)
    processors = [RepetitionPenaltyLogitsProcessor(2.0)]
    compat.realign_logits_processors(processors, kept=None, shifts=torch.tensor([2, 0]), leading=0)
    scores[:] = 1.0
    penalised = processors[0](input_ids, scores.clone()) < 1.0  # (batch, vocab)
    assert penalised[0].nonzero().flatten().tolist() == [1, 2]
    assert penalised[1].nonzero().flatten().tolist() == [1, 2, 3, 4]
