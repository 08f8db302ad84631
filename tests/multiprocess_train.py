"""Worker of tests/test_multiprocess.py: train DiversedTrainer on the tiny pair, in one process or under ``accelerate launch``.

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no \
        tests/multiprocess_train.py OUT_DIR [MAX_STEPS] [--steps-per-generation S] [--save-steps N] [--resume]

The pair, tokenizer and prompts are tests/test_training.py's (``trainer_for``), with ``use_cpu=True`` (gloo between
processes); 8 rows per process per optimizer step, G = 4. Every process writes ``OUT_DIR/rank<i>.pt``: its head's
state dict before and after training, the rows (prompts) each rollout call received, how often it wrote checkpoint
files, its rollout buffer and sampling RNG at the end (and as restored, with ``--resume``), and the world size; the
run's checkpoints go to ``OUT_DIR/out`` (by default one, at the last step).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from test_training import head_params, trainer_for


def rollout_state(trainer) -> dict:
    """This process's buffered rollout batch and sampling RNG, as comparable fingerprints."""
    buffered = trainer.rollouts.batches
    return {
        "step": trainer.rollouts.step,
        "buffer": None if buffered is None else [float(batch["draft_hidden"].double().sum()) for batch in buffered],
        "generator": trainer._rollout_generator.get_state().tolist(),
    }


def main(
    out_dir: str, max_steps: int = 2, steps_per_generation: int = 1, save_steps: int | None = None, resume: bool = False
) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    calls: list[list[str]] = []  # the prompts of every rollout batch this process scored, in order

    def counting_reward(prompts, completions, **kwargs):
        calls.append(list(prompts))
        return [float(len(c.split()) % 3) for c in completions]  # varies, so advantages are not all zero

    trainer = trainer_for(
        out,
        reward=counting_reward,
        use_cpu=True,
        max_steps=max_steps,
        per_device_train_batch_size=8 // steps_per_generation,
        steps_per_generation=steps_per_generation,
        num_generations=4,
        max_completion_length=4,
        save_strategy="steps",
        save_steps=save_steps or max_steps,
        # No `ddp_backend`: on CPU accelerate picks gloo itself when launched with several processes (naming gloo
        # here would make a single-process run ask for a process group that no launcher set up).
    )
    saves = {"head_files": 0, "checkpoint_extras": 0}  # how often this process wrote them

    def counted(name, method):
        def wrapper(*args, **kwargs):
            saves[name] += 1
            return method(*args, **kwargs)

        return wrapper

    trainer.save_head_files = counted("head_files", trainer.save_head_files)
    trainer.save_checkpoint_extras = counted("checkpoint_extras", trainer.save_checkpoint_extras)
    loaded = {}  # the rollout state a resumed run restored
    load_extras = trainer.load_checkpoint_extras

    def recording_load(checkpoint_dir):
        load_extras(checkpoint_dir)
        loaded.update(rollout_state(trainer))

    trainer.load_checkpoint_extras = recording_load
    head = trainer.accelerator.unwrap_model(trainer.model)
    initial = head_params(head)
    trainer.train(resume_from_checkpoint=True if resume else None)
    torch.save(
        {
            "initial": initial,
            "final": head_params(head),
            "calls": calls,
            "num_processes": trainer.accelerator.num_processes,
            "process_index": trainer.accelerator.process_index,
            "model_class": type(trainer.model_wrapped).__name__,
            "global_step": trainer.state.global_step,
            "saves": saves,
            "rollout_state": rollout_state(trainer),
            "loaded_rollout_state": loaded,
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        },
        out / f"rank{trainer.accelerator.process_index}.pt",
    )
    # Tear the process group down before the interpreter exits: gloo threads still alive at exit make the C++
    # runtime abort ("terminate called without an active exception") after the work is done.
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("max_steps", type=int, nargs="?", default=2)
    parser.add_argument("--steps-per-generation", type=int, default=1)
    parser.add_argument("--save-steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="resume from the newest checkpoint in OUT_DIR/out")
    options = parser.parse_args()
    main(options.out_dir, options.max_steps, options.steps_per_generation, options.save_steps, options.resume)
