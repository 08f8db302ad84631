"""benchmarks/vllm_results.py's pure parts: argument checks, rows, the table and the RESULTS.md section (no vLLM)."""

import argparse

import pytest
from scripts import load_script

from diversed_hf.cli.sections import VLLM_SECTION, refresh_head_sections

vllm_results = load_script("vllm_results")
ARMS = vllm_results.ARMS
Arm = vllm_results.Arm
check_sizes = vllm_results.check_sizes
parse_concurrency = vllm_results.parse_concurrency
results_table = vllm_results.results_table
summarize = vllm_results.summarize

TARGET = Arm("vLLM target-only", "vllm", "target", (0.0,))
SD = Arm("vLLM SD (its own sampler)", "vllm", "sd", (0.0,))
BROKEN = Arm("vLLM SD (its own sampler)", "vllm", "sd", (0.7,), valid=False, note="broken")


def test_parse_concurrency_takes_a_list_and_names_the_flag_when_wrong():
    assert parse_concurrency("1,8,32") == (1, 8, 32)
    for text in ("1,x", "0,8", f"{vllm_results.MAX_NUM_SEQS + 1}", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--concurrency"):
            parse_concurrency(text)


@pytest.mark.parametrize(
    "sizes, flag",
    [
        (dict(num_prompts=0, sequential_prompts=1, max_new_tokens=8, concurrency=(1,)), "--num-prompts"),
        (dict(num_prompts=4, sequential_prompts=8, max_new_tokens=8, concurrency=(1,)), "--sequential-prompts"),
        (dict(num_prompts=4, sequential_prompts=2, max_new_tokens=0, concurrency=(1,)), "--max-new-tokens"),
        (dict(num_prompts=4, sequential_prompts=2, max_new_tokens=8, concurrency=(1, 8)), "--concurrency"),
    ],
)
def test_check_sizes_names_the_argument(sizes, flag):
    with pytest.raises(ValueError, match=flag):
        check_sizes(**sizes)
    check_sizes(**{**vllm_results.FULL})


def test_summarize_counts_acceptance_tokens_per_round_and_token_zero():
    row = summarize(
        SD,
        0.0,
        8,
        seconds=2.0,
        token_ids=[[5, 0, 7], [0]],
        exact_match=[1.0, 0.0],
        num_drafts=4,
        num_draft_tokens=12,
        num_accepted=6,
    )
    assert row["num_tokens"] == 4 and row["tokens_per_second"] == 2.0
    assert row["acceptance"] == 0.5 and row["tokens_per_round"] == (6 + 4) / 4
    assert row["exact_match"] == 0.5 and row["token0_share"] == 0.5
    plain = summarize(TARGET, 0.0, 8, seconds=1.0, token_ids=[[1, 2]], exact_match=[1.0])
    assert plain["acceptance"] is None and plain["tokens_per_round"] is None


def test_table_puts_speed_against_the_same_backends_target_only_and_marks_invalid_arms():
    rows = [
        summarize(TARGET, 0.0, 1, seconds=2.0, token_ids=[[1] * 10], exact_match=[1.0]),
        summarize(
            SD,
            0.0,
            1,
            seconds=1.0,
            token_ids=[[1] * 10],
            exact_match=[1.0],
            num_drafts=2,
            num_draft_tokens=6,
            num_accepted=3,
        ),
        summarize(
            BROKEN,
            0.7,
            1,
            seconds=1.0,
            token_ids=[[0] * 9 + [1]],
            exact_match=[0.0],
            num_drafts=3,
            num_draft_tokens=9,
            num_accepted=1,
        ),
    ]
    lines = results_table(rows).splitlines()
    assert len(lines) == 2 + 3
    sd_line = next(line for line in lines if "| vLLM SD" in line and "| 0 |" in line)
    assert "2.00x" in sd_line and "50.0 %" in sd_line
    broken = next(line for line in lines if "invalid" in line)
    assert broken.startswith("| 0.7 |") and "90.0 %" in broken
    assert sd_line.endswith("| 1 / 1 |") and broken.endswith("| – |")  # greedy SD emitted target-only's tokens


def test_greedy_rows_count_the_outputs_identical_to_target_only():
    target = summarize(TARGET, 0.0, 2, seconds=1.0, token_ids=[[1, 2, 3], [4, 5]], exact_match=[1.0, 1.0])
    sd = summarize(SD, 0.0, 2, seconds=1.0, token_ids=[[1, 2, 3], [4, 6]], exact_match=[1.0, 0.0])
    line = next(line for line in results_table([target, sd]).splitlines() if "| vLLM SD" in line)
    assert line.endswith("| 1 / 2 |")
    del target["token_ids"]  # a run saved before the ids were kept
    assert results_table([target, sd]).splitlines()[-1].endswith("| – |")


def test_every_arm_is_a_known_backend_and_rule_and_the_broken_one_is_marked():
    for arm in ARMS:
        assert arm.backend in ("vllm", "generate")
        assert arm.rule in ("target", "sd") or 0.0 <= float(arm.rule.split(":")[1]) <= 1.0
    invalid = [arm for arm in ARMS if not arm.valid]
    assert invalid and all(arm.backend == "vllm" and arm.rule == "sd" and min(arm.temperatures) > 0 for arm in invalid)


def test_the_section_replaces_only_its_own_section_before_reading(tmp_path):
    # vllm_results writes results/vllm.md, then make_results' refresh puts it into RESULTS.md
    def replace_section(text: str, title: str, body: str) -> str:
        assert title == VLLM_SECTION[1]
        (tmp_path / f"{VLLM_SECTION[0]}.md").write_text(body)
        (tmp_path / "RESULTS.md").write_text(text)
        refresh_head_sections(tmp_path / "RESULTS.md", tmp_path)
        return (tmp_path / "RESULTS.md").read_text()

    page = "# Results\n\n## A\n\na\n\n## Serving with vLLM\n\nold\n\n## Reading the columns\n\nr\n"
    new = replace_section(page, "Serving with vLLM", "new table")
    assert "old" not in new and "## A\n\na" in new
    assert new.index("new table") < new.index("## Reading")
    assert replace_section(new, "Serving with vLLM", "new table") == new
    added = replace_section("# Results\n\n## A\n\na\n", "Serving with vLLM", "x")
    assert added.endswith("## Serving with vLLM\n\nx\n\n")


def test_the_eagle_draft_run_says_its_draft_and_writes_its_own_section():
    from diversed_hf.cli.sections import VLLM_EAGLE_SECTION

    vllm_results = load_script("vllm_results")
    DRAFTS = vllm_results.DRAFTS
    section_text = vllm_results.section_text

    meta = dict(
        command=".venv-vllm/bin/python benchmarks/vllm_results.py --draft eagle",
        minutes=1.0,
        load=0.5,
        cores=2,
        vllm="0.32.0",
        transformers="5.19.0",
        torch="2.13.0",
        sizes={"num_prompts": 2, "sequential_prompts": 1, "max_new_tokens": 4, "concurrency": [1]},
        draft="eagle",
    )
    rows = [summarize(TARGET, 0.0, 1, seconds=1.0, token_ids=[[1] * 4], exact_match=[0.0])]
    text = section_text(rows, meta, {})
    assert "save_for_vllm" in text and "results/vllm_eagle/" in text and "export_self_draft()" not in text
    assert DRAFTS["eagle"] == ("eagle", VLLM_EAGLE_SECTION)
