"""``diversed-hf`` command line: the subcommands of the modules in :data:`COMMAND_MODULES`.

Each module exposes ``register(subparsers)`` and adds its subcommands there (``diversed_hf.hub_cli``
adds two, ``push`` and ``card``).

A registered subcommand sets ``func`` on its parser (``parser.set_defaults(func=...)``); ``func`` takes the
parsed namespace and returns an exit code (or ``None`` for 0).

User errors -- a ``ValueError`` (bad argument or data), an ``OSError`` (missing or unwritable file) or an
``ImportError`` (a missing extra) -- end as one line ``diversed-hf <command>: <message>`` on stderr with
exit status 2, as argparse's usage errors do; ``--verbose`` shows the traceback too. A subcommand reports a
usage error by raising one of them (never ``SystemExit`` with a message, whose status is 1). Output paths are
checked before a command's run starts (:func:`diversed_hf.cli_utils.check_output_dir`). Long options take both
spellings, ``--num-prompts`` and ``--num_prompts``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .cli_utils import USAGE_ERROR, USER_ERRORS, ArgumentParser, error_line

# Modules that add subcommands. Append yours; imports happen lazily at parse time.
COMMAND_MODULES = [
    "diversed_hf.bench.cli",
    "diversed_hf.demo",
    "diversed_hf.hub_cli",
    "diversed_hf.throughput",
]


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="diversed-hf", description="Relaxed speculative decoding for transformers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="Log progress (INFO level) to stderr.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # transformers' "Loading weights" bars are noise in a command's output
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as error:
        if args.verbose:
            raise
        print(error_line(f"diversed-hf {args.command}", error), file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
