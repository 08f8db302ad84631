"""Every ```python block of the README and of the docs site's pages runs as it stands, offline (blocks that need the
Hub are compiled); every ```bash command there runs as written or says what it needs; the site's home is the README;
the site builds with ``mkdocs build --strict`` (where mkdocs is installed: the ``docs`` extra, part of ``dev``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
REPO = README.parent
NEEDS_REAL_PAIR = "# needs the real pair"
#: the pages whose blocks run: the README and the site's pages (index.md is the README's copy; your_task.md's
#: commands run in tests/test_your_task.py, with the dataset and reward they write)
PAGES = [README] + [
    page for page in sorted((REPO / "docs").glob("*.md")) if page.name not in ("index.md", "your_task.md")
]


def python_blocks() -> list[tuple[str, str]]:
    """``(page:line, code)`` of every ```python block of :data:`PAGES`."""
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [
            (f"{page.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1))
            for m in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL)
        ]
    return found


BLOCKS = python_blocks()


@pytest.mark.parametrize("line, code", BLOCKS, ids=[line for line, _ in BLOCKS])
def test_python_block(line, code, tmp_path):
    compile(code, line, "exec")
    real_pair = code.startswith(NEEDS_REAL_PAIR) and os.environ.get("DIVERSED_REAL_PAIR") == "1"
    if code.startswith("# needs") and not real_pair:  # the Hub, models of your own, the real pair: compiled only
        return
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{line} failed:\n{done.stderr[-3000:]}"
    if "UnsureTargetVerifier" in code:
        match = re.search(r"acceptance (\d\.\d\d)", done.stdout)
        assert match and 0.0 <= float(match.group(1)) <= 1.0, done.stdout


def test_the_custom_verifier_takes_ten_lines():
    """The example rule (run above with the other blocks) is at most ten lines of code."""
    blocks = [code for _, code in BLOCKS if "class UnsureTargetVerifier(Verifier)" in code]
    assert len(blocks) == 1, "the docs should hold exactly one custom-verifier example"
    verifier_lines = blocks[0].split("class UnsureTargetVerifier")[1].split("target, draft")[0]
    assert len([line for line in verifier_lines.strip().splitlines() if line.strip()]) <= 10


# ------------------------------------------------------------------------------------------------
# Bash blocks: each command runs offline as written, or its block (first line) or its line (trailing comment) says
# what it needs with "# needs ...": the Hub, GPUs, a file of yours.

INPUT_FLAGS = ("--results", "--head", "--config", "--prompts", "--data-files", "--data_files")
HUB_FLAGS = ("--target", "--draft", "--repo-id", "--model")  # a value of the form org/name that is no local path
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
PLACEHOLDER = re.compile(r"(^|[\s=/'\"])(\.\.\.|[A-Z][A-Z0-9]*_?[A-Z0-9]*(_DIR|\.yaml)|DIR)([\s,'\"]|$)")


def bash_commands() -> list[tuple[str, str, list[str]]]:
    """``(page:line, command, earlier commands of its block)`` of every unmarked command in a ```bash block."""
    found = []
    for page in PAGES:
        found += _page_commands(page)
    return found


def _page_commands(page: Path) -> list[tuple[str, str, list[str]]]:
    text = page.read_text()
    found = []
    for match in re.finditer(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        first = text[: match.start()].count("\n") + 2
        block = match.group(1)
        if block.lstrip().startswith("# needs"):
            continue
        joined, start = "", None
        earlier = []
        for offset, raw in enumerate(block.splitlines()):
            start = first + offset if start is None else start
            joined += raw.rstrip("\\").rstrip() + " "
            if raw.rstrip().endswith("\\"):
                continue
            command = joined.strip()
            joined, line_number = "", start
            start = None
            if not command or command.startswith("#"):
                continue
            if re.search(r"\s#\s*needs\b", command):
                earlier.append(command)
                continue
            found.append((f"{page.relative_to(REPO)}:{line_number}", command, list(earlier)))
            earlier.append(command)
    return found


COMMANDS = bash_commands()


def _argv(command: str, program: str) -> list[str]:
    import shlex

    code = re.split(r"\s#\s", command, maxsplit=1)[0]
    tokens = shlex.split(code.split("&&")[-1] if program == "diversed-hf" else code)
    at = next(i for i, token in enumerate(tokens) if token.endswith(program))
    return tokens[at + 1 :]


@pytest.mark.parametrize("line, command, earlier", COMMANDS, ids=[line for line, _, _ in COMMANDS])
def test_bash_command_runs_as_written_or_says_what_it_needs(line, command, earlier):
    code = re.split(r"\s#\s", command, maxsplit=1)[0]
    assert not PLACEHOLDER.search(code), f"{line}: a placeholder in an unmarked command: {command}"
    words = code.split()
    if any(word.endswith("diversed-hf") for word in words):
        from diversed_hf import cli

        argv = _argv(command, "diversed-hf")
        if argv[0] in cli.PASSTHROUGH:  # its options are another tool's (lm-eval's), checked by test_lm_eval.py
            return
        try:
            cli.build_parser(argv).parse_args(argv)
        except SystemExit as error:
            raise AssertionError(f"{line}: diversed-hf does not take {argv}") from error
    scripts = [word for word in words if word.startswith("training/") and word.endswith(".py")]
    for script in scripts:
        assert (REPO / script).is_file(), f"{line}: {script} does not exist"
    hub = [words[i + 1] for i, word in enumerate(words[:-1]) if word in HUB_FLAGS and HUB_ID.match(words[i + 1])]
    hub = [value for value in hub if not (REPO / value).exists()]
    assert not hub, f"{line}: {hub} are Hub ids: mark the line '# needs the Hub'"
    if len(words) > 1 and words[0].endswith("diversed-hf") and words[1] == "push":
        raise AssertionError(f"{line}: push needs the Hub: mark the line '# needs the Hub'")
    inputs = [words[i + 1] for i, word in enumerate(words[:-1]) if word in INPUT_FLAGS]
    if len(words) > 2 and words[0].endswith("diversed-hf") and words[1] in ("card", "push"):
        inputs.append(words[2])
    for path in inputs:
        if "=" in path:  # task=dir
            path = path.split("=", 1)[1]
        made_earlier = any(path.startswith(token.rstrip("/")) for c in earlier for token in c.split() if "/" in token)
        assert (REPO / path).exists() or made_earlier, (
            f"{line}: {path} is neither in the repository nor written by an earlier command of the block: "
            "add the command that makes it, or mark the line '# needs ...'"
        )


def test_the_site_home_is_the_readme():
    """docs/index.md is the README, links rewritten; a script that updates the README writes the home page from it
    (``diversed_hf.lab.cli_utils.write_site_home``)."""
    from diversed_hf.lab.cli_utils import site_home

    assert (REPO / "docs" / "index.md").read_text() == site_home(README.read_text()), (
        'docs/index.md differs from the README: run `python -c "from diversed_hf.lab.cli_utils import '
        "write_site_home; write_site_home('.')\"` from the repository root"
    )


def test_every_page_is_in_the_sites_navigation():
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = set()
    stack = list(config["nav"])
    while stack:
        entry = stack.pop()
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            stack.extend(value) if isinstance(value, list) else listed.add(value)
    assert listed == {page.name for page in (REPO / "docs").glob("*.md")}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    built = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(built)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return built


def test_the_site_builds_strictly(site):
    api = (site / "api" / "index.html").read_text()
    assert "DiversedHead" in api and not re.search(r":(class|func|meth|mod|data|attr):", api)  # roles rendered


class _PageText(HTMLParser):
    """A built page's images, links and the text outside links and code (where a bare ``RESULTS.md`` would be)."""

    def __init__(self):
        super().__init__()
        self.images, self.links, self.bare, self._inside = [], [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        elif tag in ("a", "code", "pre"):
            self._inside.append(tag)
            if tag == "a" and attrs.get("href"):
                self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if self._inside and self._inside[-1] == tag:
            self._inside.pop()

    def handle_data(self, data):
        if not self._inside:
            self.bare.append(data)


def _parsed(page: Path) -> _PageText:
    parser = _PageText()
    parser.feed(page.read_text())
    return parser


def _local(page: Path, href: str) -> tuple[Path, str]:
    """The file a relative link of ``page`` reaches (``x/`` -> ``x/index.html``) and its anchor."""
    path, _, anchor = href.partition("#")
    target = (page.parent / path).resolve() if path else page
    return (target / "index.html" if target.is_dir() else target), anchor


def test_the_site_shows_every_result_and_plot_and_links_every_mention(site):
    results = sorted((site / "results").glob("*/index.html")) + [site / "results" / "index.html"]
    assert len(results) >= 7, [str(p) for p in results]  # the overview, the area pages and the plots page
    shown = set()
    for page in results:
        for src in _parsed(page).images:
            image, _ = _local(page, src)
            assert image.is_file(), f"{page.relative_to(site)} shows {src}, which the site lacks"
            shown.add(image.relative_to(site).as_posix())
    plots = {p.relative_to(REPO).as_posix() for p in (REPO / "results").rglob("*.png")}
    assert plots and plots <= shown, f"plots not on the site: {sorted(plots - shown)}"
    sections = [line[3:] for line in (REPO / "RESULTS.md").read_text().splitlines() if line.startswith("## ")]
    text = "".join(page.read_text() for page in results)
    assert all(title.replace("'", "&#x27;") in text or title in text for title in sections)
    for page in sorted(site.rglob("*.html")):
        parsed = _parsed(page)
        bare = [chunk for chunk in parsed.bare if "RESULTS.md" in chunk]
        assert not bare, f"{page.relative_to(site)}: RESULTS.md mentioned without a link: {bare[0].strip()[:120]!r}"
        for href in parsed.links:
            if "://" in href or not href.startswith(("../", "results")) or "results" not in href:
                continue
            target, anchor = _local(page, href)
            assert target.is_file(), f"{page.relative_to(site)} links {href}, which the site lacks"
            if anchor and target.suffix == ".html":
                assert f'id="{anchor}"' in target.read_text(), f"{page.relative_to(site)} links {href}: no such anchor"
