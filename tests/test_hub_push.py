"""Pushing heads to the Hub (HfApi stubbed: nothing leaves the machine) and the push / card commands."""

import argparse
import json
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import constants
from test_hub import REPO_ID, RESULTS, make_head, offline, saved  # noqa: F401 - offline and saved are fixtures

from diversed_hf import cli
from diversed_hf.cli import hub as hub_cli
from diversed_hf.heads import hub

try:  # the HTTP client huggingface_hub uses: httpx2 in 2.x, httpx in 1.x
    import httpx2 as http_client
except ImportError:  # pragma: no cover
    import httpx as http_client


def test_push_to_hub_uploads_results_and_training_config_with_a_card_for_the_repo(monkeypatch):
    uploaded = {}

    def upload_folder(self, repo_id, folder_path, commit_message, **kwargs):
        uploaded.update({p.name: p.read_text(errors="replace") for p in Path(folder_path).iterdir()})
        uploaded["commit_message"] = commit_message
        return f"https://huggingface.co/{repo_id}/commit/abc"

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "create_repo",
        lambda self, repo_id, **kw: huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}"),
    )
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    url = make_head().push_to_hub(REPO_ID, token="hf_fake", results=RESULTS, training_config={"lr": 5e-4})
    assert url == f"https://huggingface.co/{REPO_ID}/commit/abc"
    assert set(uploaded) == {
        "config.json",
        "model.safetensors",
        "README.md",
        "results.json",
        "training_config.json",
        "commit_message",
    }
    assert json.loads(uploaded["results.json"]) == RESULTS and json.loads(uploaded["training_config.json"]) == {
        "lr": 5e-4
    }
    assert f'DiversedHead.from_pretrained("{REPO_ID}")' in uploaded["README.md"] and "72.6 %" in uploaded["README.md"]
    assert uploaded["commit_message"] == hub.DEFAULT_COMMIT_MESSAGE


# Pushing -------------------------------------------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if anything tries to create a repo or upload."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the Hub was contacted")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", forbidden)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", forbidden)


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-here"))
    assert huggingface_hub.get_token() is None


def test_push_without_a_token_fails_before_any_network_call(saved, no_token, no_network):
    head, directory = saved
    with pytest.raises(PermissionError, match=r"needs a write token.*hf auth login.*HF_TOKEN"):
        head.push_to_hub(REPO_ID, token=None)
    with pytest.raises(PermissionError, match="needs a write token"):
        hub_cli.push_directory(directory, REPO_ID)
    with pytest.raises(PermissionError, match="needs a write token"):
        head.save_pretrained(directory, push_to_hub=True, repo_id=REPO_ID)
    with pytest.raises(PermissionError, match="needs a write token"):
        run_cli(["push", str(directory), "--repo-id", REPO_ID])


def test_push_names_the_repo_id_then_the_folder_before_the_token(saved, tmp_path, no_token, no_network):
    """Without a token, a bad repo id or a folder without a head is still named first: fixing the token would not
    have been enough."""
    _, directory = saved
    with pytest.raises(ValueError, match="`repo_id` 'not a repo id' is not a valid Hub repo id"):
        hub_cli.push_directory(directory, "not a repo id")
    with pytest.raises((FileNotFoundError, OSError, ValueError), match="nowhere"):
        hub_cli.push_directory(tmp_path / "nowhere", REPO_ID)
    with pytest.raises(PermissionError, match="needs a write token"):
        hub_cli.push_directory(directory, REPO_ID)


def test_push_offline_fails_before_any_network_call(saved, offline, no_network):
    head, _ = saved
    with pytest.raises(ConnectionError, match=r"offline mode is on \(HF_HUB_OFFLINE=1\)"):
        head.push_to_hub(REPO_ID, token="hf_fake")


def test_push_without_network_gives_a_clear_error(saved, monkeypatch):
    head, _ = saved

    def unreachable(self, *args, **kwargs):
        raise http_client.ConnectError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", unreachable)
    with pytest.raises(
        ConnectionError, match=r"Could not reach the Hub .* to push 'diversed-test/head-gsm8k'.*network"
    ):
        head.push_to_hub(REPO_ID, token="hf_fake")


def test_push_uploads_the_repo_files_with_a_card_for_the_repo(saved, tmp_path, monkeypatch):
    """What reaches upload_folder: the staged files, the card naming the repo (HfApi stubbed, nothing leaves)."""
    _, directory = saved
    (directory / "results.json").write_text(json.dumps(RESULTS))
    (directory / "notes.txt").write_text("not part of the repo")
    uploaded = {}

    def create_repo(self, repo_id, **kwargs):
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, repo_id, folder_path, allow_patterns, **kwargs):
        uploaded.update({p.name: p.read_text(errors="replace") for p in Path(folder_path).iterdir()})
        uploaded["allow_patterns"] = allow_patterns
        return f"https://huggingface.co/{repo_id}/commit/abc"

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    url = hub_cli.push_directory(directory, REPO_ID, token="hf_fake")
    assert url.endswith("/commit/abc")
    assert set(uploaded) == {"config.json", "model.safetensors", "README.md", "results.json", "allow_patterns"}
    assert f'DiversedHead.from_pretrained("{REPO_ID}")' in uploaded["README.md"] and "72.6 %" in uploaded["README.md"]
    assert "notes.txt" not in uploaded["allow_patterns"]


def test_push_refuses_a_broken_directory_and_a_bad_repo_id(saved, no_network):
    _, directory = saved
    (directory / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="corrupted"):
        hub_cli.push_directory(directory, REPO_ID, token="hf_fake")
    with pytest.raises(ValueError, match="not a valid Hub repo id"):
        hub.push_folder(directory, "org/name/extra", token="hf_fake")


# CLI -----------------------------------------------------------------------------------------------


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="diversed-hf")
    hub_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_registers_push_and_card():
    assert "diversed_hf.cli.hub" in cli.COMMAND_MODULES
    parser = argparse.ArgumentParser()
    hub_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["push", "some/dir", "--repo-id", "org/name"])
    assert (args.directory, args.repo_id) == ("some/dir", "org/name")
    with pytest.raises(SystemExit):
        parser.parse_args(["push", "some/dir"])  # --repo-id is required
