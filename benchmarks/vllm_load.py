"""vLLM's OpenAI server with the plugin under concurrent load: RESULTS.md's "Serving with vLLM under load" section.

    .venv-vllm/bin/python benchmarks/vllm_load.py           # results/vllm_load/runs.json, results/vllm_load.md, RESULTS.md
    .venv-vllm/bin/python benchmarks/vllm_load.py --quick   # 4 requests per cell into results_quick/vllm_load/ (CI)
    .venv-vllm/bin/python benchmarks/vllm_load.py --pair smollm2   # the real pair's EagleDraft: results/vllm_load_eagle/

Runs in vLLM's environment (README, "Serving with vLLM"). Two servers on 127.0.0.1, one after the other, each
started as ``python -m vllm.entrypoints.openai.api_server`` and stopped with SIGTERM (the script fails if one does
not exit cleanly within a minute):

- **target-only**: the target alone, no speculative decoding;
- **DIVERSED**: the same target with a draft model (N = 3, probabilistic drafting) and
  ``additional_config={"diversed": {"target_weight": 1.0, "heads": {"head": HEAD}}}``: lossless SD by default, and
  each request picks its rule in its body (``extra_body={"diversed": {...}}`` of the OpenAI client): the static
  ensemble ``{"target_weight": 0.5}`` or the head ``{"head": "head"}``.

Load comes from vLLM's own serving benchmark (``vllm.benchmarks.serve``, what ``vllm bench serve`` runs): a fixed
number of held-out prompts of the task, ``--max-concurrency`` clients at a time (1, 4 and 16), at infinite request
rate, completions API, temperature 1. Per cell: requests/s, output tokens/s, time to first token and time per output
token (median and p95), completed and failed requests, and acceptance from the server's spec-decoding counters
(accepted / drafted tokens, and tokens per round). Defaults: the testbed pair, its ``arith`` head, ``arith`` prompts.
``--pair smollm2``: the real pair served through vLLM's ``eagle`` method, SmolLM2-135M-Instruct with the task
EagleDraft (exported by :meth:`~diversed_hf.drafting.eagle.EagleDraft.save_for_vllm` with ``full_vocab=True``), the shipped
``arith_chat`` head and held-out ``arith_chat`` chat prompts: the head's own operating point (the draft it was
trained with, temperature 1, N = 3; its card), into RESULTS.md's "Serving with vLLM under load: the EagleDraft".
One thread for the server (``OMP_NUM_THREADS=1``). The models, tokenizer and head are checked before a server starts
(the head against the models' hidden sizes, as the server would).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from diversed_hf import testbed
from diversed_hf.cli.sections import VLLM_LOAD_EAGLE_SECTION, VLLM_LOAD_SECTION, refresh_head_sections
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script

REPO = Path(__file__).resolve().parents[1]

NUM_DRAFT_TOKENS = 3
STATIC_WEIGHT = 0.5
TEMPERATURE = 1.0
ENVIRONMENT = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}
FULL = dict(num_prompts=32, max_tokens=64, concurrency=(1, 4, 16))
QUICK = dict(num_prompts=4, max_tokens=16, concurrency=(1, 4))
#: (method, server, the request's ``"diversed"`` rule or None)
METHODS = (
    ("target-only", "target", None),
    ("lossless SD", "diversed", None),
    (f"static w = {STATIC_WEIGHT}", "diversed", {"target_weight": STATIC_WEIGHT}),
    ("DIVERSED head", "diversed", {"head": "head"}),
)


#: ``--pair``: vLLM's speculative method, the task whose held-out prompts are sent, and RESULTS.md's section
PAIRS = {
    "testbed": ("draft_model", "arith", VLLM_LOAD_SECTION),
    "smollm2": ("eagle", "arith_chat", VLLM_LOAD_EAGLE_SECTION),
}


def resolve_pair(args, output_dir: Path) -> None:
    """Fill ``args.target`` / ``draft`` / ``tokenizer`` / ``head`` / ``task`` left unset with ``args.pair``'s: the
    testbed's shipped files, or the real pair (its converted target, the task EagleDraft exported for vLLM into
    ``output_dir/export``, the ``arith_chat`` head)."""
    method, task, _ = PAIRS[args.pair]
    args.method, args.task = method, args.task or task
    if args.pair == "testbed":
        args.target = args.target or str(testbed.asset_path("target"))
        args.draft = args.draft or str(testbed.asset_path("draft"))
        args.tokenizer = args.tokenizer or str(testbed.asset_path("tokenizer"))
        args.head = args.head or str(testbed.asset_path("heads/arith"))
        return
    from diversed_hf.testbed.smollm2 import EAGLE_TASKS_DIR, ensure_target, export_eagle_draft

    args.target = args.target or str(ensure_target())
    args.tokenizer = args.tokenizer or args.target
    args.head = args.head or str(testbed.ASSETS_DIR / "smollm2" / "heads" / "arith_chat")
    args.draft = args.draft or str(export_eagle_draft(output_dir / "export", EAGLE_TASKS_DIR))


def load_prompts(task: str, num_prompts: int) -> list[str]:
    """Held-out prompts of ``task``: the testbed's plain-text ones, or ``arith_chat``'s, already in the chat
    template (sent as they are, ``--skip-chat-template``)."""
    if task == "arith_chat":
        from diversed_hf.testbed.arith_chat import load_arith_chat

        return list(load_arith_chat("test", num_prompts)["prompt"])
    return list(testbed.load_task(task, split="test", num_examples=num_prompts, seed=0)["prompt"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def diversed_config(args) -> dict:
    """The DIVERSED server's ``additional_config``: lossless by default, the head for requests to pick."""
    return {"diversed": {"target_weight": 1.0, "heads": {"head": str(args.head)}}}


