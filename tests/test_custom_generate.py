"""DIVERSED as a Hub `custom_generate` repository: the folder shipped in the package runs from a local path on a
plain transformers model, follows transformers' documented layout, and `diversed-hf push --custom-generate` publishes
it (HfApi stubbed: nothing leaves the machine)."""

import argparse
import fnmatch
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
import yaml
from huggingface_hub import constants
from tiny_models import left_padded_batch, make_pair, prompt
from transformers import LlamaForCausalLM, dynamic_module_utils

from diversed_hf import DiversedGenerationMixin, DiversedHead, ExactVerifier, enable_diversed
from diversed_hf.cli import hub as hub_cli
from diversed_hf.generation import CUSTOM_GENERATE_REPO, diversed_generate

try:  # Python 3.11+; before, pytest's own dependency
    import tomllib
except ImportError:  # pragma: no cover
    import tomli as tomllib

REPO = Path(CUSTOM_GENERATE_REPO)
REPO_ID = "someone/diversed-custom-generate"


@pytest.fixture
def modules_cache(monkeypatch, tmp_path):
    """transformers copies remote code into its modules cache before importing it: a fresh one per test (transformers
    puts each on the import path; the tests leave that to it)."""
    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    for name in [m for m in sys.modules if m.startswith("transformers_modules")]:
        monkeypatch.delitem(sys.modules, name)


def test_custom_generate_runs_diversed_on_a_plain_model_from_a_local_path(modules_cache):
    target, draft = make_pair("llama", noise=0.3)
    assert not isinstance(target, DiversedGenerationMixin)
    _, input_ids, attention_mask = left_padded_batch([4, 9, 6])
    common = dict(attention_mask=attention_mask, do_sample=False, max_new_tokens=12)
    hub = dict(
        custom_generate=CUSTOM_GENERATE_REPO, trust_remote_code=True, assistant_model=draft, num_assistant_tokens=3
    )
    exact = target.generate(input_ids, verifier=ExactVerifier(), return_dict_in_generate=True, **hub, **common)
    assert torch.equal(exact.sequences, target.generate(input_ids, **common))  # lossless greedy = the target's
    assert exact.speculation.total_accepted > 0
    head = DiversedHead.for_pair(target, draft, w_0=0.3)
    with_head = target.generate(input_ids, diversed_head=head, **hub, **common)
    assert torch.equal(
        with_head,
        diversed_generate(
            target, input_ids, assistant_model=draft, diversed_head=head, num_assistant_tokens=3, **common
        ),
    )
    assert torch.equal(
        with_head,
        enable_diversed(make_pair("llama", noise=0.3)[0]).generate(
            input_ids, assistant_model=draft, diversed_head=head, num_assistant_tokens=3, **common
        ),
    )
    assert type(target) is LlamaForCausalLM, "the model is left as it was"
    assert torch.equal(
        target.generate(input_ids, **common, custom_generate=CUSTOM_GENERATE_REPO, trust_remote_code=True),
        target.generate(input_ids, **common),
    ), "without a head or verifier it is transformers' generate"


def test_a_model_repo_with_the_folder_takes_positional_input_ids(modules_cache, tmp_path):
    """From a model repository holding `custom_generate/`, `from_pretrained(..., trust_remote_code=True)` binds
    `model.generate = partial(generate, model=model)`: `model.generate(input_ids)` used to fail with "multiple
    values for argument 'model'"."""
    import shutil

    from transformers import AutoModelForCausalLM

    target, draft = make_pair("llama", noise=0.3)
    target.save_pretrained(tmp_path / "model")
    shutil.copytree(REPO / "custom_generate", tmp_path / "model" / "custom_generate")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", trust_remote_code=True)
    _, input_ids, attention_mask = left_padded_batch([4, 9, 6])
    common = dict(attention_mask=attention_mask, do_sample=False, max_new_tokens=12)
    ours = loaded.generate(
        input_ids,
        assistant_model=draft,
        verifier=ExactVerifier(),
        num_assistant_tokens=3,
        return_dict_in_generate=True,
        **common,
    )
    assert torch.equal(ours.sequences, target.generate(input_ids, **common))
    assert ours.speculation.total_accepted > 0


def test_custom_generate_needs_trust_remote_code(modules_cache):
    target, draft = make_pair("llama")
    with pytest.raises(ValueError, match="trust_remote_code"):
        target.generate(
            prompt(4),
            custom_generate=CUSTOM_GENERATE_REPO,
            trust_remote_code=False,
            assistant_model=draft,
            verifier=ExactVerifier(),
            max_new_tokens=4,
        )


def test_the_folder_follows_transformers_layout_and_ships_as_package_data():
    generate_py = REPO / "custom_generate" / "generate.py"
    assert generate_py.is_file() and "def generate(*args, **kwargs):" in generate_py.read_text()
    front_matter = (REPO / "README.md").read_text().split("---")[1]
    metadata = yaml.safe_load(front_matter)
    assert metadata["library_name"] == "transformers" and "custom_generate" in metadata["tags"]
    assert (REPO / "custom_generate" / "requirements.txt").read_text().split()[0].startswith("diversed_hf")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["diversed_hf"]
    package = REPO.parent
    for path in hub_cli.custom_generate_files():
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), f"{relative} is not package data"


def _stub_hub(monkeypatch):
    uploaded = {}

    def upload_folder(self, repo_id, folder_path, commit_message, allow_patterns=None, **kwargs):
        for path in Path(folder_path).rglob("*"):
            name = path.relative_to(folder_path).as_posix()
            if path.is_file() and any(fnmatch.fnmatch(name, pattern) for pattern in allow_patterns):
                uploaded[name] = path.read_text()
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
    return uploaded


def test_push_custom_generate_uploads_the_folder(monkeypatch):
    uploaded = _stub_hub(monkeypatch)
    url = hub_cli.push_custom_generate(REPO_ID, token="hf_fake")
    assert url == f"https://huggingface.co/{REPO_ID}/commit/abc"
    assert set(uploaded) - {"commit_message"} == {
        "README.md",
        "custom_generate/generate.py",
        "custom_generate/requirements.txt",
    }
    assert uploaded["custom_generate/generate.py"] == (REPO / "custom_generate" / "generate.py").read_text()


def test_push_command_takes_custom_generate_or_a_head_directory(monkeypatch, tmp_path, capsys):
    uploaded = _stub_hub(monkeypatch)
    parser = argparse.ArgumentParser(prog="diversed-hf")
    hub_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["push", "--custom-generate", "--repo-id", REPO_ID, "--token", "hf_fake"])
    assert args.func(args) == 0 and "custom_generate/generate.py" in uploaded
    assert capsys.readouterr().out.strip() == f"https://huggingface.co/{REPO_ID}/commit/abc"
    for argv, message in (
        (["push", "--repo-id", REPO_ID], "give a head DIR or --custom-generate"),
        (
            ["push", str(tmp_path), "--custom-generate", "--repo-id", REPO_ID],
            "give a head DIR or --custom-generate, not both",
        ),
    ):
        args = parser.parse_args(argv)
        with pytest.raises(ValueError, match=message):
            args.func(args)
