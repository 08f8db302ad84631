"""Heads as Hub repos: save -> strict load round trips, offline loading by repo id from a real cache layout,
model cards from result files, import of official DIVERSED checkpoints, pushing, and every bad input."""

import ast
import dataclasses
import hashlib
import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import ModelHubMixin, constants
from huggingface_hub.file_download import repo_folder_name
from safetensors.torch import load_file, save_file
from tiny_models import make_pair, prompt

import diversed_hf
from diversed_hf import DiversedHead, DiversedHeadConfig, enable_diversed
from diversed_hf.heads import cards, hub
from diversed_hf.heads.hub import HEAD_FORMAT_VERSION
from diversed_hf.verifiers import HeadVerifier

REPO_ID = "diversed-test/head-gsm8k"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TARGET_ID = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT_ID = "meta-llama/Llama-3.2-1B-Instruct"


def randomize(head, seed=0, scale=0.5):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    return head


def make_head(architecture="mlp", **kwargs):
    config = dict(
        draft_hidden_size=8,
        target_hidden_size=12,
        architecture=architecture,
        mlp_hidden_size=4,
        w_0=0.3,
        target_model_id=TARGET_ID,
        draft_model_id=DRAFT_ID,
        task="gsm8k",
    )
    config.update(kwargs)
    if architecture == "linear":
        config.pop("mlp_hidden_size")  # only the 'mlp' architecture has a hidden layer
    return randomize(DiversedHead(**config))


def hidden(batch=2, tokens=3, d_draft=8, d_target=12, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, tokens, d_draft, generator=generator), torch.randn(
        batch, tokens, d_target, generator=generator
    )


RESULTS = {
    "setting": {"task": "gsm8k", "temperature": 1.0, "num_draft_tokens": 5, "num_samples": 200},
    "rows": [
        {
            "method": "autoregressive",
            "quality": 0.67,
            "quality_metric": "exact_match",
            "seconds_per_sample": 4.0,
            "tokens_per_second": 30.0,
        },
        {"method": "sd", "acceptance_rate": 0.446, "quality": 0.67, "seconds_per_sample": 2.5, "tokens_per_round": 1.9},
        {
            "method": "diversed",
            "acceptance_rate": 0.726,
            "quality": 0.665,
            "seconds_per_sample": 1.6,
            "tokens_per_round": 3.1,
            "extra": 1,
        },
    ],
}


@pytest.fixture
def saved(tmp_path):
    head = make_head()
    directory = tmp_path / "head"
    head.save_pretrained(directory)
    return head, directory