def check_inputs(args) -> None:
    """Refuse, before a server starts, a model, tokenizer or head directory that is missing or wrong, and a head the
    DIVERSED server would refuse (another pair's hidden sizes)."""
    from diversed_hf.vllm_plugin.settings import settings_from_additional_config

    hidden_sizes = {}
    for flag, value, what, files in (
        ("--target", args.target, "model", ("config.json",)),
        ("--draft", args.draft, "model", ("config.json",)),
        ("--tokenizer", args.tokenizer, "tokenizer", ("tokenizer.json", "tokenizer_config.json")),
        ("--head", args.head, "DIVERSED head (written by DiversedHead.save_pretrained)", ("config.json",)),
    ):
        path = Path(value).expanduser()
        if not any((path / name).is_file() for name in files):
            found = "does not exist" if not path.exists() else f"has no {' or '.join(files)}"
            raise ValueError(f"`{flag}` {value} {found}: pass the directory of the {what} (default: the testbed's).")
        if what == "model":
            try:
                hidden_sizes[flag] = json.loads((path / "config.json").read_text()).get("hidden_size")
            except (ValueError, AttributeError) as error:
                raise ValueError(f"`{flag}` {value}: config.json is not a model config ({error}).") from error
    settings = settings_from_additional_config(diversed_config(args))
    try:
        settings.build_rules(target_hidden_size=hidden_sizes["--target"], draft_hidden_size=hidden_sizes["--draft"])
    except (ValueError, OSError) as error:
        raise ValueError(f"`--head` {args.head} would be refused by the DIVERSED server: {error}") from error


def read_runs(runs_file: Path) -> tuple[list[dict], dict]:
    """``(rows, meta)`` of a saved ``runs.json`` (``--section-only``), refused with the fix when missing or damaged."""
    if not runs_file.is_file():
        raise ValueError(
            f"`--section-only` rebuilds the section from {runs_file}, which does not exist: run without "
            "--section-only first."
        )
    try:
        saved = json.loads(runs_file.read_text())
        rows, meta = saved["rows"], saved["meta"]
        if not isinstance(rows, list) or not isinstance(meta, dict):
            raise TypeError(f"rows is a {type(rows).__name__}, meta a {type(meta).__name__}")
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"`--section-only`: {runs_file} is not a complete runs file ({type(error).__name__}: {error}); it was cut "
            "short or edited. Run without --section-only to measure again."
        ) from error
    return rows, meta


