"""The lab: what the project measures and demonstrates with, built on the core and never imported by it.

- :mod:`.tasks`: the task registry, the paper's tasks and their rewards, the code sandbox;
- :mod:`.bench`: the benchmark (``diversed-hf bench``): methods, runs, tables and plots;
- the commands' modules: :mod:`.demo`, :mod:`.throughput`, :mod:`.hub_cli` (``card`` / ``push``) and their shared
  :mod:`.cli_utils`; the console entry point itself is :mod:`diversed_hf.cli`.

The core (generation, verification, heads and their Hub I/O, the trainer) imports nothing from here
(docs/architecture.md, "Layers").
"""
