"""The bench on a tiny random pair (fast): method specs, one CLI run end to end, the Python API with a head,
reporting helpers, and data parallelism over 2 CPU processes."""

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import make_model

from diversed_hf import DiversedHead, cli
from diversed_hf.cli import bench as bench_cli
from diversed_hf.lab import bench
from diversed_hf.lab.bench.partial import module_digest
from diversed_hf.testbed import load_tokenizer
from diversed_hf.verifiers import ExactVerifier, HeadVerifier, SpecCascadeVerifier, StaticEnsembleVerifier

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    """A tiny target and a perturbed copy as draft, saved with the testbed tokenizer (so prompts are real text)."""
    tokenizer = load_tokenizer()
    target = make_model("llama", hidden_size=32, num_layers=2, vocab_size=len(tokenizer), seed=1)
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in draft.parameters():
            if parameter.numel() > 1:
                parameter.add_(0.3 * parameter.std() * torch.randn(parameter.shape, generator=generator))
    root = tmp_path_factory.mktemp("pair")
    for model, name in ((target, "target"), (draft, "draft")):
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def small_config(**overrides):
    values = dict(
        num_prompts=4,
        num_timing_prompts=2,
        max_new_tokens=10,
        repeats=1,
        cost_tokens=2,
        batch_size=2,
        num_html_examples=2,
    )
    values.update(overrides)
    return bench.BenchConfig(**values)


# ------------------------------------------------------------------------------------------------
# Method specs and config


def test_parse_methods_expands_sweeps():
    methods, notes = bench.parse_methods(
        ["target", "sd", "lossy:0.5", "static:0,0.5", "cascade-opt:0.1,0.3", "cascade:0.2"]
    )
    names = [m.name for m in methods]
    assert names[:6] == ["target-only", "SD", "lossy SD l=0.5", "static w=0", "static w=0.5", "cascade opt a=0.1"]
    assert len(methods) == 7 + 6
    assert methods[0].verifier is None and methods[1].verifier == ExactVerifier()
    assert methods[4].verifier == StaticEnsembleVerifier(0.5) and methods[4].param == 0.5
    assert methods[6].verifier == SpecCascadeVerifier("opt", 0.3)
    assert notes == []


def test_the_relaxed_rules_are_bench_methods_with_fronts_of_their_own(tmp_path):
    """``fuzzy:T,...`` and ``topk:DELTA,...`` sweep the field's relaxed rules; the trade-off plot draws each sweep as
    a front (docs/method.md §9)."""
    from diversed_hf.lab.bench.plots import SWEPT_FRONTS, plot_tradeoffs
    from diversed_hf.verifiers import FuzzyVerifier, TopKRelaxedVerifier

    methods, _ = bench.parse_methods(["fuzzy:0.05,0.2", "topk:0.5,2"])
    assert [m.name for m in methods] == ["fuzzy T=0.05", "fuzzy T=0.2", "top-2 relaxed d=0.5", "top-2 relaxed d=2"]
    assert methods[1].verifier == FuzzyVerifier(0.2) and methods[3].verifier == TopKRelaxedVerifier(2, 2.0)
    assert {"fuzzy", "topk-relaxed"} <= set(SWEPT_FRONTS)
    rows = [
        dict(method=m.name, family=m.family, quality=0.5 + 0.1 * i, quality_metric="exact_match",
             acceptance_rate=0.3 + 0.1 * i, seconds_per_sample=1.0 - 0.1 * i)
        for i, m in enumerate(methods)
    ]  # fmt: skip
    assert plot_tradeoffs(rows, tmp_path / "fronts.png").is_file()


def test_judge_decoding_is_a_bench_method_with_the_tasks_judge(tmp_path):
    """``judge:T,...`` sweeps JudgeVerifier's threshold with the judge ``--judge`` names (or the shipped one);
    without a judge the spec is skipped with a note."""
    from diversed_hf.cli.bench import load_judge
    from diversed_hf.heads.judge import JudgeHead
    from diversed_hf.verifiers import JudgeVerifier

    judge = JudgeHead(8, task="arith")
    methods, notes = bench.parse_methods(["sd", "judge:0.5,2"], judge=judge)
    assert [m.name for m in methods] == ["SD", "judge t=0.5", "judge t=2"] and notes == []
    assert isinstance(methods[2].verifier, JudgeVerifier) and methods[2].verifier.threshold == 2.0
    assert {m.family for m in methods[1:]} == {"judge"}
    methods, notes = bench.parse_methods(["sd", "judge:0.5"])
    assert [m.name for m in methods] == ["SD"] and "no judge was given" in notes[0]
    judge.save_pretrained(tmp_path / "judge")
    loaded = load_judge(f"arith={tmp_path / 'judge'}", "arith")
    assert loaded.config == judge.config and load_judge(f"summary={tmp_path / 'judge'}", "arith") is None


