"""``diversed-hf`` command line: one subcommand per module, each module exposing ``register(subparsers)``.

A registered subcommand sets ``func`` on its parser (``parser.set_defaults(func=...)``); ``func`` takes the
parsed namespace and returns an exit code (or ``None`` for 0).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Modules that add subcommands. Append yours; imports happen lazily at parse time.
COMMAND_MODULES = [
    "diversed_hf.bench",
    "diversed_hf.demo",
    "diversed_hf.hub_cli",
    "diversed_hf.throughput",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diversed-hf", description="Relaxed speculative decoding for transformers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="Log progress (INFO level) to stderr.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
