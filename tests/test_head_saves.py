"""Saves are atomic and loads refuse what is broken: a failed or interrupted save never loads as a silent mix."""

from __future__ import annotations

import builtins
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap

import huggingface_hub
import pytest
import torch
from huggingface_hub import ModelHubMixin
from test_hub import REPO_ID, hidden, make_head, offline, populate_cache, randomize  # noqa: F401 - offline is a fixture
from tiny_models import make_pair

from diversed_hf import DiversedHead, DiversedHeadConfig
from diversed_hf.heads import hub
from diversed_hf.verifiers import HeadVerifier


def test_a_failed_save_leaves_the_previous_head_intact(tmp_path, monkeypatch):
    directory = tmp_path / "head"
    old = randomize(make_head("mlp", w_0=0.3), seed=1)
    old.save_pretrained(directory)
    before = {path.name: path.read_bytes() for path in directory.iterdir()}

    new = randomize(make_head("linear", w_0=0.7), seed=2)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hub, "save_weights", disk_full)  # the failure comes after the staging directory is made
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


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_heads_with_non_finite_weights_are_neither_saved_nor_loaded(tmp_path, value):
    head = make_head("linear")
    with torch.no_grad():
        head.net[0].weight[0, 3] = value
    with pytest.raises(ValueError, match=r"weights hold NaN or infinite values \(`net.0.weight`\): it is not saved"):
        head.save_pretrained(tmp_path / "bad")
    assert list(tmp_path.iterdir()) == []  # no head, no card, no staging directory
    make_head("linear").save_pretrained(tmp_path / "bad")  # a file damaged afterwards is refused at load
    config_digest = hub.config_digest(json.loads((tmp_path / "bad" / hub.CONFIG_NAME).read_text()))
    hub.save_weights(head.state_dict(), tmp_path / "bad" / hub.WEIGHTS_NAME, config_sha256=config_digest)
    with pytest.raises(ValueError, match=r"NaN or infinite values \(`net.0.weight`\)"):
        DiversedHead.from_pretrained(tmp_path / "bad")
    with pytest.raises(ValueError, match="NaN or infinite values in its parameter"):
        HeadVerifier(head)