@pytest.fixture
def offline(monkeypatch):
    """HF_HUB_OFFLINE=1 as a user sets it: in the environment, after huggingface_hub was imported."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.is_offline()


def populate_cache(cache_dir: Path, repo_id: str, source: Path, commit: str = COMMIT, refs=("main",), skip=()):
    """Lay ``source``'s files out as huggingface_hub's cache does: blobs by hash, snapshot symlinks, refs."""
    repo = Path(cache_dir) / repo_folder_name(repo_id=repo_id, repo_type="model")
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.name in skip:
            continue
        content = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


# Round trips -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("architecture", ["linear", "mlp"])
def test_round_trip_gives_identical_outputs(tmp_path, architecture):
    head = make_head(architecture)
    head.save_pretrained(tmp_path / "head")
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    loaded = DiversedHead.from_pretrained(tmp_path / "head")
    assert loaded.config == head.config
    assert not loaded.training
    draft_hidden, target_hidden = hidden()
    assert torch.equal(loaded(draft_hidden, target_hidden), head(draft_hidden, target_hidden))
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_config_json_records_the_pair_and_task(saved):
    head, directory = saved
    config = json.loads((directory / "config.json").read_text())
    assert config == dataclasses.asdict(head.config)
    for key, value in dict(
        architecture="mlp",
        draft_hidden_size=8,
        target_hidden_size=12,
        mixing="probs",
        w_0=0.3,
        target_model_id=TARGET_ID,
        draft_model_id=DRAFT_ID,
        task="gsm8k",
        format_version=HEAD_FORMAT_VERSION,
    ).items():
        assert config[key] == value, key
    assert sorted(load_file(directory / "model.safetensors")) == sorted(head.state_dict())


def test_round_trip_keeps_a_bfloat16_head_and_honours_dtype_and_device(tmp_path):
    head = make_head().to(torch.bfloat16)
    head.save_pretrained(tmp_path)
    loaded = DiversedHead.from_pretrained(tmp_path)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    draft_hidden, target_hidden = (t.to(torch.bfloat16) for t in hidden())
    assert torch.equal(loaded(draft_hidden, target_hidden), head(draft_hidden, target_hidden))
    upcast = DiversedHead.from_pretrained(str(tmp_path), dtype=torch.float32, device="cpu")
    assert next(upcast.parameters()).dtype == torch.float32


def test_existing_constructors_still_work():
    config = DiversedHeadConfig(draft_hidden_size=4, target_hidden_size=6)
    assert DiversedHead(config).config == DiversedHead(draft_hidden_size=4, target_hidden_size=6).config
    assert isinstance(DiversedHead(config), huggingface_hub.ModelHubMixin)
    target, draft = make_pair("llama")
    assert DiversedHead.for_pair(target, draft).config.target_hidden_size == 32


def test_saving_and_loading_leave_the_global_rng_alone(tmp_path):
    """A trainer checkpointing (and resuming) through save_pretrained / from_pretrained must keep its random stream."""
    head = make_head()
    state = torch.get_rng_state()
    head.save_pretrained(tmp_path, results=RESULTS)
    DiversedHead.from_pretrained(tmp_path)
    assert torch.equal(torch.get_rng_state(), state)
    write_official_checkpoint(tmp_path / "official")
    state = torch.get_rng_state()
    DiversedHead.from_official_checkpoint(tmp_path / "official")
    assert torch.equal(torch.get_rng_state(), state)


def test_the_library_never_prints(tmp_path, capsys, monkeypatch):
    head = make_head()
    head.save_pretrained(tmp_path / "head", results=RESULTS, training_config={"lr": 5e-4})
    DiversedHead.from_pretrained(tmp_path / "head")
    cards.write_card(tmp_path / "head")
    head.generate_model_card()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(PermissionError):
        head.push_to_hub("org/name")
    with pytest.raises(FileNotFoundError):
        DiversedHead.from_pretrained("org/not-cached", cache_dir=tmp_path / "cache", local_files_only=True)
    captured = capsys.readouterr()
    assert captured.out == ""


def test_the_mixin_does_the_work_and_the_head_fills_its_hooks(tmp_path, monkeypatch):
    """Saving, loading and pushing run huggingface_hub.ModelHubMixin's public methods; the head only fills the hooks."""
    assert isinstance(make_head(), ModelHubMixin)
    for hook in ("_save_pretrained", "_from_pretrained", "generate_model_card"):
        assert hook in vars(DiversedHead), hook
    calls = []

    def spy(name):
        original = vars(ModelHubMixin)[name]
        if isinstance(original, classmethod):
            return classmethod(
                lambda cls, *args, **kwargs: calls.append(name) or original.__func__(cls, *args, **kwargs)
            )
        return lambda self, *args, **kwargs: calls.append(name) or original(self, *args, **kwargs)

    for name in ("save_pretrained", "from_pretrained", "push_to_hub"):
        monkeypatch.setattr(ModelHubMixin, name, spy(name))
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "create_repo",
        lambda self, repo_id, **kw: huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}"),
    )
    monkeypatch.setattr(
        huggingface_hub.HfApi, "upload_folder", lambda self, repo_id, **kw: f"https://huggingface.co/{repo_id}/commit/1"
    )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    head = make_head()
    head.save_pretrained(tmp_path / "head")
    DiversedHead.from_pretrained(tmp_path / "head")
    head.push_to_hub(REPO_ID, token="hf_fake")
    assert calls == ["save_pretrained", "from_pretrained", "push_to_hub", "save_pretrained"]