def test_parse_methods_skips_missing_head_and_finetuned_draft_with_a_note():
    methods, notes = bench.parse_methods(["sd", "sd-ft", "diversed"])
    assert [m.name for m in methods] == ["SD"]
    assert len(notes) == 2 and "fine-tuned" in notes[0] and "DIVERSED" in notes[1]
    head = DiversedHead(draft_hidden_size=4, target_hidden_size=4)
    methods, notes = bench.parse_methods(["sd-ft", "diversed"], head=head, has_finetuned_draft=True)
    assert [m.family for m in methods] == ["sd-finetuned", "diversed"] and methods[0].draft == "finetuned"
    assert isinstance(methods[1].verifier, HeadVerifier) and notes == []


@pytest.mark.parametrize(
    "specs, message",
    [
        (["bogus"], "Unknown method"),
        (["static"], "expected numbers"),
        (["static:x"], "expected numbers"),
        (["cascade-nope:0.1"], "cascade rule"),
        (["sd", "sd"], "twice"),
        (["static:1.5"], "target_weight"),
        (["block:block:sd"], "block verification applies to a token-wise method once; write 'block:sd'"),
    ],
)
def test_bad_method_specs_raise(specs, message):
    with pytest.raises(ValueError, match=message):
        bench.parse_methods(specs)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_prompts=0), "num_prompts"),
        (dict(num_timing_prompts=9, num_prompts=4), "num_timing_prompts"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(repeats=0), "repeats"),
        (dict(num_samples=0), "num_samples"),
    ],
)
def test_bad_config_raises_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_config(**overrides)


def test_unknown_task_raises():
    with pytest.raises(ValueError, match="task"):
        bench.load_task("nope", 2)


# ------------------------------------------------------------------------------------------------
# End to end