def test_a_killed_save_leaves_no_staging_directory_after_the_next_save(tmp_path):
    """A process killed while writing the weights leaves its staging directory; the next save removes it."""
    directory = tmp_path / "head"
    script = textwrap.dedent(
        f"""
        import os
        from diversed_hf import DiversedHead, DiversedHeadConfig, hub
        def killed(*args, **kwargs):
            os._exit(137)
        hub.save_weights = killed
        DiversedHead(draft_hidden_size=8, target_hidden_size=12).save_pretrained({str(directory)!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 137, done.stderr
    (left,) = [path for path in tmp_path.iterdir() if path.name.startswith(".head.saving-")]
    older = tmp_path / ".head.saving-k2j4x9_q"  # an older release's name (no process id)
    older.mkdir()
    in_progress = tmp_path / f".head.saving-{os.getpid()}-abc"  # a live process's save: left alone
    in_progress.mkdir()
    other = tmp_path / ".heads.saving-1-abc"  # another directory's staging
    other.mkdir()
    make_head("linear").save_pretrained(directory)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["head", in_progress.name, other.name])


def test_an_oversized_head_config_is_refused_before_anything_is_allocated(tmp_path, monkeypatch):
    make_head("mlp").save_pretrained(tmp_path)
    config = json.loads((tmp_path / hub.CONFIG_NAME).read_text())

    def allocates(*args, **kwargs):
        raise AssertionError("the head was built before its config was checked against the weights file")

    monkeypatch.setattr(DiversedHead, "_built_without_rng", classmethod(allocates))
    for size, message in (
        (10**12, r"`mlp_hidden_size` is 1000000000000, above 131072"),
        (100_000, r"do not fit.*net.1.weight: saved \(4, 20\), expected \(100000, 20\)"),
    ):
        (tmp_path / hub.CONFIG_NAME).write_text(json.dumps({**config, "mlp_hidden_size": size}))
        with pytest.raises(ValueError, match=message):
            DiversedHead.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="`target_hidden_size` is 200000, above 131072"):
        DiversedHeadConfig(draft_hidden_size=8, target_hidden_size=200_000)


def test_official_checkpoints_with_non_finite_weights_are_refused(tmp_path):
    import json

    (tmp_path / "ensemble_config.json").write_text(json.dumps({"draft_hidden_size": 2, "target_hidden_size": 3}))
    weight = torch.zeros(2, 5, dtype=torch.bfloat16)
    weight[1, 0] = float("nan")
    torch.save(
        {"summary.weight": weight, "summary.bias": torch.zeros(2, dtype=torch.bfloat16)}, tmp_path / "ensemble_head.bin"
    )
    with pytest.raises(ValueError, match="NaN or infinite values"):
        DiversedHead.from_official_checkpoint(tmp_path)


def test_a_load_fetches_and_reads_config_json_once(tmp_path, monkeypatch, offline):
    """ModelHubMixin fetches and parses config.json; nothing else resolves or opens it again (local dir and repo id)."""
    make_head("mlp").save_pretrained(tmp_path / "head")
    populate_cache(tmp_path / "cache", REPO_ID, tmp_path / "head")
    opened, downloaded = [], []
    real_open = io.open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith(hub.CONFIG_NAME):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    for module in (huggingface_hub, huggingface_hub.hub_mixin):
        real_download = module.hf_hub_download
        monkeypatch.setattr(
            module,
            "hf_hub_download",
            lambda *args, _real=real_download, **kwargs: (
                downloaded.append(kwargs["filename"]) or _real(*args, **kwargs)
            ),
        )
    DiversedHead.from_pretrained(tmp_path / "head")
    assert (len(opened), downloaded) == (1, [])
    opened.clear()
    DiversedHead.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache")
    assert (len(opened), downloaded) == (1, [hub.CONFIG_NAME, hub.WEIGHTS_NAME])


def test_the_mixin_writes_the_dataclass_config_and_the_hook_the_weights(tmp_path):
    head = make_head("linear")
    head._save_pretrained(tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == [hub.WEIGHTS_NAME]
    head.save_pretrained(tmp_path / "head")
    assert json.loads((tmp_path / "head" / hub.CONFIG_NAME).read_text()) == dataclasses.asdict(head.config)


def test_options_a_head_cannot_honour_are_refused(tmp_path):
    head = make_head("linear")
    head.save_pretrained(tmp_path / "head")
    other = {**dataclasses.asdict(head.config), "w_0": 0.9}
    with pytest.raises(TypeError, match=r"save_pretrained got `config=.*always saves its own config"):
        head.save_pretrained(tmp_path / "other", config=other)
    with pytest.raises(TypeError, match=r"push_to_hub got `config=.*always saves its own config"):
        head.push_to_hub(REPO_ID, config=DiversedHeadConfig(**other), token="hf_fake")
    head.save_pretrained(tmp_path / "same", config=head.config)  # its own config: nothing ignored
    with pytest.raises(ValueError, match=r"`mlp_hidden_size` is 64, but .* this head is 'linear'"):
        DiversedHead.for_pair(*make_pair("llama"), architecture="linear", mlp_hidden_size=64)
    with pytest.raises(ValueError, match=r"`revision='v1'` picks a version of a Hub repo, but .* is a local directory"):
        DiversedHead.from_pretrained(tmp_path / "head", revision="v1")
    mixin_from_pretrained = ModelHubMixin.from_pretrained.__func__  # the hook refuses what the mixin passes on
    with pytest.raises(TypeError, match=r"unexpected arguments \['architecture', 'scale'\]"):
        mixin_from_pretrained(DiversedHead, str(tmp_path / "head"), architecture="mlp", scale=2)