def test_the_mixins_own_from_pretrained_loads_strictly_with_identical_outputs(tmp_path):
    """Called directly, huggingface_hub's ModelHubMixin.from_pretrained loads through the head's hook: same outputs,
    same strictness."""
    mixin_from_pretrained = ModelHubMixin.from_pretrained.__func__
    head = make_head("mlp")
    head.save_pretrained(tmp_path)
    loaded = mixin_from_pretrained(DiversedHead, str(tmp_path))
    assert type(loaded) is DiversedHead and loaded.config == head.config and not loaded.training
    assert torch.equal(loaded(*hidden()), head(*hidden()))
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, "extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected \['extra.weight'\].*strict=False"):
        mixin_from_pretrained(DiversedHead, str(tmp_path))
    assert torch.equal(mixin_from_pretrained(DiversedHead, str(tmp_path), strict=False)(*hidden()), head(*hidden()))


def test_saving_again_rewrites_the_card(tmp_path):
    make_head().save_pretrained(tmp_path)
    assert "No benchmark results" in (tmp_path / "README.md").read_text()
    make_head().save_pretrained(tmp_path, results=RESULTS)
    assert "72.6 %" in (tmp_path / "README.md").read_text()
    make_head().save_pretrained(tmp_path)  # the same head again: keeps the results.json already there
    assert "72.6 %" in (tmp_path / "README.md").read_text() and (tmp_path / "results.json").is_file()


@pytest.mark.parametrize("other", [dict(w_0=0.7), dict(seed=5)], ids=["other config", "other weights"])
def test_saving_another_head_drops_the_results_of_the_previous_one(tmp_path, other, caplog):
    make_head().save_pretrained(tmp_path, results=RESULTS, training_config={"learning_rate": 0.1})
    seed = other.pop("seed", 0)
    with caplog.at_level("WARNING", logger="diversed_hf.heads.head"):
        randomize(make_head(**other), seed=seed).save_pretrained(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "72.6 %" not in text and "No benchmark results" in text and "learning_rate" not in text
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "training_config.json").exists()
    assert "removed ['results.json', 'training_config.json']" in caplog.text
    if "w_0" in other:
        assert "| initial weight on the target `w_0` | 0.7 |" in text


# Import graph -------------------------------------------------------------------------------------------

LIBRARY_MODULES = ("heads.hub", "heads.cards", "heads.head", "training.checkpoint")


def imports_of(module: str) -> set[str]:
    """The diversed_hf modules ``module`` imports anywhere (function bodies too), except under ``if TYPE_CHECKING:``."""
    path = Path(diversed_hf.__file__).parent.joinpath(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for statement in branch.body
        for node in ast.walk(statement)
    }
    package = ["diversed_hf", *module.split(".")[:-1]]
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found |= {target} | {f"{target}.{alias.name}" for alias in node.names}
    return {name.removeprefix("diversed_hf.") for name in found if name.startswith("diversed_hf.")}


def test_library_modules_import_one_way_and_never_the_testbed():
    graph = {module: imports_of(module) & set(LIBRARY_MODULES) for module in LIBRARY_MODULES}
    assert graph["heads.hub"] == set()
    assert graph["heads.cards"] == {"heads.hub"}
    assert graph["heads.head"] == {"heads.hub", "heads.cards"}
    for module in LIBRARY_MODULES:
        assert not any(name == "testbed" or name.startswith("testbed.") for name in imports_of(module)), module


@pytest.mark.parametrize(
    "module",
    ["diversed_hf.heads.hub", "diversed_hf.heads.cards", "diversed_hf.heads.head", "diversed_hf.training.checkpoint"],
)
def test_importing_a_library_module_does_not_import_the_testbed(module):
    code = f"import sys, {module}; sys.exit(3 if any(m.startswith('diversed_hf.testbed') for m in sys.modules) else 0)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:] or f"importing {module} imported diversed_hf.testbed"


# Strict loading and damaged files --------------------------------------------------------------------


