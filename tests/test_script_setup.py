"""The setup the measurement scripts share (``diversed_hf.cli.sections.start_script``)."""

from __future__ import annotations

import argparse

import pytest
import torch

from diversed_hf.cli import sections


def test_a_script_run_gets_its_folder_its_threads_and_the_command_that_reruns_it(tmp_path):
    threads = torch.get_num_threads()
    try:
        args = argparse.Namespace(quick=True, output_dir=None)
        output_dir, command = sections.start_script("everyday_results", args, ["--quick"], "everyday", threads=1)
        assert output_dir == sections.REPO / "results_quick" / "everyday"
        assert command == "python benchmarks/everyday_results.py --quick"
        assert torch.get_num_threads() == 1
        args = argparse.Namespace(quick=False, output_dir=str(tmp_path / "mine"))
        output_dir, _ = sections.start_script("everyday_results", args, [], "everyday", threads=None)
        assert output_dir == tmp_path / "mine" and not output_dir.exists()  # checked, not created
    finally:
        torch.set_num_threads(threads)


def test_a_script_run_into_the_package_is_refused_before_anything_loads():
    args = argparse.Namespace(quick=False, output_dir=str(sections.REPO / "diversed_hf" / "results"))
    with pytest.raises(ValueError, match=r"`--output_dir` .* is inside the package"):
        sections.start_script("everyday_results", args, [], "everyday")