def test_cli_writes_results_page_tables_and_plots(pair_dir, tmp_path, capsys):
    page = tmp_path / "RESULTS.md"
    out = tmp_path / "results"
    code = cli.main(
        [
            "bench",
            "--target",
            str(pair_dir / "target"),
            "--draft",
            str(pair_dir / "draft"),
            "--task",
            "arith",
            "--methods",
            "target",
            "sd",
            "static:0,0.5",
            "cascade-opt:0.3",
            "sd-ft",
            "diversed",
            "--finetuned-draft",
            f"arith={pair_dir / 'draft'}",
            "--num-prompts",
            "4",
            "--num-timing-prompts",
            "2",
            "--max-new-tokens",
            "10",
            "--repeats",
            "2",
            "--cost-tokens",
            "2",
            "--batch-size",
            "2",
            "--threads",
            "1",
            "--no-progress",
            "--output-dir",
            str(out),
            "--results-page",
            str(page),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "| SD |" in printed and "DIVERSED: skipped" in printed
    rows = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in rows] == [
        "target-only",
        "SD",
        "static w=0",
        "static w=0.5",
        "cascade opt a=0.3",
        "SD (fine-tuned draft)",
    ]
    by_name = {r["method"]: r for r in rows}
    for row in rows:
        for key in (
            "method",
            "acceptance_rate",
            "quality",
            "quality_metric",
            "seconds_per_sample",
            "tokens_per_second",
            "speedup_vs_target",
            "speedup_vs_sd",
            "tokens_per_round",
            "expected_tokens_per_round",
            "iid_tokens_per_round",
            "predicted_speedup",
        ):
            assert key in row, key
        assert row["num_prompts"] == 4 and len(row["seconds_repeats"]) == 2
        assert row["quality_metric"] == "exact_match" and 0.0 <= row["quality"] <= 1.0
    assert by_name["target-only"]["acceptance_rate"] is None and by_name["target-only"]["speedup_vs_target"] == 1.0
    assert by_name["static w=0"]["acceptance_rate"] == 1.0  # w = 0 accepts every draft
    sd = by_name["SD"]
    assert 0.0 < sd["acceptance_rate"] < 1.0 and sd["speedup_vs_sd"] == 1.0
    assert 1.0 <= sd["tokens_per_round"] <= 6.0 and 1.0 <= sd["expected_tokens_per_round"] <= 6.0
    assert sd["iid_tokens_per_round"] == pytest.approx(sum(sd["mean_beta"] ** k for k in range(6)))
    assert len(sd["position_acceptance"]) == 5 and sd["estimator"] == "exact"
    for name in (
        "arith_tradeoffs.png",
        "arith_positions.png",
        "arith_weights.html",
        "bench.json",
        "results_arith.json",
    ):
        assert (out / name).is_file(), name
    text = page.read_text()
    assert (
        "| method | acceptance |" in text and "](results/arith_tradeoffs.png)" in text and "DIVERSED: skipped" in text
    )
    # The per-task file is what model cards read.
    cards = pytest.importorskip("diversed_hf.heads.cards")
    loaded = cards.load_results(out / "results_arith.json")
    assert loaded["setting"]["task"] == "arith" and len(loaded["rows"]) == 6
    # The "fine-tuned" draft is the draft itself here: same acceptance as SD on the same seeds.
    assert by_name["SD (fine-tuned draft)"]["acceptance_rate"] == sd["acceptance_rate"]


def test_python_api_with_a_head_shades_tokens_and_compares_with_the_front(pair_dir, tmp_path):
    target, draft, tokenizer = bench.load_models(str(pair_dir / "target"), str(pair_dir / "draft"))
    head = DiversedHead.for_pair(target, draft, architecture="mlp", mlp_hidden_size=8)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    task = bench.load_task("summary", 4)
    methods, notes = bench.parse_methods(["sd", "static:0,0.5", "diversed"], head=head)
    result = bench.run_bench(target, draft, tokenizer, task, methods, small_config(num_timing_prompts=0), notes=notes)
    rows = {r["method"]: r for r in result.rows}
    assert rows["DIVERSED"]["mean_target_weight"] is not None and 0 < rows["DIVERSED"]["mean_target_weight"] < 1
    assert rows["SD"]["seconds_per_sample"] is None  # nothing timed
    examples = result.examples["DIVERSED"]
    assert len(examples) == 2 and len(examples[0]["tokens"]) == len(examples[0]["target_weights"])
    weights = [w for e in examples for w in e["target_weights"] if w is not None]
    assert len(set(round(w, 4) for w in weights)) > 1, "a random head should choose different weights"
    comparison = bench.front_comparison(result.rows)
    assert comparison is not None and comparison["method"] == "DIVERSED"
    paths = bench.write_results([result], tmp_path)
    html = paths["summary_weights"].read_text()
    assert html.count('title="w = ') >= len(weights) and "DIVERSED" in html


def test_several_samples_per_prompt_pool_quality_and_keep_the_first_sample(pair_dir):
    target, draft, tokenizer = bench.load_models(str(pair_dir / "target"), str(pair_dir / "draft"))
    task = bench.load_task("arith", 4)
    methods, _ = bench.parse_methods(["target", "static:0.5"])
    one = bench.run_bench(target, draft, tokenizer, task, methods, small_config(num_timing_prompts=0))
    two = bench.run_bench(target, draft, tokenizer, task, methods, small_config(num_timing_prompts=0, num_samples=2))
    for row_one, row_two in zip(one.rows, two.rows):
        assert (row_two["num_prompts"], row_two["num_samples"]) == (4, 2) and row_one["num_samples"] == 1
    # Sample 0 is seeded as a single-sample run, so the examples (first sample only) are the same tokens.
    assert [e["tokens"] for e in two.examples["static w=0.5"]] == [e["tokens"] for e in one.examples["static w=0.5"]]
    static_one, static_two = one.rows[1], two.rows[1]
    assert static_two["num_generated"] > static_one["num_generated"]  # both samples counted


def test_front_comparison_and_table_on_hand_made_rows():
    def row(method, family, acceptance, quality, seconds, param=None):
        return dict(
            method=method,
            family=family,
            param=param,
            acceptance_rate=acceptance,
            quality=quality,
            quality_stderr=None,
            quality_metric="rouge2_f1",
            seconds_per_sample=seconds,
            tokens_per_second=100.0,
            speedup_vs_target=1.0,
            throughput_speedup_vs_target=1.0,
            predicted_speedup=1.5,
            tokens_per_round=2.0,
            expected_tokens_per_round=2.1,
            iid_tokens_per_round=1.9,
        )

    rows = [
        row("SD", "sd", 0.4, 0.50, 2.0, 1.0),
        row("static w=0.5", "static-ensemble", 0.7, 0.40, 1.5, 0.5),
        row("static w=0", "static-ensemble", 1.0, 0.10, 1.0, 0.0),
        row("DIVERSED", "diversed", 0.85, 0.45, 1.2),
    ]
    comparison = bench.front_comparison(rows)
    assert comparison["front_quality_at_acceptance_rate"] == pytest.approx(0.25)
    assert comparison["quality_minus_front_at_acceptance_rate"] == pytest.approx(0.20)
    assert comparison["front_quality_at_seconds_per_sample"] == pytest.approx(0.10 + 0.30 * 0.2 / 0.5)
    assert bench.front_comparison(rows[:3]) is None
    table = bench.markdown_table(rows)
    assert "ROUGE-2 F1 (x100)" in table and "| **DIVERSED** | 85.0 % | 45.0 |" in table
    rows[0].update(speedup_vs_target=float("inf"), predicted_speedup=float("nan"))  # a zero time; nothing measured
    table = bench.speed_table(rows)
    assert "inf" not in table and "nan" not in table
    assert table.splitlines()[2].startswith("| SD | 2.000 | 100 | ∞ | 1.00x | – | – |")


# ------------------------------------------------------------------------------------------------
# Data parallel: 2 CPU processes under accelerate launch


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_data_parallel_with_accelerate_launch(pair_dir, tmp_path):
    pytest.importorskip("accelerate")
    out = tmp_path / "dp"
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        "-m",
        "diversed_hf.cli",
        "bench",
        "--target",
        str(pair_dir / "target"),
        "--draft",
        str(pair_dir / "draft"),
        "--task",
        "arith",
        "--methods",
        "target",
        "sd",
        "--num-prompts",
        "5",
        "--num-timing-prompts",
        "2",
        "--max-new-tokens",
        "6",
        "--repeats",
        "1",
        "--cost-tokens",
        "1",
        "--batch-size",
        "2",
        "--threads",
        "1",
        "--no-progress",
        "--no-plots",
        "--output-dir",
        str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("## arith") == 1, "only the main process prints"
    result = json.loads((out / "bench.json").read_text())[0]
    assert result["meta"]["num_processes"] == 2
    assert [r["num_prompts"] for r in result["rows"]] == [5, 5]  # gathered from both processes


def test_rows_use_the_exact_estimator_when_drafted_acceptance_is_recorded():
    """Two rounds of N = 2: with a_t(x_t) recorded the row uses 1 + sum_k prod_{t<k} a_t beta_k, else the beta product."""
    task = bench.BenchTask("t", ["p"], ["r"], lambda completions, references: [1.0], "exact_match")
    record = dict(
        index=0,
        completion="x",
        num_generated=4,
        num_rounds=2,
        num_drafted=4,
        num_accepted=2,
        drafted_per_position=[2, 2],
        accepted_per_position=[1, 1],
        position_acceptance=torch.tensor([[0.5, 1.0], [0.5, 1.0]]),
    )
    method = bench.parse_methods(["sd"])[0][0]
    costs = {"target_token_seconds": 1.0, "draft_token_seconds": 0.1}
    config = small_config(num_draft_tokens=2)
    row = bench.method_row(method, [dict(record)], [], None, task, config, costs)
    assert row["estimator"] == "beta-product" and row["expected_tokens_per_round"] == pytest.approx(2.0)
    assert row["tokens_per_round"] == pytest.approx(2.0) and row["acceptance_rate"] == pytest.approx(0.5)
    assert row["predicted_speedup"] == pytest.approx(2.0 / 1.2)
    exact = dict(record, drafted_acceptance=torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    row = bench.method_row(method, [exact], [], None, task, config, costs)
    assert row["estimator"] == "exact" and row["expected_tokens_per_round"] == pytest.approx((2.5 + 1.5) / 2)
    assert row["position_acceptance"] == pytest.approx([0.5, 1.0])  # the second draft was accepted whenever examined


def test_testbed_heads_are_the_default_only_for_the_testbed_pair():
    assert bench_cli.load_head(None, "arith", testbed_default=False) is None
    assert bench_cli.load_finetuned_draft(None, "arith", testbed_default=False) is None
    head = bench_cli.load_head(None, "arith")
    if head is None:
        pytest.skip("this checkout ships no testbed head")
    assert head.config.task == "arith"


def test_hub_tasks_load_from_local_files(tmp_path):
    """GSM8K through the task registry (diversed_hf.lab.tasks), from a local file in the Hub schema (no download)."""
    path = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = bench.load_task("gsm8k", 3, data_files=str(path))
    assert task.quality_metric == "exact_match" and len(task.prompts) == 3
    assert task.prompts[0].startswith("Question: ") and task.prompts[0].endswith("Answer:")
    index = task.prompts.index("Question: What is 2 + 1?\nAnswer:")
    assert task.reward(["so #### 3"], [task.references[index]]) == [1.0]


def test_few_prompts_alone_time_at_most_those_prompts():
    assert bench.BenchConfig(num_prompts=2).num_timing_prompts == 2
    assert bench.BenchConfig(num_prompts=64).num_timing_prompts == 8
    with pytest.raises(ValueError, match="num_timing_prompts"):
        bench.BenchConfig(num_prompts=2, num_timing_prompts=3)


def test_bench_command_reports_user_errors_in_one_line(capsys):
    from diversed_hf import cli

    assert cli.main(["bench", "--task", "squad", "--num-prompts", "2", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("diversed-hf bench: ")
        and "Unknown task 'squad'" in err
        and "Traceback" not in err
        and err.count("\n") == 1
    )


def test_typical_acceptance_is_a_bench_method():
    from diversed_hf import TypicalAcceptanceVerifier

    methods, _ = bench.parse_methods(["sd", "typical:0.05,0.09"])
    typical = [m for m in methods if m.family == "typical"]
    assert [m.name for m in typical] == ["typical eps=0.05", "typical eps=0.09"]
    assert typical[1].verifier == TypicalAcceptanceVerifier(posterior_threshold=0.09)


def test_every_method_family_has_a_plot_marker(tmp_path):
    pytest.importorskip("matplotlib")
    from diversed_hf.lab.bench import plots
    from diversed_hf.lab.bench.methods import FAMILIES

    assert set(plots._MARKERS) == set(FAMILIES)
    rows = [
        {"method": f"m{i}", "family": family, "param": 0.5, "position_acceptance": [0.9, 0.8]}
        for i, family in enumerate(FAMILIES)
    ]
    assert plots.plot_position_acceptance(rows, tmp_path / "positions.png").is_file()


# ------------------------------------------------------------------------------------------------
# Draft-length policies, paired quality intervals, the transfer experiment, the speed models


def test_schedule_specs_expand_per_speculative_method():
    schedules = bench.parse_schedules(["constant:3,8", "heuristic", "confidence:0.4", "optimal:12"])
    assert [s.label for s in schedules] == [
        "constant N=3",
        "constant N=8",
        "heuristic",
        "confidence 0.4",
        "optimal N<=12",
    ]
    assert schedules[3].generate_kwargs(5) == dict(
        num_assistant_tokens=5, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.4
    )
    assert schedules[4].generate_kwargs(5)["num_assistant_tokens"] == 12
    methods, _ = bench.parse_methods(["target", "sd"])
    expanded = bench.with_schedules(methods, schedules)
    assert [m.name for m in expanded][:3] == ["target-only", "SD @ constant N=3", "SD @ constant N=8"]
    assert len(expanded) == 1 + len(schedules)
    assert bench.with_schedules(methods, bench.parse_schedules(["constant"])) == methods  # default: unchanged


@pytest.mark.parametrize(
    "specs, message",
    [
        (["sometimes"], "Unknown schedule"),
        (["constant:0"], "positive integers"),
        (["constant:2.5"], "positive integers"),
        (["confidence:1"], "in (0, 1)"),
        (["heuristic", "heuristic"], "twice"),
        ([], "empty"),
    ],
)
def test_bad_schedule_specs_raise(specs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bench.parse_schedules(specs)
    if specs:  # the config checks them before any model loads
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            small_config(schedules=specs)


def test_paired_difference_is_the_mean_per_prompt_difference_with_a_bootstrap_interval():
    from diversed_hf.lab.bench.stats import paired_difference

    # Prompt difficulty varies a lot, the method is 0.1 worse on every prompt: the paired interval is tight.
    reference = [(i, float(i % 2)) for i in range(200)] + [(i, float(i % 2)) for i in range(200)]
    method = [(i, float(i % 2) - 0.1) for i in range(200)]
    result = paired_difference(method, reference, num_resamples=500)
    assert result["delta"] == pytest.approx(-0.1) and result["num_prompts"] == 200
    assert result["low"] == pytest.approx(-0.1) and result["high"] == pytest.approx(-0.1)
    # Noise: the interval covers the mean and is about +-1.96 standard errors wide.
    generator = torch.Generator().manual_seed(0)
    noisy = [(i, float(torch.rand((), generator=generator) < 0.5)) for i in range(400)]
    flat = [(i, 0.5) for i in range(400)]
    result = paired_difference(noisy, flat, num_resamples=2000)
    half_width = (result["high"] - result["low"]) / 2
    assert result["low"] < result["delta"] < result["high"]
    assert half_width == pytest.approx(1.96 * 0.5 / 400**0.5, rel=0.15)
    assert paired_difference([(0, 1.0)], [(1, 1.0)]) is None  # no common prompt


def test_rows_carry_paired_differences_to_the_pooled_target_distribution():
    from diversed_hf.lab.bench.stats import add_paired_differences

    rows = [
        {"method": name, "family": family}
        for name, family in (
            ("target-only", "target-only"),
            ("SD", "sd"),
            ("DIVERSED", "diversed"),
            ("static w=0", "static-ensemble"),
        )
    ]
    rewards = {
        "target-only": [(0, 1.0), (1, 0.0), (2, 1.0)],
        "SD": [(0, 1.0), (1, 1.0), (2, 1.0)],
        "DIVERSED": [(0, 0.0), (1, 1.0), (2, 1.0)],
        "static w=0": [(0, 0.0), (1, 0.0)],  # scored on fewer prompts: paired on those
    }
    add_paired_differences(rows, rewards, num_resamples=100)
    by_name = {row["method"]: row for row in rows}
    assert by_name["target-only"]["quality_reference"] == "SD"  # the exact methods are compared with each other
    assert by_name["target-only"]["quality_delta"] == pytest.approx(-1 / 3)
    assert by_name["DIVERSED"]["quality_reference"] == "target-only + SD"
    # pooled per prompt: 1.0, 0.5, 1.0 -> differences -1, +0.5, 0
    assert by_name["DIVERSED"]["quality_delta"] == pytest.approx(-0.5 / 3)
    assert by_name["static w=0"]["quality_delta_prompts"] == 2
    assert by_name["static w=0"]["quality_delta"] == pytest.approx((-1.0 - 0.5) / 2)
    for row in rows:
        assert row["quality_delta_low"] <= row["quality_delta"] <= row["quality_delta_high"]


def test_verify_cost_interpolates_the_measured_passes():
    from diversed_hf.lab.bench.stats import verify_cost

    costs = {
        "target_token_seconds": 2.0,
        "verify_pass_seconds": 3.0,
        "verify_pass_seconds_2": 2.4,
        "verify_pass_seconds_6": 3.0,
        "verify_pass_seconds_13": 4.4,
    }
    assert verify_cost(costs, 1) == pytest.approx(1.2)
    assert verify_cost(costs, 3) == pytest.approx(1.2 + 0.3 * 2 / 4)
    assert verify_cost(costs, 12) == pytest.approx(2.2)
    assert verify_cost({"target_token_seconds": 2.0, "verify_pass_seconds": 3.0}, 7) == pytest.approx(1.5)
    # past the longest timed pass: the least-squares slope of the three (0.1 per draft here)
    assert verify_cost(costs, 16) == pytest.approx(2.2 + 4 * 0.1, rel=0.05)


def test_verify_cost_never_extrapolates_below_the_timed_passes():
    """On a busy machine the longer pass can time faster than the shorter one: the cost past it must not fall."""
    from diversed_hf.lab.bench.stats import verify_cost

    busy = {"target_token_seconds": 1.0, "verify_pass_seconds_2": 3.0, "verify_pass_seconds_4": 1.0}
    assert verify_cost(busy, 3) == pytest.approx(1.0)
    assert verify_cost(busy, 5) == pytest.approx(1.0) and verify_cost(busy, 50) == pytest.approx(1.0)
    noisy = {
        "target_token_seconds": 1.0,
        "verify_pass_seconds_2": 1.0,
        "verify_pass_seconds_4": 1.4,
        "verify_pass_seconds_6": 1.2,
    }
    for n in (1, 2, 4, 5, 8, 100):
        assert verify_cost(noisy, n) >= 1.0
    assert verify_cost(noisy, 9) > verify_cost(noisy, 5)  # the fit over all three still rises


def test_bench_runs_policies_pairs_quality_and_transfers_heads(pair_dir, tmp_path):
    target, draft, tokenizer = bench.load_models(str(pair_dir / "target"), str(pair_dir / "draft"))
    heads = {}
    for task_name, seed in (("summary", 0), ("arith", 1)):
        heads[task_name] = DiversedHead.for_pair(target, draft)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in heads[task_name].parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    task = bench.load_task("summary", 6)
    methods, notes = bench.parse_methods(
        ["target", "sd", "static:0.5", "diversed", "diversed@arith"],
        head=heads["summary"],
        other_heads={"arith": heads["arith"]},
    )
    config = small_config(
        num_prompts=6,
        num_baseline_prompts=3,
        num_samples=2,
        num_bootstrap=50,
        schedules=["constant:2", "heuristic", "optimal:3"],
    )
    before = draft.generation_config.num_assistant_tokens
    result = bench.run_bench(target, draft, tokenizer, task, methods, config, notes=notes)
    rows = {r["method"]: r for r in result.rows}
    assert len(rows) == 1 + 4 * 3
    for schedule, bound in (("constant N=2", 2), ("heuristic", 5), ("optimal N<=3", 3)):
        row = rows[f"SD @ {schedule}"]
        assert row["schedule"] == schedule and row["num_draft_tokens"] == bound
        assert 0 < row["mean_draft_length"] <= (bound if schedule != "heuristic" else 99)
        assert row["num_prompts"] == 6 and row["quality_reference"] is not None
    assert rows["SD @ constant N=2"]["mean_draft_length"] <= 2
    assert rows["static w=0.5 @ constant N=2"]["num_prompts"] == 3  # a baseline: the first num_baseline_prompts
    assert (
        rows["DIVERSED @ constant N=2"]["num_prompts"] == 6
        and rows["DIVERSED @ constant N=2"]["head_task"] == "summary"
    )
    transfer = rows["DIVERSED (arith head) @ constant N=2"]
    assert transfer["head_task"] == "arith" and transfer["num_prompts"] == 3
    assert draft.generation_config.num_assistant_tokens == before  # the heuristic's value is not left on the draft
    for row in result.rows:  # whatever the timings of this (maybe busy) machine: never negative
        assert row["predicted_speedup_measured_verify"] is not None and row["verify_cost"] > 0
        assert row["predicted_speedup_measured_verify"] > 0
    assert {"verify_pass_seconds_2", "verify_pass_seconds_3", "verify_pass_seconds_4"} <= set(result.meta["costs"])
    # the run records which weights its own head had (the summary head, not the arith head it also ran)
    assert result.meta["head_digest"] == module_digest(heads["summary"]) != module_digest(heads["arith"])
    table = bench.transfer_table([result])
    assert "| summary | DIVERSED (arith head) @ constant N=2 | arith |" in table
    policy = bench.policy_table({1: [result], 8: [result]})
    assert "| summary | SD | heuristic |" in policy and "tokens/s, batch 8" in policy
    page = bench.write_results_page([result], tmp_path / "out", tmp_path / "PAGE.md", sections=[("Policies", policy)])
    text = page.read_text()
    assert "## Heads on another task" in text and "## Policies" in text and "vs target distribution [95 % CI]" in text


def test_block_specs_pair_with_their_token_wise_method(pair_dir):
    """``block:<spec>`` wraps any speculative method in BlockVerifier; its row compares with the token-wise one,
    paired over the same prompts (quality, tokens per round and the E[T] estimator), under every schedule."""
    from diversed_hf.verifiers import BlockVerifier

    head = DiversedHead(draft_hidden_size=32, target_hidden_size=32)
    methods, notes = bench.parse_methods(
        ["sd", "block:sd", "block:static:0.25,0.5", "block:diversed", "block:sd-ft"], head=head
    )
    assert [m.name for m in methods] == [
        "SD",
        "block SD",
        "block static w=0.25",
        "block static w=0.5",
        "block DIVERSED",
    ]
    assert methods[1].verifier == BlockVerifier(ExactVerifier()) and methods[1].paired_with == "SD"
    assert methods[3].base_family == "static-ensemble" and methods[4].own_head and methods[4].family == "block"
    assert len(notes) == 1 and notes[0].startswith("block verification: SD with a fine-tuned draft: skipped")
    for specs, message in (
        (["block"], "name the method"),
        (["block:target"], "target-only"),
        (["block:nope"], "Unknown"),
    ):
        with pytest.raises(ValueError, match=message):
            bench.parse_methods(specs)
    target, draft, tokenizer = bench.load_models(str(pair_dir / "target"), str(pair_dir / "draft"))
    config = small_config(
        num_prompts=4, num_baseline_prompts=2, num_bootstrap=50, schedules=["constant:2", "heuristic"]
    )
    result = bench.run_bench(target, draft, tokenizer, bench.load_task("arith", 4), methods[:3], config)
    rows = {r["method"]: r for r in result.rows}
    for schedule in ("constant N=2", "heuristic"):
        block, token_wise = rows[f"block SD @ {schedule}"], rows[f"SD @ {schedule}"]
        assert block["family"] == "block" and block["paired_with"] == f"SD @ {schedule}"
        assert block["num_prompts"] == token_wise["num_prompts"] == 4  # block SD is scored like SD: every prompt
        for what in ("quality", "tokens_per_round", "expected_tokens"):
            assert block[f"block_{what}_low"] <= block[f"block_{what}_delta"] <= block[f"block_{what}_high"]
        assert rows[f"block static w=0.25 @ {schedule}"]["num_prompts"] == 2  # a baseline, as static w=0.25 would be
    assert all(
        r["quality_reference"] == "SD @ constant N=2 + SD @ heuristic" for r in result.rows if r["family"] == "block"
    )
    table = bench.block_table([result])
    assert table.count("\n") == 1 + 2 and "| arith | SD @ heuristic |" in table and " → " in table
    assert bench.block_table([bench.BenchResult("arith", [rows["SD @ heuristic"]], {}, [], {})]) is None


def test_quality_batches_are_ordered_by_prompt_length():
    """The quality pass batches prompts of similar length together (a batch's prefill costs its longest prompt per
    row); ties keep the prompts' order."""
    from diversed_hf.lab.bench.runner import by_length

    prompts = ["a b c d e", "a", "a b c", "a b", "a b c"]
    assert by_length(load_tokenizer(), prompts, [0, 1, 2, 3, 4]) == [1, 3, 2, 4, 0]
    assert by_length(load_tokenizer(), prompts, [4, 0, 2]) == [2, 4, 0]


def test_a_task_without_answers_gets_the_chat_measures_against_target_only(pair_dir):
    """Prompts without references (everyday chat): each row's chat_quality scores its texts by the target's own
    log-likelihood and by ROUGE-L agreement with a target-only sample, paired with target-only; the table shows it."""
    from diversed_hf.lab.bench.report import chat_table, markdown_table

    target, draft, tokenizer = bench.load_models(str(pair_dir / "target"), str(pair_dir / "draft"))
    summary = bench.load_task("summary", 4)
    task = bench.BenchTask("chatty", summary.prompts, [""] * 4, lambda c, r: [0.0] * len(c), "agreement")
    methods, _ = bench.parse_methods(["target", "sd", "static:0"])
    config = small_config(num_timing_prompts=0, num_samples=2, num_bootstrap=50)
    rows = {r["method"]: r for r in bench.run_bench(target, draft, tokenizer, task, methods, config).rows}
    base = rows["target-only"]["chat_quality"]
    assert base["log_likelihood_delta"]["delta"] == 0.0 and base["agreement_delta"]["delta"] == 0.0
    assert base["log_likelihood"] < 0 and 0 <= base["agreement"] <= 1
    for name in ("SD", "static w=0"):
        chat = rows[name]["chat_quality"]
        assert chat["log_likelihood_delta"]["num_prompts"] == 4 and chat["agreement_delta"]["num_prompts"] == 4
        assert chat["log_likelihood_delta"]["low"] <= chat["log_likelihood_delta"]["delta"]
    assert "ROUGE-L agreement with a target sample" in markdown_table(list(rows.values()))
    answered = bench.run_bench(target, draft, tokenizer, summary, methods[:2], small_config(num_timing_prompts=0))
    assert "chat_quality" not in answered.rows[0] and chat_table(answered.rows) is None