def test_unexpected_weights_are_an_error(saved):
    _, directory = saved
    weights = load_file(directory / "model.safetensors")
    save_file({**weights, "extra.weight": torch.zeros(2)}, directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected \['extra.weight'\]"):
        DiversedHead.from_pretrained(directory)


def test_missing_weights_are_an_error_unless_strict_false(saved, caplog):
    head, directory = saved
    weights = load_file(directory / "model.safetensors")
    del weights["net.0.weight"]  # the LayerNorm's weight
    save_file(weights, directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing \['net.0.weight'\].*strict=False"):
        DiversedHead.from_pretrained(directory)
    with caplog.at_level(logging.WARNING, logger="diversed_hf.heads.head"):
        loaded = DiversedHead.from_pretrained(directory, strict=False)
    assert "missing ['net.0.weight']" in caplog.text
    assert torch.equal(loaded.net[1].weight, head.net[1].weight)


def test_weights_of_another_head_are_an_error(saved, tmp_path):
    _, directory = saved
    make_head(mlp_hidden_size=6).save_pretrained(tmp_path / "other")
    (directory / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"do not fit.*net.1.weight: saved \(6, 20\), expected \(4, 20\)"):
        DiversedHead.from_pretrained(directory)


def test_missing_weights_file(saved):
    _, directory = saved
    (directory / "model.safetensors").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"`model.safetensors` not found in the head directory.*save_pretrained"
    ):
        DiversedHead.from_pretrained(directory)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupted_weights_file(saved, damage):
    _, directory = saved
    path = directory / "model.safetensors"
    content = path.read_bytes()
    path.write_bytes({"truncate": content[: len(content) // 2], "garbage": b"\x07" * 64, "empty": b""}[damage])
    with pytest.raises(ValueError, match=r"not a readable safetensors file.*truncated or corrupted"):
        DiversedHead.from_pretrained(directory)


def edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("field", ["mixing", "architecture", "draft_hidden_size", "format_version", "mlp_hidden_size"])
def test_config_missing_a_field(saved, field):
    _, directory = saved
    edit_config(directory, **{field: None})
    with pytest.raises(ValueError, match=rf"missing the fields \['{field}'\]"):
        DiversedHead.from_pretrained(directory)


def test_config_from_a_newer_format_version(saved):
    _, directory = saved
    edit_config(directory, format_version=HEAD_FORMAT_VERSION + 1, new_field_of_the_future=True)
    with pytest.raises(ValueError, match=r"newer than this diversed_hf supports.*pip install -U diversed_hf"):
        DiversedHead.from_pretrained(directory)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(architecture="transformer"), r"`architecture` must be one of \('linear', 'mlp'\), got 'transformer'"),
        (dict(mixing="geometric"), r"`mixing` must be one of \('probs', 'logits'\), got 'geometric'"),
        (dict(format_version="1"), r"`format_version` must be a positive integer"),
        (dict(surprise=1), r"Unknown DiversedHeadConfig fields \['surprise'\]"),
        (dict(w_0=1.0), r"`w_0` must be in the open interval"),
    ],
)
def test_invalid_config_values(saved, changes, message):
    _, directory = saved
    edit_config(directory, **changes)
    with pytest.raises(ValueError, match=message):
        DiversedHead.from_pretrained(directory)


def test_config_that_is_not_json_or_not_a_head(saved, tmp_path):
    _, directory = saved
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DiversedHead.from_pretrained(directory)
    target, _ = make_pair("llama")
    target.save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match=r"transformers model config \(model_type='llama'\)"):
        DiversedHead.from_pretrained(tmp_path / "model")


def test_names_that_are_neither_directories_nor_repo_ids(saved):
    _, directory = saved
    with pytest.raises(ValueError, match="neither an existing directory nor a valid Hub repo id"):
        DiversedHead.from_pretrained("./no/such/head")
    with pytest.raises(ValueError, match="is a file; pass the head's directory"):
        DiversedHead.from_pretrained(directory / "config.json")
    with pytest.raises(TypeError, match="unexpected arguments"):
        DiversedHead.from_pretrained(directory, architecture="linear")
    with pytest.raises(TypeError, match=r"save_pretrained got unexpected arguments \['result'\]"):
        make_head().save_pretrained(directory, result=RESULTS)


# Loading by repo id from the cache, offline --------------------------------------------------------


def test_offline_load_by_repo_id_from_the_cache(saved, tmp_path, offline):
    head, directory = saved
    populate_cache(tmp_path / "cache", REPO_ID, directory, refs=("main", "v1"))
    draft_hidden, target_hidden = hidden()
    for revision in (None, "main", "v1", COMMIT):
        loaded = DiversedHead.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache", revision=revision)
        assert loaded.config == head.config
        assert torch.equal(loaded(draft_hidden, target_hidden), head(draft_hidden, target_hidden))


