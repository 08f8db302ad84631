"""Heads as Hub repos: save -> strict load round trips, offline loading by repo id from a real cache layout,
model cards from result files, import of official DIVERSED checkpoints, pushing, and every bad input."""

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import ModelCard, constants
from huggingface_hub.file_download import repo_folder_name
from safetensors.torch import load_file, save_file

from diversed_hf import DiversedHead, DiversedHeadConfig, enable_diversed
from diversed_hf import cards, cli, hub, hub_cli
from diversed_hf.head import HEAD_FORMAT_VERSION
from diversed_hf.verifiers import HeadVerifier
from tiny_models import make_pair, prompt

try:  # the HTTP client huggingface_hub uses: httpx2 in 2.x, httpx in 1.x
    import httpx2 as http_client
except ImportError:  # pragma: no cover
    import httpx as http_client

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
    return randomize(DiversedHead(**config))


def hidden(batch=2, tokens=3, d_draft=8, d_target=12, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, tokens, d_draft, generator=generator), torch.randn(batch, tokens, d_target, generator=generator)


RESULTS = {
    "setting": {"task": "gsm8k", "temperature": 1.0, "num_draft_tokens": 5, "num_samples": 200},
    "rows": [
        {"method": "autoregressive", "quality": 0.67, "quality_metric": "exact_match", "seconds_per_sample": 4.0, "tokens_per_second": 30.0},
        {"method": "sd", "acceptance_rate": 0.446, "quality": 0.67, "seconds_per_sample": 2.5, "tokens_per_round": 1.9},
        {"method": "diversed", "acceptance_rate": 0.726, "quality": 0.665, "seconds_per_sample": 1.6, "tokens_per_round": 3.1, "extra": 1},
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
    assert config == head.config.to_dict()
    for key, value in dict(
        architecture="mlp", draft_hidden_size=8, target_hidden_size=12, mixing="probs", w_0=0.3,
        target_model_id=TARGET_ID, draft_model_id=DRAFT_ID, task="gsm8k", format_version=HEAD_FORMAT_VERSION,
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
    with caplog.at_level(logging.WARNING, logger="diversed_hf.head"):
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
    with pytest.raises(FileNotFoundError, match=r"`model.safetensors` not found in the head directory.*save_pretrained"):
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


def test_repo_not_in_the_offline_cache_fails_fast_and_clearly(tmp_path, offline):
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"not in the Hugging Face cache .* offline mode is on \(HF_HUB_OFFLINE=1\).*hf download"):
        DiversedHead.from_pretrained("diversed-test/never-downloaded", cache_dir=tmp_path / "cache")
    assert time.monotonic() - start < 2.0, "offline failure must not wait on the network"
    with pytest.raises(FileNotFoundError, match="local_files_only=True"):
        DiversedHead.from_pretrained("diversed-test/never-downloaded", cache_dir=tmp_path / "cache", local_files_only=True)
    with pytest.raises(ValueError, match="force_download=True"):
        DiversedHead.from_pretrained("diversed-test/never-downloaded", cache_dir=tmp_path / "cache", force_download=True)


def test_cached_repo_without_weights_or_revision(saved, tmp_path, offline):
    _, directory = saved
    populate_cache(tmp_path / "cache", REPO_ID, directory, skip=("model.safetensors",))
    with pytest.raises(FileNotFoundError, match=r"`model.safetensors` of head 'diversed-test/head-gsm8k' is not in the Hugging Face cache"):
        DiversedHead.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match=r"at revision 'v2' is not in the Hugging Face cache"):
        DiversedHead.from_pretrained(REPO_ID, cache_dir=tmp_path / "cache", revision="v2")


# generate checks the head against its models --------------------------------------------------------


def test_generate_checks_a_loaded_head_against_the_models(tmp_path, caplog):
    target, draft = make_pair("llama")
    target = enable_diversed(target)
    target.config._name_or_path, draft.config._name_or_path = "my-org/target", "my-org/draft"
    DiversedHead(draft_hidden_size=32, target_hidden_size=32, target_model_id="org/trained-target", draft_model_id="my-org/draft").save_pretrained(tmp_path / "ok")
    head = DiversedHead.from_pretrained(tmp_path / "ok")
    with caplog.at_level(logging.WARNING, logger="diversed_hf.generation"):
        target.generate(prompt(4), assistant_model=draft, diversed_head=head, max_new_tokens=4, do_sample=False)
    assert "'org/trained-target'" in caplog.text and "'my-org/target'" in caplog.text
    assert "draft model" not in caplog.text  # the draft's id matches

    DiversedHead(draft_hidden_size=16, target_hidden_size=32).save_pretrained(tmp_path / "wrong")
    with pytest.raises(ValueError, match=r"draft 16, target 32.*draft 32, target 32"):
        target.generate(prompt(4), assistant_model=draft, diversed_head=DiversedHead.from_pretrained(tmp_path / "wrong"), max_new_tokens=4)


# Model cards ---------------------------------------------------------------------------------------


def test_card_renders_real_metrics_from_a_result_file(tmp_path):
    head = make_head()
    (tmp_path / "bench.json").write_text(json.dumps(RESULTS))
    head.save_pretrained(tmp_path / "head", results=tmp_path / "bench.json", training_config={"lr": 5e-4, "rl": {"clip": 0.2}})
    assert json.loads((tmp_path / "head" / "results.json").read_text()) == RESULTS
    card = ModelCard.load(tmp_path / "head" / "README.md")
    text = card.text
    assert "| method | acceptance | accuracy (%) | time (s / sample) | tokens / s | tokens / round | speedup vs target | speedup vs SD |" in text
    assert "| sd | 44.6 % | 67.00 | 2.5 | - | 1.90 | 1.60x | 1.00x |" in text
    assert "| **diversed** | **72.6 %** | **66.50** | **1.6** | **-** | **3.10** | **2.50x** | **1.56x** |" in text
    assert "Setting: task = gsm8k, temperature = 1.0, num_draft_tokens = 5, num_samples = 200." in text
    assert "| `rl.clip` | 0.2 |" in text and "| `lr` | 0.0005 |" in text
    assert "num_assistant_tokens=5" in text
    for section in ("## Model pair", "## Task and training data", "## Usage", "## Limitations", "## Citation"):
        assert section in text
    assert "Task-dependent" in text and "trades bias for acceptance" in text and "arXiv" in text
    assert "openai/gsm8k" in text


def test_card_reads_the_per_task_file_diversed_hf_bench_writes(tmp_path):
    bench = {
        "setting": {"temperature": 1.0, "num_draft_tokens": 4, "max_new_tokens": 64, "task": "arith", "quality_metric": "exact_match"},
        "rows": [
            {"method": "target-only", "family": "target-only", "quality": 0.9, "quality_stderr": 0.02, "acceptance_rate": None,
             "seconds_per_sample": 0.8, "tokens_per_second": 50.0, "tokens_per_round": 1.0, "num_prompts": 64},
            {"method": "sd", "family": "sd", "quality": 0.9, "acceptance_rate": 0.5, "seconds_per_sample": 0.5},
            {"method": "static:0.5", "family": "static-ensemble", "quality": 0.8, "acceptance_rate": 0.7, "seconds_per_sample": 0.4},
            {"method": "head", "family": "diversed", "quality": 0.88, "acceptance_rate": 0.8, "seconds_per_sample": 0.25},
        ],
    }
    text = make_head(task="arith").generate_model_card(results=bench).text
    assert "| exact match" not in text and "accuracy (%)" in text
    assert "| static:0.5 | 70.0 % | 80.00 | 0.4 | - | - | 2.00x | 1.25x |" in text
    assert "| **head** | **80.0 %** | **88.00** | **0.25** | **-** | **-** | **3.20x** | **2.00x** |" in text
    assert "| target-only | - | 90.00 | 0.8 | 50.0 | 1.00 | 1.00x | 0.62x |" in text


def test_card_hub_metadata(saved):
    _, directory = saved
    data = ModelCard.load(directory / "README.md").data
    assert data.library_name == "diversed_hf"
    assert data.base_model == [TARGET_ID, DRAFT_ID]
    assert data.datasets == ["openai/gsm8k"]
    assert {"diversed", "speculative-decoding", "gsm8k"} <= set(data.tags)
    assert data.to_dict()["base_model_relation"] == "adapter"


def test_card_without_results_and_for_local_models(tmp_path):
    head = make_head(target_model_id="/models/target", draft_model_id=None, task=None, mixing="logits")
    head.save_pretrained(tmp_path)
    card = ModelCard.load(tmp_path / "README.md")
    assert "No benchmark results were recorded" in card.text
    assert "No training configuration was recorded" in card.text
    assert "`/models/target` (local path)" in card.text and "not recorded" in card.text
    assert "Logit mixing" in card.text
    assert card.data.base_model is None and card.data.datasets is None


def test_card_for_the_testbed_pair_uses_the_testbed_loader(tmp_path):
    from diversed_hf.testbed import ASSETS_DIR

    head = make_head(target_model_id=str(ASSETS_DIR / "target"), draft_model_id=str(ASSETS_DIR / "draft"), task="arith")
    text = head.generate_model_card(repo_id="org/testbed-arith").text
    assert "testbed.load_pair()" in text and 'DiversedHead.from_pretrained("org/testbed-arith")' in text
    assert 'load_task("arith"' in text


def test_card_of_a_shipped_head_loads_it_by_name_not_by_path():
    from diversed_hf import cards
    from diversed_hf.testbed import ASSETS_DIR

    head_dir = ASSETS_DIR / "heads" / "arith"
    head = DiversedHead.from_pretrained(head_dir)
    assert head.config.target_model_id == "diversed_hf/testbed/target"  # what load_pair() records
    text = cards.render_card(head.config, head_source=str(head_dir)).text
    assert 'head = testbed.load_head("arith")' in text and str(ASSETS_DIR) not in text
    assert "testbed.load_pair()" in text and "AutoModelForCausalLM" not in text


@pytest.mark.parametrize(
    "results, message",
    [
        ([{"method": "sd", "acceptance_rate": 44.6}], r"`acceptance_rate` = 44.6 is outside \[0.0, 1.0\].*0.726"),
        ([{"acceptance_rate": 0.4}], r"row 0 needs a non-empty string `method`"),
        ([{"method": "sd", "seconds_per_sample": "fast"}], r"`seconds_per_sample` must be a number or null"),
        ({"rows": []}, r"has no result rows"),
        ({"method": "sd"}, r"must be a list of result rows"),
        (
            [{"method": "a", "quality": 0.1, "quality_metric": "exact_match"}, {"method": "b", "quality": 0.1, "quality_metric": "rouge2_f1"}],
            r"mix quality metrics",
        ),
    ],
)
def test_bad_result_files(tmp_path, results, message):
    with pytest.raises(ValueError, match=message):
        make_head().save_pretrained(tmp_path, results=results)


def test_cli_card_rerenders_with_a_result_file(saved, tmp_path, capsys):
    _, directory = saved
    assert "No benchmark results" in (directory / "README.md").read_text()
    (tmp_path / "bench.json").write_text(json.dumps(RESULTS["rows"]))
    run_cli(["card", str(directory), "--results", str(tmp_path / "bench.json"), "--repo-id", REPO_ID])
    text = (directory / "README.md").read_text()
    assert "72.6 %" in text and f'DiversedHead.from_pretrained("{REPO_ID}")' in text
    assert capsys.readouterr().out.strip() == str(directory / "README.md")
    with pytest.raises(SystemExit, match="has no config.json"):
        run_cli(["card", str(tmp_path)])


def test_shipped_cards_render_into_model_cards(saved, tmp_path, monkeypatch):
    import diversed_hf.testbed as testbed

    _, directory = saved
    assets = tmp_path / "assets"
    (assets / "tokenizer").mkdir(parents=True)
    (assets / "tokenizer" / "config.json").write_text("{}")
    (assets / "head-arith").mkdir()
    for name in ("config.json", "model.safetensors"):
        (assets / "head-arith" / name).write_bytes((directory / name).read_bytes())
    monkeypatch.setattr(testbed, "ASSETS_DIR", assets)
    assert cards.shipped_head_dirs() == [assets / "head-arith"]
    written = cards.render_shipped_cards(tmp_path / "model_cards")
    assert written == [tmp_path / "model_cards" / "head-arith.md"]
    assert (assets / "head-arith" / "README.md").is_file()
    run_cli(["card", "--shipped", "--output-dir", str(tmp_path / "out")])
    assert (tmp_path / "out" / "head-arith.md").is_file()


def test_template_ships_inside_the_package():
    assert cards.TEMPLATE_PATH.is_file()
    assert cards.TEMPLATE_PATH.parent.name == "templates" and cards.TEMPLATE_PATH.parent.parent.name == "diversed_hf"


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
    logits = torch.nn.functional.linear(features, state["summary.weight"].float(), state["summary.bias"].float())  # (..., 2)
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
    expected = (w_draft.double().unsqueeze(-1) * draft_logits + w_target.double().unsqueeze(-1) * target_logits).softmax(-1)
    verify_probs, target_weight = HeadVerifier(head=head).verification_probs(
        draft_logits.softmax(-1), target_logits.softmax(-1), draft_hidden=draft_hidden, target_hidden=target_hidden
    )
    torch.testing.assert_close(target_weight, w_target.double(), atol=1e-6, rtol=0)
    torch.testing.assert_close(verify_probs, expected, atol=1e-6, rtol=0)

    # The imported head saves and loads like any other.
    head.save_pretrained(tmp_path / "converted")
    assert torch.equal(DiversedHead.from_pretrained(tmp_path / "converted")(draft_hidden, target_hidden), head(draft_hidden, target_hidden))


def test_official_import_overrides_and_unknown_paths(tmp_path):
    write_official_checkpoint(tmp_path / "official", target_model_path="unknown")
    head = DiversedHead.from_official_checkpoint(tmp_path / "official" / "ensemble_head.bin", draft_model_id="org/draft")
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
    start = time.monotonic()
    with pytest.raises(PermissionError, match=r"needs a write token.*hf auth login.*HF_TOKEN"):
        head.push_to_hub(REPO_ID, token=None)
    with pytest.raises(PermissionError, match="needs a write token"):
        hub.push_directory(directory, REPO_ID)
    with pytest.raises(PermissionError, match="needs a write token"):
        head.save_pretrained(directory, push_to_hub=True, repo_id=REPO_ID)
    with pytest.raises(SystemExit, match="diversed-hf push: .*needs a write token"):
        run_cli(["push", str(directory), "--repo-id", REPO_ID])
    assert time.monotonic() - start < 2.0


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
    with pytest.raises(ConnectionError, match=r"Could not reach the Hub .* to push 'diversed-test/head-gsm8k'.*network"):
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
    url = hub.push_directory(directory, REPO_ID, token="hf_fake")
    assert url.endswith("/commit/abc")
    assert set(uploaded) == {"config.json", "model.safetensors", "README.md", "results.json", "allow_patterns"}
    assert f'DiversedHead.from_pretrained("{REPO_ID}")' in uploaded["README.md"] and "72.6 %" in uploaded["README.md"]
    assert "notes.txt" not in uploaded["allow_patterns"]


def test_push_refuses_a_broken_directory_and_a_bad_repo_id(saved, no_network):
    _, directory = saved
    (directory / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="corrupted"):
        hub.push_directory(directory, REPO_ID, token="hf_fake")
    with pytest.raises(ValueError, match="not a valid Hub repo id"):
        hub.push_folder(directory, "org/name/extra", token="hf_fake")


# CLI -----------------------------------------------------------------------------------------------


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="diversed-hf")
    hub_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_registers_push_and_card():
    assert "diversed_hf.hub_cli" in cli.COMMAND_MODULES
    parser = argparse.ArgumentParser()
    hub_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["push", "some/dir", "--repo-id", "org/name"])
    assert (args.directory, args.repo_id) == ("some/dir", "org/name")
    with pytest.raises(SystemExit):
        parser.parse_args(["push", "some/dir"])  # --repo-id is required
