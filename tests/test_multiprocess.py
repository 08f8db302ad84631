"""DiversedTrainer under ``accelerate launch``: 2 CPU processes (gloo) against 1, on the tiny pair (~40 s).

Both runs use tests/multiprocess_train.py with the same per-device config (8 rows per process per step,
G = 4 samples per prompt, 2 steps, a checkpoint at the last step). The 2-process run must split rollouts
between the processes (each sees other prompts, whole groups), see twice the rows per optimizer step,
synchronise gradients (identical heads on both ranks, moved from the initial head) and write its
checkpoint once (complete, from the main process only).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("accelerate")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

from diversed_hf.training import load_head
from diversed_hf.training.checkpoint import missing_checkpoint_files

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "multiprocess_train.py"
MAX_STEPS = 2
NUM_GENERATIONS = 4  # the worker's G
ROWS_PER_PROCESS = 8  # the worker's per_device_train_batch_size


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(out: Path, num_processes: int, *options: str, max_steps: int = MAX_STEPS) -> list[dict]:
    """Run the worker in ``num_processes`` processes; one record per rank, by rank."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.pt"):  # a resumed run writes its own
        stale.unlink()
    if num_processes == 1:
        launcher = [sys.executable]
    else:
        launcher = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(num_processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(_free_port()),
        ]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [*launcher, str(WORKER), str(out), str(max_steps), *options],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    finished = all((out / f"rank{rank}.pt").is_file() for rank in range(num_processes))
    # gloo's threads can still be alive when an interpreter exits, and the C++ runtime then aborts after the work is
    # done; the worker tears the process group down first, and an abort after every rank wrote its results is not a
    # failure of what is tested here.
    teardown_abort = "terminate called without an active exception" in done.stderr
    assert done.returncode == 0 or (finished and teardown_abort), done.stderr[-4000:]
    records = [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(num_processes)]
    assert [r["process_index"] for r in records] == list(range(num_processes))
    assert all(r["num_processes"] == num_processes and r["global_step"] == max_steps for r in records)
    return records


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiprocess")
    return {k: (root / f"np{k}", _run(root / f"np{k}", k)) for k in (1, 2)}


def test_two_processes_split_rollouts_and_see_twice_the_rows_per_step(runs):
    (_, single), (_, double) = runs[1], runs[2]
    assert [len(call) for call in single[0]["calls"]] == [ROWS_PER_PROCESS] * MAX_STEPS
    for record in double:
        assert [len(call) for call in record["calls"]] == [ROWS_PER_PROCESS] * MAX_STEPS
    for step in range(MAX_STEPS):
        single_rows = single[0]["calls"][step]
        step_rows = [row for record in double for row in record["calls"][step]]  # every process's rollout rows
        assert len(step_rows) == 2 * len(single_rows) == 2 * ROWS_PER_PROCESS
        # RepeatSampler groups survive the split: each prompt is sampled G times, all within one step, ...
        assert set(Counter(step_rows).values()) == {NUM_GENERATIONS}
        # ... and the processes got different prompts (rollouts split, not duplicated).
        assert not set(double[0]["calls"][step]) & set(double[1]["calls"][step])
        assert len(set(step_rows)) == 2 * len(set(single_rows))


def test_gradients_are_synchronised_every_rank_ends_with_the_same_head(runs):
    _, double = runs[2]
    assert all(record["model_class"] == "DistributedDataParallel" and record["backend"] == "gloo" for record in double)
    first, second = double[0]["final"], double[1]["final"]
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), f"{name} differs between the ranks"
    assert any(not torch.equal(first[name], double[0]["initial"][name]) for name in first), "the head did not train"
    for record in double:  # both ranks started from the same head too
        assert all(torch.equal(record["initial"][k], double[0]["initial"][k]) for k in first)


def test_checkpoint_is_written_once_and_complete(runs):
    (single_dir, _), (double_dir, double) = runs[1], runs[2]
    checkpoints = sorted(p.name for p in (double_dir / "out").iterdir() if p.name.startswith("checkpoint"))
    assert checkpoints == [f"checkpoint-{MAX_STEPS}"]
    checkpoint = double_dir / "out" / checkpoints[0]
    assert missing_checkpoint_files(checkpoint) == []
    # Only the main process writes the head and the shared files; every process its own RNG and rollout state.
    assert [record["saves"] for record in double] == [
        {"head_files": 1, "checkpoint_extras": 1},
        {"head_files": 0, "checkpoint_extras": 1},
    ]
    files = {str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()}
    single_checkpoint = single_dir / "out" / f"checkpoint-{MAX_STEPS}"
    single_files = {str(p.relative_to(single_checkpoint)) for p in single_checkpoint.rglob("*") if p.is_file()}
    assert files == (single_files - {"rng_state.pth"}) | {
        "rng_state_0.pth",
        "rng_state_1.pth",
        "diversed_trainer_state_1.pt",
    }
    saved = load_head(checkpoint).state_dict()
    assert all(torch.equal(saved[k], double[0]["final"][k]) for k in saved), "the checkpoint holds the trained head"


def test_resume_restores_each_process_its_own_rollout_buffer_and_rng(tmp_path):
    """Checkpoint in the middle of a rollout batch (steps_per_generation=2), then resume in 2 processes."""
    options = ("--steps-per-generation", "2", "--save-steps", "1")
    saved = _run(tmp_path, 2, *options, max_steps=1)
    assert all(record["rollout_state"]["step"] == 1 and record["rollout_state"]["buffer"] for record in saved)
    assert saved[0]["rollout_state"] != saved[1]["rollout_state"]  # each process has its own rollouts and RNG
    resumed = _run(tmp_path, 2, *options, "--resume", max_steps=2)
    for rank in range(2):
        assert resumed[rank]["loaded_rollout_state"] == saved[rank]["rollout_state"], f"rank {rank}"