def server_command(args, port: int, speculative: bool) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(args.target),
        "--tokenizer",
        str(args.tokenizer),
        "--served-model-name",
        "target",
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--max-num-seqs",
        "32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--seed",
        "0",
    ]
    if speculative:
        command += [
            "--speculative-config",
            json.dumps(
                {
                    "method": args.method,
                    "model": str(args.draft),
                    "num_speculative_tokens": NUM_DRAFT_TOKENS,
                    "draft_sample_method": "probabilistic",
                }
            ),
            "--additional-config",
            json.dumps(diversed_config(args)),
        ]
    return command


class Server:
    """A vLLM OpenAI server in its own process group, its output in ``log_path``."""

    def __init__(self, command: list[str], port: int, log_path: Path):
        self.port, self.log_path = port, log_path
        environment = dict(os.environ, **{key: os.environ.get(key, value) for key, value in ENVIRONMENT.items()})
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited at start (exit code {self.process.returncode}, log {self.log_path}):\n"
                    f"{self.log_path.read_text()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the server did not come up in {timeout:.0f} s:\n{self.log_path.read_text()[-4000:]}"
                )
            time.sleep(2)

    def stop(self, timeout: float = 60.0) -> dict:
        """SIGTERM, then wait: ``{"exit_code", "seconds"}``; a server that does not exit in time is killed and the
        run fails. A server that already exited (it failed at start) only reports its code, so the error that ended
        the run, with the server's log, is the one shown."""
        start = time.monotonic()
        self._signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
            raise RuntimeError(
                f"the server did not stop within {timeout:.0f} s of SIGTERM (killed); see {self.log_path}"
            )
        return {"exit_code": code, "seconds": round(time.monotonic() - start, 1)}

    def _signal(self, signum: int) -> None:
        """Signal the server's whole process group (its workers too); nothing when all of it has exited already."""
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass


def complete(url: str, prompt: str, max_tokens: int, rule: dict | None = None) -> dict:
    """One completion request (the warm-up, and the check that a rule is accepted before the load starts)."""
    body = {"model": "target", "prompt": prompt, "max_tokens": max_tokens, "temperature": TEMPERATURE}
    if rule is not None:
        body["diversed"] = rule
    request = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def bench(url: str, args, prompts_file: Path, concurrency: int, rule: dict | None, sizes: dict) -> dict:
    """One cell by vLLM's serving benchmark: its result dict (metrics of every request, spec-decoding counters)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = [
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "target",
        "--tokenizer",
        str(args.tokenizer),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts_file),
        "--skip-chat-template",
        "--custom-output-len",
        str(sizes["max_tokens"]),
        "--num-prompts",
        str(sizes["num_prompts"]),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--temperature",
        str(TEMPERATURE),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,95",
        "--num-warmups",
        "0",
        "--disable-tqdm",
        "--seed",
        "0",
    ]
    if rule is not None:
        argv += ["--extra-body", json.dumps({"diversed": rule})]
    return bench_main(parser.parse_args(argv))


def summarize(method: str, concurrency: int, result: dict) -> dict:
    accepted = result.get("spec_decode_accepted_tokens")
    drafted = result.get("spec_decode_draft_tokens")
    return {
        "method": method,
        "concurrency": concurrency,
        "completed": result["completed"],
        "failed": result["failed"],
        "errors": sorted({error for error in result.get("errors", []) if error}),
        "duration_s": result["duration"],
        "requests_per_s": result["request_throughput"],
        "output_tokens_per_s": result["output_throughput"],
        "output_tokens": result["total_output_tokens"],
        "ttft_ms": {"median": result["median_ttft_ms"], "p95": result["p95_ttft_ms"]},
        "tpot_ms": {"median": result["median_tpot_ms"], "p95": result["p95_tpot_ms"]},
        "acceptance": None if not drafted else accepted / drafted,
        "tokens_per_round": result.get("spec_decode_acceptance_length"),
    }


def run_all(args, sizes: dict, output_dir: Path) -> tuple[list[dict], dict]:
    prompts = load_prompts(args.task, sizes["num_prompts"])
    prompts_file = output_dir / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
    rows, stops = [], {}
    logs = output_dir / "logs"  # the servers' output (not committed)
    logs.mkdir(exist_ok=True)
    for server_name in ("target", "diversed"):
        port = free_port()
        server = Server(server_command(args, port, server_name == "diversed"), port, logs / f"{server_name}.log")
        try:
            server.wait_ready()
            for method, name, rule in METHODS:
                if name != server_name:
                    continue
                complete(server.url, prompts[0], 4, rule)  # warm-up, and the rule is accepted
                for concurrency in sizes["concurrency"]:
                    row = summarize(
                        method, concurrency, bench(server.url, args, prompts_file, concurrency, rule, sizes)
                    )
                    rows.append(row)
                    print(_progress(row), flush=True)
        finally:
            stops[server_name] = server.stop()
    meta = {
        "pair": args.pair,
        "method": args.method,
        "target": _shown(args.target),
        "draft": _shown(args.draft),
        "head": _shown(args.head),
        "task": args.task,
        "num_draft_tokens": NUM_DRAFT_TOKENS,
        "temperature": TEMPERATURE,
        **sizes,
        "concurrency": list(sizes["concurrency"]),
        "server_stops": stops,
        "vllm": _vllm_version(),
    }
    return rows, meta


def _shown(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _pair_text(meta: dict) -> str:
    if meta.get("pair") == "smollm2":
        return (
            "SmolLM2-135M-Instruct (`testbed.smollm2.ensure_target()`) and its task EagleDraft, exported by "
            f"`EagleDraft.save_for_vllm(..., full_vocab=True)` into `{meta['draft']}`"
        )
    return f"`{meta['target']}` / `{meta['draft']}`"


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def _progress(row: dict) -> str:
    acceptance = "" if row["acceptance"] is None else f", acceptance {100 * row['acceptance']:.1f} %"
    return (
        f"{row['method']} c={row['concurrency']}: {row['completed']} done, {row['failed']} failed, "
        f"{row['requests_per_s']:.2f} req/s, {row['output_tokens_per_s']:.1f} tokens/s{acceptance}"
    )


def check_rows(rows: list[dict], meta: dict) -> None:
    """No request lost or failed, every server stopped cleanly: else the run fails, naming what went wrong."""
    for row in rows:
        if row["failed"] or row["completed"] != meta["num_prompts"]:
            raise RuntimeError(
                f"{row['method']} at {row['concurrency']} clients: {row['completed']} of {meta['num_prompts']} "
                f"requests completed, {row['failed']} failed: {row['errors']}"
            )
    for name, stop in meta["server_stops"].items():
        if stop["exit_code"] != 0:
            raise RuntimeError(f"the {name} server exited with code {stop['exit_code']} after SIGTERM")


def section_text(rows: list[dict], meta: dict) -> str:
    lines = [
        "<!-- Written by `.venv-vllm/bin/python benchmarks/vllm_load.py"
        + (" --pair smollm2" if meta.get("pair") == "smollm2" else "")
        + "` (vLLM's environment); do not edit by hand. -->",
        "",
        f"vLLM {meta['vllm']}'s OpenAI server on 127.0.0.1 with the plugin, loaded by vLLM's own serving benchmark "
        f"(`vllm.benchmarks.serve`): {meta['num_prompts']} held-out `{meta['task']}` prompts per cell, "
        f"`--max-concurrency` clients, up to {meta['max_tokens']} new tokens, temperature {meta['temperature']:g}. "
        f"Pair: {_pair_text(meta)} (vLLM's `{meta.get('method', 'draft_model')}` method), "
        f"N = {meta['num_draft_tokens']} drafts per round. "
        "target-only is a server without speculative decoding; the other rows are one DIVERSED server "
        '(`additional_config={"diversed": {"target_weight": 1.0, "heads": {"head": ...}}}`, lossless by '
        'default) whose requests choose their rule in the body: `{"diversed": {"target_weight": 0.5}}` and '
        f'`{{"diversed": {{"head": "head"}}}}` (the head `{meta["head"]}`, which reads hidden states). '
        "Acceptance is accepted / drafted tokens from the server's spec-decoding counters; tokens per round is "
        "vLLM's acceptance length. One server thread, on a 2-core CPU.",
        "",
        "| method | clients | done / failed | requests/s | output tokens/s | TTFT median / p95 (ms) | "
        "TPOT median / p95 (ms) | acceptance | tokens/round |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        acceptance = "—" if row["acceptance"] is None else f"{100 * row['acceptance']:.1f} %"
        per_round = "—" if row["tokens_per_round"] is None else f"{row['tokens_per_round']:.2f}"
        lines.append(
            f"| {row['method']} | {row['concurrency']} | {row['completed']} / {row['failed']} | "
            f"{row['requests_per_s']:.2f} | {row['output_tokens_per_s']:.1f} | "
            f"{row['ttft_ms']['median']:.0f} / {row['ttft_ms']['p95']:.0f} | "
            f"{row['tpot_ms']['median']:.1f} / {row['tpot_ms']['p95']:.1f} | {acceptance} | {per_round} |"
        )
    stops = ", ".join(
        f"{name}: exit code {stop['exit_code']} in {stop['seconds']:g} s" for name, stop in meta["server_stops"].items()
    )
    lines += ["", f"Every request completed; the servers stopped cleanly on SIGTERM ({stops})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="4 requests per cell, 1 and 4 clients (RESULTS.md untouched)."
    )
    parser.add_argument("--output-dir", default=None, help="Where runs.json, the section and the logs go.")
    parser.add_argument(
        "--pair",
        choices=sorted(PAIRS),
        default="testbed",
        help="testbed: the shipped 9M pair (vLLM's draft_model method, the arith head); smollm2: SmolLM2-135M-Instruct "
        "with the task EagleDraft (vLLM's eagle method) and the arith_chat head. The options below override its files.",
    )
    parser.add_argument("--target", default=None, help="The target model's directory (default: the pair's).")
    parser.add_argument(
        "--draft", default=None, help="The draft model's directory (with --pair smollm2: an EagleDraft export)."
    )
    parser.add_argument("--tokenizer", default=None, help="The pair's tokenizer (default: the pair's).")
    parser.add_argument("--head", default=None, help="The head requests may pick (default: the pair's).")
    parser.add_argument("--task", default=None, help="The task whose held-out prompts are sent (default: the pair's).")
    parser.add_argument("--section-only", action="store_true", help="Run nothing: rebuild the section from runs.json.")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    root = REPO / ("results_quick" if args.quick else "results")
    section_name = PAIRS[args.pair][2][0]
    output_dir = check_output_dir(args.output_dir or root / section_name, "--output-dir")
    output_dir.mkdir(parents=True, exist_ok=True)
    runs_file = output_dir / "runs.json"
    if args.section_only:
        rows, meta = read_runs(runs_file)
    else:
        resolve_pair(args, output_dir)
        check_inputs(args)
        rows, meta = run_all(args, sizes, output_dir)
        runs_file.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    check_rows(rows, meta)
    section_file = output_dir.parent / f"{section_name}.md" if args.output_dir is None else output_dir / "section.md"
    section_file.write_text(section_text(rows, meta))
    if not args.quick and args.output_dir is None:
        refresh_head_sections(REPO / "RESULTS.md", root)
    print(
        f"Wrote {'' if args.section_only else f'{runs_file} and '}{section_file}"
        + ("" if args.quick or args.output_dir else " and RESULTS.md's section")
        + "."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
