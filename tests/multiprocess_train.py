"""Worker of tests/test_multiprocess.py: train DiversedTrainer on the tiny pair, in one process or under ``accelerate launch``.

    accelerate launch --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no \
        tests/multiprocess_train.py OUT_DIR [MAX_STEPS]

The pair, tokenizer and prompts are tests/test_training.py's (``trainer_for``), with ``use_cpu=True`` (gloo between
processes). Every process writes ``OUT_DIR/rank<i>.pt``: its head's state dict before and after training, the rows
(prompts) each rollout call received, how often it wrote checkpoint files, and the world size; the run's
checkpoints go to ``OUT_DIR/out`` (one, at the last step).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_models, test_training
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # diversed_hf

from test_training import head_params, trainer_for  # noqa: E402


def main(out_dir: str, max_steps: int = 2) -> None:
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
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=4,
        save_strategy="steps",
        save_steps=max_steps,
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
    head = trainer.accelerator.unwrap_model(trainer.model)
    initial = head_params(head)
    trainer.train()
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
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        },
        out / f"rank{trainer.accelerator.process_index}.pt",
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