def test_offline_load_from_the_default_cache_with_huggingface_hubs_own_switch(saved, tmp_path, monkeypatch):
    head, directory = saved
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 before import sets
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "default-cache"))
    populate_cache(tmp_path / "default-cache", REPO_ID, directory)
    loaded = DiversedHead.from_pretrained(REPO_ID, token="hf_unused")
    assert torch.equal(loaded(*hidden()), head(*hidden()))


def test_repo_not_in_the_offline_cache_fails_fast_and_clearly(tmp_path, offline, monkeypatch):
    # No timer (a busy machine is slow): the network is cut, every attempt failing at once, so the test depends
    # neither on this machine's network nor on its load. (huggingface_hub itself still looks up its user-agent
    # registry when HF_HUB_OFFLINE is set after import, as here.)
    def no_network(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(
        FileNotFoundError,
        match=r"not in the Hugging Face cache .* offline mode is on \(HF_HUB_OFFLINE=1\).*hf download",
    ):
        DiversedHead.from_pretrained("diversed-test/never-downloaded", cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="local_files_only=True"):
        DiversedHead.from_pretrained(
            "diversed-test/never-downloaded", cache_dir=tmp_path / "cache", local_files_only=True
        )
    with pytest.raises(ValueError, match="force_download=True"):
        DiversedHead.from_pretrained(
            "diversed-test/never-downloaded", cache_dir=tmp_path / "cache", force_download=True
        )


def test_cached_repo_without_weights_or_revision(saved, tmp_path, offline):
    _, directory = saved
    populate_cache(tmp_path / "cache", REPO_ID, directory, skip=("model.safetensors",))
    with pytest.raises(
        FileNotFoundError,
        match=r"`model.safetensors` of head 'diversed-test/head-gsm8k' is not in the Hugging Face cache",
    ):
        DiversedHead.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match=r"at revision 'v2' is not in the Hugging Face cache"):
        DiversedHead.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache", revision="v2")


# generate checks the head against its models --------------------------------------------------------


def test_generate_checks_a_loaded_head_against_the_models(tmp_path, caplog):
    target, draft = make_pair("llama")
    target = enable_diversed(target)
    target.config._name_or_path, draft.config._name_or_path = "my-org/target", "my-org/draft"
    DiversedHead(
        draft_hidden_size=32, target_hidden_size=32, target_model_id="org/trained-target", draft_model_id="my-org/draft"
    ).save_pretrained(tmp_path / "ok")
    head = DiversedHead.from_pretrained(tmp_path / "ok")
    with caplog.at_level(logging.WARNING, logger="diversed_hf.generation"):
        target.generate(prompt(4), assistant_model=draft, diversed_head=head, max_new_tokens=4, do_sample=False)
    assert "'org/trained-target'" in caplog.text and "'my-org/target'" in caplog.text
    assert "draft model" not in caplog.text  # the draft's id matches

    DiversedHead(draft_hidden_size=16, target_hidden_size=32).save_pretrained(tmp_path / "wrong")
    with pytest.raises(ValueError, match=r"draft 16, target 32.*draft 32, target 32"):
        target.generate(
            prompt(4),
            assistant_model=draft,
            diversed_head=DiversedHead.from_pretrained(tmp_path / "wrong"),
            max_new_tokens=4,
        )


# Official DIVERSED checkpoints ---------------------------------------------------------------------


