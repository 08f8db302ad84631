"""Saves are atomic and loads refuse what is broken: a failed or interrupted save never loads as a silent mix."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from diversed_hf import DiversedHead, hub
from diversed_hf.verifiers import HeadVerifier
from test_hub import hidden, make_head, randomize


def test_a_failed_save_leaves_the_previous_head_intact(tmp_path, monkeypatch):
    directory = tmp_path / "head"
    old = randomize(make_head("mlp", w_0=0.3), seed=1)
    old.save_pretrained(directory)
    before = {path.name: path.read_bytes() for path in directory.iterdir()}

    new = randomize(make_head("linear", w_0=0.7), seed=2)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hub, "save_weights", disk_full)  # the failure comes after config.json is written
    with pytest.raises(OSError, match="No space left"):
        new.save_pretrained(directory)
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".head.saving-")]  # staging removed
    loaded = DiversedHead.from_pretrained(directory)
    torch.testing.assert_close(loaded(*hidden()), old(*hidden()))


def test_a_file_size_limit_in_a_real_process_leaves_the_previous_head(tmp_path):
    """A child process hits RLIMIT_FSIZE while writing the weights: the head on disk is still the old one."""
    directory = tmp_path / "head"
    old = randomize(make_head("mlp", w_0=0.3), seed=1)
    old.save_pretrained(directory)
    script = textwrap.dedent(
        f"""
        import resource, signal, torch
        from diversed_hf import DiversedHead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing us
        head = DiversedHead(draft_hidden_size=8, target_hidden_size=12, architecture="mlp", mlp_hidden_size=4096)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        head.save_pretrained({str(directory)!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, "the big save should have hit the file-size limit"
    loaded = DiversedHead.from_pretrained(directory)
    torch.testing.assert_close(loaded(*hidden()), old(*hidden()))


def test_files_from_two_saves_are_refused(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    randomize(make_head("linear", w_0=0.3), seed=1).save_pretrained(first)
    randomize(make_head("linear", w_0=0.6), seed=2).save_pretrained(second)
    shutil.copy(second / hub.CONFIG_NAME, first / hub.CONFIG_NAME)  # new config, old weights
    with pytest.raises(ValueError, match="come from different saves"):
        DiversedHead.from_pretrained(first)


def test_heads_with_non_finite_weights_are_refused(tmp_path):
    head = make_head("linear")
    with torch.no_grad():
        head.net[0].weight[0, 3] = float("inf")
    head.save_pretrained(tmp_path / "bad")
    with pytest.raises(ValueError, match=r"NaN or infinite values \(`net.0.weight`\)"):
        DiversedHead.from_pretrained(tmp_path / "bad")
    with pytest.raises(ValueError, match="NaN or infinite values in its parameter"):
        HeadVerifier(head)


def test_official_checkpoints_with_non_finite_weights_are_refused(tmp_path):
    import json

    (tmp_path / "ensemble_config.json").write_text(json.dumps({"draft_hidden_size": 2, "target_hidden_size": 3}))
    weight = torch.zeros(2, 5, dtype=torch.bfloat16)
    weight[1, 0] = float("nan")
    torch.save({"summary.weight": weight, "summary.bias": torch.zeros(2, dtype=torch.bfloat16)}, tmp_path / "ensemble_head.bin")
    with pytest.raises(ValueError, match="NaN or infinite values"):
        DiversedHead.from_official_checkpoint(tmp_path)
