"""Builds ``synopsis``'s data file from the Python standard library's docstrings (docs/synopsis.md).

    python -m diversed_hf.lab.tasks.synopsis_build --output diversed_hf/lab/tasks/data/synopsis.jsonl.gz

A PEP 257 docstring is a summary line, a blank line and a body: the body (after the object's name and signature)
is the document, the summary line its human-written one-line summary. Two sources, both the running
interpreter's standard library (PSF License):

- the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (tests, IDLE, lib2to3, turtledemo, ensurepip,
  pydoc_data and ``site-packages`` left out), read with ``ast`` (nothing is imported);
- the docstrings of the built-in and ``lib-dynload`` extension modules' functions, classes and methods, and of
  the built-in types (read by introspection).

A pair is kept when the summary is one or two lines of 15 to 200 characters starting with a capital letter and
the body has 60 to 2,000 characters and at least 12 words; pairs are deduplicated on the summary and on the body
(case and spacing ignored). Splits group pairs by top-level module, so near-copies (``_pyio`` / ``io``) share a
split: ``sha256("<seed>:<module>")`` modulo 10 is 0 for test, 1 for validation, else train.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib
import inspect
import json
import os
import re
import sys
import sysconfig
from pathlib import Path

from ..cli_utils import check_output_file, run_script

__all__ = ["build_pairs", "docstring_pairs", "main", "split_of"]

SKIPPED = re.compile(r"(^|/)(test|tests|idlelib|lib2to3|site-packages|turtledemo|__phello__|ensurepip|pydoc_data)(/|$)")
_WORD = re.compile(r"[A-Za-z]+")
TEST_BUCKET, VALIDATION_BUCKET, BUCKETS = 0, 1, 10


def split_of(module: str, seed: int = 0) -> str:
    """``"test"`` / ``"validation"`` / ``"train"`` for a pair of top-level module ``module`` (module docstring)."""
    top = module.split(".")[0].lstrip("_") or module  # _pyio and io, _json and json share a split
    bucket = int.from_bytes(hashlib.sha256(f"{seed}:{top}".encode()).digest()[:8], "big") % BUCKETS
    return "test" if bucket == TEST_BUCKET else "validation" if bucket == VALIDATION_BUCKET else "train"


def _signature(node: ast.AST) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        arguments = ast.unparse(node.args)
        return f"({arguments})"
    return ""


def _source_docstrings(stdlib: Path):
    """``(module, name with signature, docstring)`` of every module, class and function of the ``.py`` files."""
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib).as_posix()
        if SKIPPED.search(relative):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = relative[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        doc = ast.get_docstring(tree, clean=True)
        if doc:
            yield module, f"module {module}", doc
        todo = [(tree, module)]
        while todo:
            node, prefix = todo.pop(0)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}.{child.name}"
                    doc = ast.get_docstring(child, clean=True)
                    kind = "class " if isinstance(child, ast.ClassDef) else ""
                    if doc:
                        yield module, f"{kind}{name}{_signature(child)}", doc
                    if isinstance(child, ast.ClassDef):
                        todo.append((child, name))


def _extension_docstrings(stdlib: Path):
    """``(module, name, docstring)`` of the extension modules' and built-in types' callables and classes."""
    names = set(sys.builtin_module_names)
    dynload = stdlib / "lib-dynload"
    if dynload.is_dir():
        names |= {entry.split(".")[0] for entry in os.listdir(dynload)}
    import builtins

    roots = [("builtins", builtins)]
    roots += [
        (f"builtins.{t.__name__}", t)
        for t in (
            str,
            bytes,
            bytearray,
            list,
            tuple,
            dict,
            set,
            frozenset,
            int,
            float,
            complex,
            memoryview,
            range,
            object,
            type,
        )
    ]
    for name in sorted(names - {"builtins"}):
        if name.startswith(("_test", "xx", "_xx", "_ctypes_test")):
            continue
        try:
            roots.append((name, importlib.import_module(name)))
        except Exception:  # noqa: BLE001 - an extension this interpreter cannot load is left out
            continue
    for qualified, owner in roots:
        for attribute in sorted(dir(owner)):
            if attribute.startswith("__"):
                continue
            try:
                value = getattr(owner, attribute)
            except Exception:  # noqa: BLE001
                continue
            if not (inspect.isbuiltin(value) or inspect.ismethoddescriptor(value) or inspect.isclass(value)):
                continue
            doc = value.__doc__ if isinstance(getattr(value, "__doc__", None), str) else None
            if doc:
                signature = getattr(value, "__text_signature__", None) or ""
                signature = signature.replace("($self, ", "(").replace("($self)", "()").replace("($module, ", "(")
                signature = signature.replace("($module)", "()").replace("($type, ", "(")
                yield qualified.split(".")[0], f"{qualified}.{attribute}{signature}", inspect.cleandoc(doc)


def docstring_pairs(doc: str) -> tuple[str, str] | None:
    """``(summary, body)`` of a PEP 257 docstring that passes the filters (module docstring), else None."""
    parts = doc.split("\n\n", 1)
    if len(parts) < 2:
        return None
    summary, body = parts[0].strip(), parts[1].strip()
    if summary.count("\n") >= 2:
        return None
    summary = " ".join(summary.split())
    if not (15 <= len(summary) <= 200 and summary[0].isupper()):
        return None
    if not (60 <= len(body) <= 2000 and len(_WORD.findall(body)) >= 12):
        return None
    return summary, body


def build_pairs(stdlib: Path | None = None, seed: int = 0) -> list[dict]:
    """Every kept pair as a row: ``id``, ``module``, ``document``, ``summary``, ``split``."""
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    rows, summaries, bodies = [], set(), set()
    for source in (_source_docstrings(stdlib), _extension_docstrings(stdlib)):
        for module, name, doc in source:
            pair = docstring_pairs(doc)
            if pair is None:
                continue
            summary, body = pair
            summary_key, body_key = summary.lower(), " ".join(body.lower().split())
            if summary_key in summaries or body_key in bodies:
                continue
            summaries.add(summary_key)
            bodies.add(body_key)
            rows.append(
                {
                    "id": name,
                    "module": module,
                    "document": f"{name}\n\n{body}",
                    "summary": summary,
                    "split": split_of(module, seed),
                }
            )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="the .jsonl.gz to write")
    parser.add_argument("--seed", type=int, default=0, help="salts the module -> split assignment")
    args = parser.parse_args(argv)
    output = Path(args.output).expanduser()  # checked before the whole standard library is read
    if output.is_dir():
        raise ValueError(
            f"`--output` {output} is a directory; pass the file to write, e.g. {output / 'synopsis.jsonl.gz'}."
        )
    check_output_file(output, "--output")
    rows = build_pairs(seed=args.seed)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same pairs give the same bytes
    with open(args.output, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as handle:
        for row in rows:
            handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    counts = {split: sum(r["split"] == split for r in rows) for split in ("train", "validation", "test")}
    print(f"{len(rows)} pairs from Python {sys.version.split()[0]}'s standard library: {counts} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, prog="synopsis_build"))