def write_official_checkpoint(directory: Path, d_draft=8, d_target=12, seed=0, **config_overrides):
    """A checkpoint in the exact format of the official code: torch.save of EnsembleHead.state_dict() (bf16)."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    state = {
        "summary.weight": torch.randn(2, d_draft + d_target, generator=generator).to(torch.bfloat16),
        "summary.bias": torch.randn(2, generator=generator).to(torch.bfloat16),
    }
    torch.save(state, directory / "ensemble_head.bin")
    config = {
        "target_model_path": "meta-llama/Llama-3.1-8B-Instruct",
        "draft_model_path": "meta-llama/Llama-3.2-1B-Instruct",
        "target_hidden_size": d_target,
        "draft_hidden_size": d_draft,
        **config_overrides,
    }
    (directory / "ensemble_config.json").write_text(json.dumps(config))
    return state


def official_weights(state, draft_hidden, target_hidden):
    """The official forward: softmax(summary(cat([h_draft, h_target]))) in float32; (w_draft, w_target)."""
    features = torch.cat([draft_hidden, target_hidden], dim=-1).float()  # (batch, tokens, d_draft + d_target)
    logits = torch.nn.functional.linear(
        features, state["summary.weight"].float(), state["summary.bias"].float()
    )  # (..., 2)
    weights = logits.softmax(dim=-1)  # (batch, tokens, 2)
    return weights[..., 0], weights[..., 1]


def test_official_import_reproduces_the_official_formula(tmp_path):
    state = write_official_checkpoint(tmp_path / "official")
    head = DiversedHead.from_official_checkpoint(tmp_path / "official", task="cnn_dailymail")
    assert head.config.mixing == "logits" and head.config.architecture == "linear" and head.config.w_0 == 0.5
    assert (head.config.target_model_id, head.config.draft_model_id) == (TARGET_ID, DRAFT_ID)
    draft_hidden, target_hidden = hidden(batch=4, tokens=7, seed=3)
    draft_hidden, target_hidden = 3 * draft_hidden, 3 * target_hidden  # spread the weights over (0, 1)
    w_draft, w_target = official_weights(state, draft_hidden, target_hidden)
    assert w_target.min() < 0.2 and w_target.max() > 0.8
    torch.testing.assert_close(head(draft_hidden, target_hidden), w_target, atol=1e-6, rtol=0)

    # ... and the verification distribution is the official logit mix softmax(w_d z_q + w_p z_p).
    generator = torch.Generator().manual_seed(4)
    draft_logits, target_logits = torch.randn(2, 4, 7, 50, generator=generator).double().unbind(0)  # (batch, N, vocab)
    expected = (
        w_draft.double().unsqueeze(-1) * draft_logits + w_target.double().unsqueeze(-1) * target_logits
    ).softmax(-1)
    verify_probs, target_weight = HeadVerifier(head=head).verification_probs(
        draft_logits.softmax(-1), target_logits.softmax(-1), draft_hidden=draft_hidden, target_hidden=target_hidden
    )
    torch.testing.assert_close(target_weight, w_target.double(), atol=1e-6, rtol=0)
    torch.testing.assert_close(verify_probs, expected, atol=1e-6, rtol=0)

    # The imported head saves and loads like any other.
    head.save_pretrained(tmp_path / "converted")
    assert torch.equal(
        DiversedHead.from_pretrained(tmp_path / "converted")(draft_hidden, target_hidden),
        head(draft_hidden, target_hidden),
    )


def test_official_import_overrides_and_unknown_paths(tmp_path):
    write_official_checkpoint(tmp_path / "official", target_model_path="unknown")
    head = DiversedHead.from_official_checkpoint(
        tmp_path / "official" / "ensemble_head.bin", draft_model_id="org/draft"
    )
    assert head.config.target_model_id is None and head.config.draft_model_id == "org/draft"


def test_official_import_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory"):
        DiversedHead.from_official_checkpoint(tmp_path / "nothing")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "ensemble_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="`ensemble_head.bin` not found"):
        DiversedHead.from_official_checkpoint(tmp_path / "half")

    write_official_checkpoint(tmp_path / "sizes", draft_hidden_size=9)
    with pytest.raises(ValueError, match=r"summary.weight \(2, 20\).*needs \(2, 21\)"):
        DiversedHead.from_official_checkpoint(tmp_path / "sizes")

    write_official_checkpoint(tmp_path / "nosize", draft_hidden_size=None)
    with pytest.raises(ValueError, match="positive integer `draft_hidden_size`"):
        DiversedHead.from_official_checkpoint(tmp_path / "nosize")

    write_official_checkpoint(tmp_path / "keys")
    torch.save({"summary.0.weight": torch.zeros(2, 20)}, tmp_path / "keys" / "ensemble_head.bin")
    with pytest.raises(ValueError, match=r"exactly `summary.weight` and `summary.bias`.*summary.0.weight"):
        DiversedHead.from_official_checkpoint(tmp_path / "keys")

    (tmp_path / "keys" / "ensemble_head.bin").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a readable torch state dict"):
        DiversedHead.from_official_checkpoint(tmp_path / "keys")
