"""Each pytest-xdist worker computes on one thread.

The suite runs on two workers (``-n 2`` in pyproject.toml's pytest options); each would otherwise start torch with a
thread per core, and two workers on two cores would fight over them. Set before any test imports torch's kernels,
and in the environment, so the subprocesses a test starts inherit it.
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def pytest_configure(config):
    """Refuse a ``DIVERSED_TEST_DEVICE`` this machine does not have, naming the setting, before any test runs."""
    device = os.environ.get("DIVERSED_TEST_DEVICE")
    if not device:
        return
    import pytest
    import torch

    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as error:
        raise pytest.UsageError(
            f"DIVERSED_TEST_DEVICE is {device!r}, which this machine cannot use ({error}); unset it to run on the CPU."
        ) from None
