"""benchmarks/vllm_load.py without vLLM: what is checked before a server starts, a server that fails at start, and
``--section-only`` on a damaged runs file."""

from __future__ import annotations

import argparse
import sys

import pytest
from scripts import load_script

from diversed_hf import testbed

vllm_load = load_script("vllm_load")


def bed_args(**overrides) -> argparse.Namespace:
    values = dict(
        target=str(testbed.asset_path("target")),
        draft=str(testbed.asset_path("draft")),
        tokenizer=str(testbed.asset_path("tokenizer")),
        head=str(testbed.asset_path("heads/arith")),
        task="arith",
        pair="testbed",
        method="draft_model",
    )
    return argparse.Namespace(**{**values, **overrides})


def test_a_server_that_fails_at_start_reports_its_own_reason(tmp_path, monkeypatch):
    """The server's exit and its log reach the user (it used to be replaced by "[Errno 3] No such process")."""
    failing = [sys.executable, "-c", "import sys; print('ValueError: no device for the KV cache'); sys.exit(3)"]
    monkeypatch.setattr(vllm_load, "server_command", lambda *args: failing)
    real_wait_ready = vllm_load.Server.wait_ready

    def wait_ready(server, timeout=300.0):
        server.process.wait(timeout=30)  # gone before the first health check
        return real_wait_ready(server, timeout)

    monkeypatch.setattr(vllm_load.Server, "wait_ready", wait_ready)
    sizes = dict(num_prompts=2, max_tokens=4, concurrency=(1,))
    with pytest.raises(RuntimeError, match=r"exited at start \(exit code 3.*\n.*no device for the KV cache"):
        vllm_load.run_all(bed_args(), sizes, tmp_path)


def test_models_tokenizer_and_head_are_checked_before_a_server_starts(tmp_path):
    vllm_load.check_inputs(bed_args())  # the testbed's: fine
    with pytest.raises(ValueError, match=r"`--target` .*missing does not exist: pass the directory of the model"):
        vllm_load.check_inputs(bed_args(target=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match=r"`--head` .*tokenizer has no config.json"):
        vllm_load.check_inputs(bed_args(head=str(testbed.asset_path("tokenizer"))))
    with pytest.raises(ValueError, match=r"`--head` .*target would be refused by the DIVERSED server"):
        vllm_load.check_inputs(bed_args(head=str(testbed.asset_path("target"))))  # a model, not a head
    with pytest.raises(ValueError, match=r"`--head` .* would be refused .*target's hidden states of size 192"):
        vllm_load.check_inputs(bed_args(target=str(testbed.asset_path("draft"))))  # another hidden size
    with pytest.raises(ValueError, match=r"`--tokenizer` .* has no tokenizer.json or tokenizer_config.json"):
        vllm_load.check_inputs(bed_args(tokenizer=str(tmp_path)))


def test_section_only_names_a_missing_or_truncated_runs_file(tmp_path):
    with pytest.raises(ValueError, match=r"runs.json, which does not exist: run without --section-only"):
        vllm_load.main(["--section-only", "--output-dir", str(tmp_path)])
    (tmp_path / "runs.json").write_text('{"meta": {"vllm": "0.1"}, "rows": [{"method"')
    with pytest.raises(ValueError, match=r"`--section-only`: .*runs.json is not a complete runs file .*cut short"):
        vllm_load.main(["--section-only", "--output-dir", str(tmp_path)])


def test_the_real_pair_serves_the_task_eagle_draft_exported_for_vllms_eagle_method(tmp_path):
    """``--pair smollm2``: the task EagleDraft exported with every id, vLLM's ``eagle`` method, the ``arith_chat``
    head and its chat prompts; the head is checked against the export's hidden size as the server would."""
    import json

    target = tmp_path / "target"  # the converted SmolLM2's config as the check reads it (its size only)
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 576}))
    args = argparse.Namespace(
        pair="smollm2",
        target=str(target),
        draft=None,
        tokenizer=str(testbed.asset_path("tokenizer")),
        head=None,
        task=None,
    )
    vllm_load.resolve_pair(args, tmp_path)
    assert (args.method, args.task) == ("eagle", "arith_chat")
    export = json.loads((tmp_path / "export" / "config.json").read_text())
    assert export["architectures"] == ["EagleLlamaForCausalLM"] and export["vocab_size"] == 49152
    assert args.head.endswith("smollm2/heads/arith_chat")
    vllm_load.check_inputs(args)
    command = vllm_load.server_command(args, 8000, speculative=True)
    speculative = json.loads(command[command.index("--speculative-config") + 1])
    assert speculative["method"] == "eagle" and speculative["model"] == args.draft
    prompts = vllm_load.load_prompts(args.task, 2)
    assert len(prompts) == 2 and all(prompt.startswith("<|im_start|>") for prompt in prompts)
