"""What the ``diversed-hf`` commands and the ``training/`` scripts share.

* Long options in both spellings: :class:`ArgumentParser` takes ``--num-examples`` and ``--num_examples``
  alike, as ``transformers.HfArgumentParser`` does for its dataclass fields.
* Output paths checked before a run starts (:func:`check_output_dir`, :func:`check_output_file`), so a
  path that cannot be written fails in a second instead of after the evaluation, with its results lost.
* :func:`write_text_atomic`: a file is replaced whole or not at all.
* User errors as one line: :func:`run_script` runs a script's ``main(argv)`` the way ``diversed-hf`` runs a
  subcommand. A :data:`USER_ERRORS` exception -- a ``ValueError`` (a bad argument, config or data), an
  ``OSError`` (a missing or unwritable file) or an ``ImportError`` (a missing extra) -- ends the run as one
  line ``<prog>: <message>`` on stderr with exit status 2, the status argparse gives its usage errors;
  ``--debug`` shows the traceback. Any other exception is a bug and keeps its traceback.

Library code never prints; only the commands and scripts call :func:`run_script` and :func:`error_line`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..common.files import write_text_atomic

__all__ = [
    "USAGE_ERROR",
    "regenerate_lines",
    "USER_ERRORS",
    "ArgumentParser",
    "add_debug_flag",
    "check_output_dir",
    "check_output_file",
    "error_line",
    "other_spelling",
    "run_script",
    "replace_section",
    "site_home",
    "write_site_home",
    "write_text_atomic",
]

#: Exceptions a user can fix (an argument, a file, an extra): shown as one line, without a traceback.
USER_ERRORS = (ValueError, OSError, ImportError)
#: Exit status of a usage or user error, as argparse's.
USAGE_ERROR = 2


def error_line(prog: str, error: BaseException) -> str:
    """``<prog>: <message>`` on one line (the message's whitespace collapsed)."""
    message = " ".join(str(error).split()) or type(error).__name__
    return f"{prog}: {message}"


def run_script(main: Callable[[list[str]], object], argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run ``main(argv)`` as a command and return its exit status.

    A :data:`USER_ERRORS` exception prints :func:`error_line` to stderr and returns 2 (with ``--debug``
    anywhere in ``argv`` it is raised with its traceback; ``--debug`` is removed before ``main`` sees the
    arguments). ``main`` returning an int gives the status; anything else is 0. Use as
    ``sys.exit(run_script(main))`` under ``if __name__ == "__main__":``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or Path(sys.argv[0]).name
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    try:
        status = main(argv)
    except USER_ERRORS as error:
        if debug:
            raise
        print(error_line(prog, error), file=sys.stderr)
        return USAGE_ERROR
    return status if isinstance(status, int) and not isinstance(status, bool) else 0


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """List ``--debug`` in a script's ``--help`` (:func:`run_script` reads it; ``main`` may ignore it)."""
    parser.add_argument(
        "--debug", action="store_true", help="On an error, show its traceback (default: one line, exit status 2)."
    )


def other_spelling(option: str) -> str | None:
    """``--num-examples`` <-> ``--num_examples``; ``None`` for short options and one-word names."""
    if not option.startswith("--") or len(option) <= 2:
        return None
    name = option[2:]
    if "-" in name:
        return "--" + name.replace("-", "_")
    if "_" in name:
        return "--" + name.replace("_", "-")
    return None


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written, and one default note per option: the one its help gives, else the value (none for
    an unset or off option)."""

    def _get_help_string(self, action):
        help_text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "default" in help_text or unset or not action.option_strings:
            return help_text
        default = " ".join(map(str, action.default)) if isinstance(action.default, list) else action.default
        return f"{help_text} (default: {default})"


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that takes every long option in both spellings, ``--num-examples`` and
    ``--num_examples``; ``--help`` shows the spelling the script declares. Subparsers are of this class too."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self.respell(args), namespace)

    def respell(self, args: list[str]) -> list[str]:
        """``args`` with each option written in the other spelling of a declared option renamed to it."""
        declared = self._option_string_actions  # every option string of the parser and its groups
        respelled = []
        for index, arg in enumerate(args):
            if arg == "--":  # what follows is positional
                return respelled + args[index:]
            option, equals, value = arg.partition("=")
            other = other_spelling(option) if option not in declared else None
            respelled.append(other + equals + value if other in declared else arg)
        return respelled


def _check_can_create(directory: Path, flag: str, target: Path) -> None:
    """``directory`` exists or can be created: its nearest existing ancestor is a directory this user can write
    (``target``, the path the user gave, names it in the message)."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"`{flag}` {target} cannot be created: {existing} is a file, not a directory. Pass another path."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"`{flag}` {target}: {existing} is not writable by this user. Pass a path you can write.")


def check_output_dir(path: str | os.PathLike, flag: str = "--output-dir") -> Path:
    """Raise before a run unless ``path`` is a writable directory or can be created as one; creates nothing.

    ``flag`` names the argument in the message (``--output-dir``).
    """
    path = Path(path).expanduser()
    _refuse_package(path, flag)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"`{flag}` {path} is a file, not a directory: pass a directory (created if missing), or move the file away."
        )
    _check_can_create(path, flag, path)
    return path


#: the installed package: no run writes into it (the assets change only through ``diversed-hf ship``)
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _refuse_package(path: Path, flag: str) -> None:
    if path.resolve().is_relative_to(PACKAGE_DIR):
        raise ValueError(
            f"`{flag}` {path} is inside the package ({PACKAGE_DIR}): write the run under runs/ or results/ and ship "
            "it into the testbed's assets with `diversed-hf ship RUN --as NAME`."
        )


def check_output_file(path: str | os.PathLike, flag: str = "--output") -> Path:
    """Raise before a run unless ``path`` can be written as a file (not a directory; its folder writable or
    creatable); creates nothing."""
    path = Path(path).expanduser()
    _refuse_package(path, flag)
    if path.is_dir():
        raise ValueError(f"`{flag}` {path} is a directory; pass a file path, e.g. {path / 'results.json'}.")
    if path.exists() and not os.access(path, os.W_OK):
        raise PermissionError(f"`{flag}` {path} is not writable by this user. Pass another path.")
    _check_can_create(path.parent, flag, path)
    return path


def regenerate_lines(command: str) -> list[str]:
    """The opening of a results section: the command that rebuilds it, as a Markdown code block."""
    return ["Regenerate with:", "", "```bash", command, "```", ""]


def replace_marked_block(path: str | os.PathLike, text: str, marker: str) -> None:
    """Put ``text`` between the ``<!-- marker -->`` and ``<!-- /marker -->`` lines of ``path`` (a README's figures
    that a results command writes)."""
    path = Path(path)
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    page = path.read_text()
    if start not in page or end not in page:
        raise ValueError(f"{path} has no {start} ... {end} block to put the text in.")
    head, _, rest = page.partition(start)
    _, _, tail = rest.partition(end)
    write_text_atomic(path, f"{head}{start}\n{text}\n{end}{tail}")


def replace_section(path: str | os.PathLike, title: str, body: str, before: str = "## Reading") -> None:
    """Put ``## <title>`` with ``body`` into the Markdown page ``path``: in place of that section, else before the
    first section starting with ``before`` (else at the end)."""
    import re

    path = Path(path)
    parts = re.split(r"(?m)^(?=## )", path.read_text())
    section = f"## {title}\n\n{body.strip()}\n\n"
    at = next((i for i, part in enumerate(parts) if part.startswith(f"## {title}\n")), None)
    if at is not None:
        parts[at] = section
    else:
        at = next((i for i, part in enumerate(parts) if part.startswith(before)), len(parts))
        parts.insert(at, section)
    write_text_atomic(path, "".join(parts))


def site_home(readme: str) -> str:
    """The docs site's home page (``docs/index.md``): the README with its links rewritten for the site
    (``docs/x.md`` -> ``x.md``, ``RESULTS.md`` -> ``results.md``)."""
    return readme.replace("](docs/", "](").replace("](RESULTS.md)", "](results.md)")


def write_site_home(repo: str | os.PathLike) -> Path:
    """Write ``<repo>/docs/index.md`` from ``<repo>/README.md`` (after a script changed the README)."""
    repo = Path(repo)
    return write_text_atomic(repo / "docs" / "index.md", site_home((repo / "README.md").read_text()))


def add_command(subparsers, name: str, help: str, description: str, func) -> argparse.ArgumentParser:
    """A ``diversed-hf`` subcommand: its one-line ``help``, its ``description`` wrapped to 100 columns, one default
    note per option (:class:`DefaultsHelpFormatter`), and ``func`` run with the parsed arguments."""
    import textwrap

    parser = subparsers.add_parser(
        name, help=help, description=textwrap.fill(description, width=100), formatter_class=DefaultsHelpFormatter
    )
    parser.set_defaults(func=func)
    return parser
