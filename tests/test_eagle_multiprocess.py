"""``training/train_eagle_draft.py`` on any target (``--target_model``), in one process and under ``accelerate launch``
with 2 CPU processes (gloo), on the same data and batches (~40 s).

The target is a tiny Llama saved with a word-level tokenizer that carries a chat template; the prompts are the user's
own. Two processes split the collection's shards and every batch; their draft must be the one process's (same data,
same steps: the gradients summed over the processes are the whole batch's), written once. A rerun resumes from the
checkpoints and changes nothing; bad targets are refused by name before any collection.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

from safetensors.torch import load_file  # noqa: E402
from test_training import tiny_tokenizer  # noqa: E402
from tiny_models import make_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "training" / "train_eagle_draft.py"
TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }} {% endfor %}"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("target")
    make_model("llama", seed=1).save_pretrained(directory)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    prompts = directory / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"t{i} t{i + 1} t{i + 2}"}) for i in range(4, 28)))
    return directory


def _argv(target_dir: Path, output_dir: Path) -> list[str]:
    return [
        "--target_model", str(target_dir), "--prompts", str(target_dir / "prompts.jsonl"), "--num_chat", "0",
        "--num_arith", "0", "--code_samples", "0", "--num_docstrings", "0", "--chat_max_new_tokens", "6",
        "--generation_batch_size", "4", "--shard_size", "6", "--epochs", "2", "--batch_size", "6", "--top_k", "4",
        "--draft_vocab_size", "0", "--held_out", "0.2", "--save_steps", "3", "--dtype", "float32", "--threads", "1",
        "--output_dir", str(output_dir),
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(argv: list[str], num_processes: int) -> subprocess.CompletedProcess:
    launcher = [sys.executable]
    if num_processes > 1:
        launcher += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes)]
        launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        launcher += ["--main_process_port", str(_free_port())]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [*launcher, str(SCRIPT), *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    # a failing rank's own traceback first (the others' only say that it went away), then the launcher's summary
    marks = ("[rank0]", "Error", "train_eagle_draft.py: ")  # a rank's traceback, or its one-line user error
    failing = [line for line in done.stderr.splitlines() if any(mark in line for mark in marks)]
    assert done.returncode == 0, "\n".join(failing)[-3000:] + "\n...\n" + done.stderr[-1500:]
    return done


@pytest.fixture(scope="module")
def runs(target_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for processes in (1, 2):
        _run(_argv(target_dir, root / f"np{processes}"), processes)
    return root


def test_two_processes_distil_the_draft_one_process_distils(runs):
    shards = {k: sorted(p.name for p in (runs / f"np{k}" / "data").glob("shard-*")) for k in (1, 2)}
    assert shards[1] == shards[2] and len(shards[1]) == 4  # 24 prompts in shards of 6, split between the processes
    for name in shards[1]:
        one, two = (load_file(str(runs / f"np{k}" / "data" / name)) for k in (1, 2))
        assert torch.equal(one["ids"], two["ids"])  # each shard decoded the same, whichever process decoded it
    weights = {k: load_file(str(runs / f"np{k}" / "draft" / "model.safetensors")) for k in (1, 2)}
    assert weights[1].keys() == weights[2].keys()
    for name, tensor in weights[1].items():  # bfloat16 on disk: the same draft up to its rounding
        torch.testing.assert_close(weights[2][name].float(), tensor.float(), atol=2e-2, rtol=2e-2)
    records = {k: json.loads((runs / f"np{k}" / "draft" / "training.json").read_text()) for k in (1, 2)}
    assert records[1]["steps"] == records[2]["steps"] == 8  # 19 training sequences, batches of 6, 2 epochs
    after = [records[k]["held_out_after"]["acceptance_t1"][0] for k in (1, 2)]
    assert abs(after[0] - after[1]) < 0.02
    logs = [json.loads(line) for line in (runs / "np2" / "checkpoints" / "train_log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in logs] == [8]  # written once, by the main process
    config = json.loads((runs / "np2" / "draft" / "generation_config.json").read_text())
    assert config["assistant_tree_top_k"] == 4  # the saved draft's tree, from any process count


def test_a_rerun_resumes_and_changes_nothing(runs, target_dir):
    before = (runs / "np2" / "draft" / "model.safetensors").read_bytes()
    _run(_argv(target_dir, runs / "np2"), 2)
    assert (runs / "np2" / "draft" / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize(
    "change, match",
    [
        ("gpt2", r"`--target_model .*`: EagleDraft builds its layers from the target's architecture and has no layout"),
        ("no_template", r"its tokenizer \(\w+\) has no chat template.*--chat_template"),
        ("missing", r"`--target_model .*nowhere`: its config cannot be read"),
    ],
)
def test_bad_targets_are_refused_by_name_before_any_collection(target_dir, tmp_path, change, match):
    import train_eagle_draft
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = tmp_path / "bad"
    if change == "gpt2":
        GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).save_pretrained(directory)
        tokenizer = tiny_tokenizer()
        tokenizer.chat_template = TEMPLATE
        tokenizer.save_pretrained(directory)
    elif change == "no_template":
        make_model("llama", seed=1).save_pretrained(directory)
        tiny_tokenizer().save_pretrained(directory)
    else:
        directory = tmp_path / "nowhere"
    argv = _argv(directory, tmp_path / "run")
    argv[argv.index("--prompts") + 1] = str(target_dir / "prompts.jsonl")
    with pytest.raises(ValueError, match=match):
        train_eagle_draft.main(argv)
    assert not (tmp_path / "run" / "data").exists()


def test_texts_read_as_they_are_need_no_chat_template(tmp_path):
    """A tokenizer without a chat template is refused for chat prompts only: prefill-only texts need none."""
    from diversed_hf.lab.tasks.eagle_prompts import check_target_model

    make_model("llama", seed=1).save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    assert check_target_model(str(tmp_path / "base"), "eagle", None, False, tmp_path / "tokenizer") is None
    with pytest.raises(ValueError, match="has no chat template"):
        check_target_model(str(tmp_path / "base"), "eagle", None, True, tmp_path / "tokenizer")
