"""``diversed-hf`` command line: the subcommands in :data:`COMMANDS`.

Each module of :data:`COMMANDS` exposes ``register(subparsers)`` and adds its subcommands there
(``diversed_hf.cli.hub`` adds two, ``push`` and ``card``); only the module of the command being run is imported.
A :data:`PASSTHROUGH` command (``lm-eval``) hands its arguments to another tool's CLI through its module's
``cli_main(argv)`` instead.

A registered subcommand sets ``func`` on its parser (``parser.set_defaults(func=...)``); ``func`` takes the
parsed namespace and returns an exit code (or ``None`` for 0).

User errors -- a ``ValueError`` (bad argument or data), an ``OSError`` (missing or unwritable file) or an
``ImportError`` (a missing extra) -- end as one line ``diversed-hf <command>: <message>`` on stderr with
exit status 2, as argparse's usage errors do; ``--verbose`` shows the traceback too. A subcommand reports a
usage error by raising one of them (never ``SystemExit`` with a message, whose status is 1). Output paths are
checked before a command's run starts (:func:`diversed_hf.lab.cli_utils.check_output_dir`). Long options take both
spellings, ``--num-prompts`` and ``--num_prompts``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..lab.cli_utils import USAGE_ERROR, USER_ERRORS, ArgumentParser, error_line

#: subcommand -> (the module that registers it, its one-line help). A module's ``register`` adds the full parser;
#: only the chosen command's module is imported, so ``diversed-hf --help`` loads neither torch nor transformers.
COMMANDS = {
    "bench": ("diversed_hf.cli.bench", "Speed and quality of every decoding method on a model pair and task."),
    "demo": ("diversed_hf.cli.demo", "Target-only, SD, static ensemble and DIVERSED side by side: speed and text."),
    "push": (
        "diversed_hf.cli.hub",
        "Upload a saved head, or the custom_generate method, to the Hugging Face Hub (needs the Hub and a token).",
    ),
    "card": ("diversed_hf.cli.hub", "Re-render the model card (README.md) of saved heads."),
    "ship": ("diversed_hf.cli.ship", "Copy a measured run's staged shipment into the testbed's assets, with its card."),
    "throughput": ("diversed_hf.cli.throughput", "Tokens/s of batched speculative decoding on the testbed."),
    "lm-eval": (
        "diversed_hf.lab.harness",
        "lm-evaluation-harness with the `diversed` model: the harness's scores and speculation's, per task.",
    ),
}
#: commands that hand every argument after their name to another tool's own CLI (``module.cli_main(argv)``)
PASSTHROUGH = {"lm-eval"}
#: the modules that add commands
COMMAND_MODULES = sorted({module for module, _ in COMMANDS.values()})


def _chosen_command(argv: list[str]) -> str | None:
    """The first argument that names a command (the top-level options come before it)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``diversed-hf`` parser; the command named in ``argv`` gets its full parser, the others a summary line
    (``argv=None``: every command gets its full parser)."""
    parser = ArgumentParser(
        prog="diversed-hf",
        description="Relaxed speculative decoding for transformers. `diversed-hf COMMAND --help` shows a command's "
        "options.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Log progress (INFO level) to stderr.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if argv is None else _chosen_command(argv)
    to_load = {module for name, (module, _) in COMMANDS.items() if argv is None or name == chosen}
    registered = set()
    for name, (module, help_text) in COMMANDS.items():
        if module in to_load and name not in PASSTHROUGH:  # a passthrough command's options are the other tool's
            if module not in registered:  # a module may add several commands (hub_cli: push and card)
                importlib.import_module(module).register(subparsers)
                registered.add(module)
        else:
            subparsers.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = _chosen_command(argv)
    if chosen in PASSTHROUGH:  # e.g. lm-eval's own options and --help, untouched
        return _passthrough(chosen, argv[argv.index(chosen) + 1 :], verbose=any(a in ("-v", "--verbose") for a in argv))
    parser = build_parser(argv)
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


def _passthrough(command: str, rest: list[str], verbose: bool) -> int:
    """Run a :data:`PASSTHROUGH` command: its module's ``cli_main(rest)``, user errors ending as one line."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    try:
        return int(importlib.import_module(COMMANDS[command][0]).cli_main(rest) or 0)
    except USER_ERRORS as error:
        if verbose:
            raise
        print(error_line(f"diversed-hf {command}", error), file=sys.stderr)
        return USAGE_ERROR
