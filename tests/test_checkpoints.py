"""Checkpoints count only when complete: a training process killed at each stage of a save resumes exactly.

The child process really dies (``os._exit``, no cleanup, no exception handling) right after a chosen
file of ``checkpoint-2`` is written; the parent then resumes with ``resume_from_checkpoint=True``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from test_training import head_params, trainer_for

from diversed_hf.training.checkpoint import complete_checkpoints, missing_checkpoint_files

TESTS_DIR = Path(__file__).resolve().parent
COMMON = dict(
    max_steps=3, num_iterations=2, learning_rate=0.05, save_strategy="steps", save_steps=1, save_total_limit=1
)

CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import torch, transformers.trainer_callback as callback
    from test_training import trainer_for

    torch.set_num_threads({threads})  # the parent's: another count may round a step differently
    KILL_AFTER = {kill_after!r}
    def dies_after(function, name_of):
        def wrapper(*args, **kwargs):
            result = function(*args, **kwargs)
            path = str(name_of(*args, **kwargs))
            if "checkpoint-2" in path and path.endswith(KILL_AFTER):
                os._exit(137)  # killed: nothing after this runs
            return result
        return wrapper
    torch.save = dies_after(torch.save, lambda obj, f, *a, **k: f)
    callback.TrainerState.save_to_json = dies_after(callback.TrainerState.save_to_json, lambda self, path: path)
    trainer_for(Path({root!r}), **{common!r}).train()
    """
)


def run_and_kill(root: Path, kill_after: str) -> None:
    script = CHILD.format(kill_after=kill_after, root=str(root), common=COMMON, threads=torch.get_num_threads())
    environment = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 137, done.stderr[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    trainer = trainer_for(tmp_path_factory.mktemp("straight"), **{**COMMON, "save_strategy": "no"})
    trainer.train()
    return head_params(trainer.model)


@pytest.mark.parametrize(
    "kill_after, resumes_from",
    [
        ("diversed_trainer_state.pt", "checkpoint-1"),  # our files written, the head and Trainer's not yet
        ("optimizer.pt", "checkpoint-1"),  # head and optimizer written, no trainer_state.json
        ("trainer_state.json", "checkpoint-2"),  # complete, killed before rotating checkpoint-1 away
    ],
)
def test_a_kill_at_each_stage_of_a_save_resumes_exactly(tmp_path, uninterrupted, kill_after, resumes_from, caplog):
    run_and_kill(tmp_path, kill_after)
    output_dir = tmp_path / "out"
    complete, incomplete = complete_checkpoints(output_dir)
    assert complete[-1].name == resumes_from
    if resumes_from == "checkpoint-1":
        assert [path.name for path in incomplete] == ["checkpoint-2"]
        with pytest.raises(
            ValueError, match=r"`resume_from_checkpoint` .*checkpoint-2' is incomplete: `.*` is missing"
        ):
            trainer_for(tmp_path, **COMMON).train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))

    resumed = trainer_for(tmp_path, **COMMON)
    with caplog.at_level("WARNING", logger="diversed_hf.training.checkpoint"):
        resumed.train(resume_from_checkpoint=True)
    if resumes_from == "checkpoint-1":
        assert "Skipping incomplete checkpoints" in caplog.text and "checkpoint-2" in caplog.text
    for key, value in uninterrupted.items():
        assert (value == resumed.model.state_dict()[key]).all(), key
    assert not missing_checkpoint_files(output_dir / "checkpoint-3")


def test_resume_true_without_a_complete_checkpoint_is_an_error(tmp_path):
    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds no complete checkpoint \(incomplete: .*checkpoint-5"):
        trainer_for(tmp_path, **COMMON).train(resume_from_checkpoint=True)


# ---------------------------------------------------------------------------------------------
# One run's checkpoints: a checkpoint resumes only into the run that wrote it


@pytest.fixture(scope="module")
def one_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    trainer_for(root, max_steps=1, save_strategy="steps", save_steps=1).train()
    return root / "out" / "checkpoint-1"


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_generations=2), "num_generations: checkpoint 4, now 2"),
        (dict(max_completion_length=6), "max_completion_length: checkpoint 8, now 6"),
        (dict(steps_per_generation=2, per_device_train_batch_size=4), "steps_per_generation: checkpoint 1, now 2"),
        (dict(lambda_acceptance=2.0), "lambda_acceptance: checkpoint 1.0, now 2.0"),
    ],
)
def test_resuming_with_other_rollout_settings_is_refused(tmp_path, one_checkpoint, change, message):
    """The checkpoint's rollout buffer was made with the old settings: it used to be replayed silently."""
    trainer = trainer_for(tmp_path, max_steps=2, **change)
    with pytest.raises(
        ValueError, match=rf"checkpoint-1 belongs to another run: .*{message}.*Resume with the settings"
    ):
        trainer.train(resume_from_checkpoint=str(one_checkpoint))


def test_resume_true_takes_only_this_runs_checkpoints_in_a_reused_output_dir(tmp_path, caplog):
    """Run A left checkpoint-3 in output_dir; run B (other lambda) wrote checkpoint-1 there and was killed."""
    trainer_for(tmp_path, max_steps=3, save_strategy="steps", save_steps=3).train()  # run A: checkpoint-3
    run_b = dict(lambda_acceptance=3.0, max_steps=2)
    trainer_for(tmp_path, **run_b, save_strategy="steps", save_steps=1).train()
    shutil.rmtree(tmp_path / "out" / "checkpoint-2")  # B was killed before its checkpoint-2
    straight = trainer_for(tmp_path / "straight", **run_b)
    straight.train()

    resumed = trainer_for(tmp_path, **run_b)
    with caplog.at_level("WARNING", logger="diversed_hf.training.checkpoint"):
        resumed.train(resume_from_checkpoint=True)
    assert (
        "Skipping newer checkpoints of another run" in caplog.text and "checkpoint-3 (lambda_acceptance" in caplog.text
    )
    for key, value in head_params(straight.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key

    with pytest.raises(
        ValueError,
        match=r"no checkpoint in .* belongs to this run: the newest, checkpoint-3, differs in "
        r"lambda_acceptance: checkpoint 1.0, now 5.0",
    ):
        trainer_for(tmp_path, lambda_acceptance=5.0).train(resume_from_checkpoint=True)


def test_a_checkpoint_without_a_run_record_is_refused_by_name(tmp_path, one_checkpoint):
    old = tmp_path / "checkpoint-1"
    shutil.copytree(one_checkpoint, old)
    (old / "diversed_run.json").unlink()  # as an older release wrote it
    with pytest.raises(ValueError, match=r"has no diversed_run.json: it was written by an older diversed_hf"):
        trainer_for(tmp_path, max_steps=2).train(resume_from_checkpoint=str(old))
