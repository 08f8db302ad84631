"""One REINFORCE++ advantage computation: a batch split over two processes (torch.distributed, gloo, on the CPU)
gets the advantages one process computes for the whole batch, group baselines spanning the processes included."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from diversed_hf.training.objective import reinforce_pp_advantages

WORLD, ROWS, STEPS, GROUP = 2, 12, 7, 4  # 6 rows per process: the second group of 4 spans both


def batch():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(ROWS, generator=generator)  # (B,)
    lengths = torch.randint(1, STEPS + 1, (ROWS,), generator=generator)
    mask = (torch.arange(STEPS)[None] < lengths[:, None]).float()  # (B, T) ragged completions
    token_kl = torch.randn(ROWS, STEPS, generator=generator).abs()  # (B, T)
    return rewards, mask, token_kl


OPTIONS = dict(group_size=GROUP, use_group_baseline=True, kl_coef=0.3)


def _process(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        rewards, mask, token_kl = batch()
        rows = slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)

        def gather(tensor):
            parts = [torch.empty_like(tensor) for _ in range(WORLD)]
            dist.all_gather(parts, tensor.contiguous())
            return torch.cat(parts)

        def reduce_sum(tensor):
            tensor = tensor.clone()
            dist.all_reduce(tensor)
            return tensor

        advantages = reinforce_pp_advantages(
            rewards[rows],
            mask[rows],
            token_kl=token_kl[rows],
            gather=gather,
            reduce_sum=reduce_sum,
            rank=rank,
            **OPTIONS,
        )
        torch.save(advantages, f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_processes_whiten_the_batch_as_one_process_does(tmp_path):
    rewards, mask, token_kl = batch()
    one = reinforce_pp_advantages(rewards, mask, token_kl=token_kl, **OPTIONS)  # (B, T)
    mp.spawn(_process, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    two = torch.cat([torch.load(tmp_path / f"{rank}.pt") for rank in range(WORLD)])  # (B, T)
    torch.testing.assert_close(two, one, rtol=1e-5, atol=1e-6)
    valid = mask.bool()
    assert abs(float(one[valid].mean())) < 1e-5 and abs(float(one[valid].std(unbiased=False)) - 1) < 1e-4
