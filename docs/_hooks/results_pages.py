"""A mkdocs hook (mkdocs.yml ``hooks``): the repository's results on the docs site.

``RESULTS.md`` (every measured table, each with the command that remakes it) and the plots under ``results/`` live
outside ``docs/``. At build time this hook

- splits ``RESULTS.md`` at its ``##`` sections into one page per area (:data:`AREAS`), with the plots embedded, under
  Measuring > Results in the navigation;
- adds every plot and per-token weight page under ``results/`` to the site, and a page showing all plots (some
  runs write more plots than their section embeds);
- lists every section on the Results overview (``docs/results.md``), and turns every mention of ``RESULTS.md`` in a
  page's text into a link: to the section a quoted title names (``RESULTS.md, "Token trees"``), else to the overview.

A section whose title no area claims fails the strict build, naming the title: add its prefix to :data:`AREAS`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from markdown.extensions.toc import slugify
from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.results_pages")

#: the site's results pages: (slug, title, the section-title prefixes it holds); the longest matching prefix wins
AREAS = (
    (
        "testbed",
        "The CPU testbed: the paper's tables",
        (
            "arith",
            "summary",
            "Heads on another task",
            "Draft-length policies",
            "Acceptance-quality front",
            "Head ablation",
            "Headroom by token class",
            "Reading the tokens-per-round columns",
        ),
    ),
    ("relaxed-rules", "Relaxed rules and judges", ("Relaxed rules",)),
    ("real-pair", "The real pair: heads and tasks", ("Real pair",)),
    (
        "drafts",
        "Drafts, trees and speed",
        (
            "Token trees",
            "EAGLE-3 draft",
            "Drafters",
            "Per-round overhead",
            "Batched rounds",
            "Draft data",
            "Distillation speed",
            "Block verification",
            "Real pair: the EagleDraft on everyday prompts",
            "Real pair: feature draft against self-draft",
            "Real pair: the task-tuned target's EagleDraft",
        ),
    ),
    ("serving", "Serving with vLLM", ("Serving with vLLM", "EAGLE-3 draft served by vLLM")),
    ("evaluation", "lm-evaluation-harness", ("lm-evaluation-harness",)),
)
PLOTS_PAGE = "results/plots.md"
MEDIA = (".png", ".html")
#: ``RESULTS.md`` and, optionally, the opening quote of a section title after it (``RESULTS.md, "Token trees"``)
MENTION = re.compile(r"RESULTS\.md(?:[,:]?\s*\(?\s*(?:section\s+)?(?P<quote>[\"'“]))?")
SKIPPED = re.compile(r"(<pre\b.*?</pre>|<code\b.*?</code>|<a\b.*?</a>|<[^>]*>)", re.DOTALL)


@dataclass
class Section:
    title: str
    body: str
    area: str = ""

    @property
    def anchor(self) -> str:
        return slugify(self.title, "-")


@dataclass
class Results:
    preamble: str = ""
    sections: list[Section] = field(default_factory=list)
    media: list[Path] = field(default_factory=list)
    repo: Path = Path(".")


_state = Results()


def _split(text: str) -> tuple[str, list[Section]]:
    """The text before the first ``##`` heading, and the ``##`` sections (headings inside code fences ignored)."""
    preamble, sections, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            sections.append(Section(line[3:].strip(), ""))
        elif sections:
            sections[-1].body += line + "\n"
        elif not line.startswith("# "):
            preamble.append(line)
    return "\n".join(preamble).strip() + "\n", sections


def _area_of(title: str) -> str | None:
    best = None
    for slug, _, prefixes in AREAS:
        for prefix in prefixes:
            if (title == prefix or title.startswith(prefix)) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), slug)
    return None if best is None else best[1]


def on_config(config, **kwargs):
    repo = Path(config.config_file_path).resolve().parent
    preamble, sections = _split((repo / "RESULTS.md").read_text(encoding="utf-8"))
    for section in sections:
        section.area = _area_of(section.title) or ""
        if not section.area:
            log.warning(
                f"RESULTS.md section {section.title!r} belongs to no results page: add it to AREAS ({__file__})"
            )
    media = sorted(p for p in (repo / "results").rglob("*") if p.suffix in MEDIA and p.is_file())
    _state.preamble, _state.sections, _state.media = preamble, sections, media
    _state.repo = repo
    pages = [{title: f"results/{slug}.md"} for slug, title, _ in AREAS] + [{"All plots": PLOTS_PAGE}]
    config.nav = [_with_results(entry, pages) for entry in config.nav]
    return config


def _with_results(entry, pages):
    """The navigation with ``Results: results.md`` grown into a section: the overview, then the area pages."""
    if isinstance(entry, dict):
        return {
            key: ([{"Overview": value}, *pages] if value == "results.md" else _with_results(value, pages))
            for key, value in entry.items()
        }
    if isinstance(entry, list):
        return [_with_results(item, pages) for item in entry]
    return entry


def _area_page(slug: str, title: str) -> str:
    parts = [
        f"# {title}\n",
        "From the repository's `RESULTS.md`: each section says on which pair, prompts, settings and machine it was "
        "measured, and the command that remakes it. [Every plot](plots.md) is on one page.\n",
    ]
    if slug == "testbed":
        parts.append(_state.preamble)
    for section in _state.sections:
        if section.area == slug:
            parts.append(f"## {section.title}\n\n{section.body}")
    return _site_links("\n".join(parts))


def _site_links(markdown: str) -> str:
    """``RESULTS.md``'s links are relative to the repository root (``results/x.png``); the pages live in
    ``results/``."""
    return markdown.replace("](results/", "](")


def _plots_page() -> str:
    shown = {}
    for section in _state.sections:
        for link in re.findall(r"\]\(results/([^)]+)\)", section.body):
            shown.setdefault(link, section)
    lines = [
        "# All plots\n",
        "Every plot under the repository's `results/`, by the folder its run wrote. A plot a `RESULTS.md` section "
        "embeds links to that section; the others are written beside it by the same run (temperature-0.7 reruns, "
        "per-position views). The `*_weights.html` pages colour each token of a sample by the head's weight `w`.\n",
    ]
    folder = None
    for path in _state.media:
        relative = path.relative_to(_state.repo / "results").as_posix()
        parent = str(Path(relative).parent)
        if parent != folder:
            folder = parent
            lines.append(f"\n## `results/{'' if parent == '.' else parent + '/'}`\n")
        section = shown.get(relative)
        where = f" (in [{section.title}]({section.area}.md#{section.anchor}))" if section else ""
        if path.suffix == ".png":
            lines.append(f"![{relative}]({relative})\n\n`{relative}`{where}\n")
        else:
            lines.append(f"- [{relative}]({relative}): per-token weights{where}\n")
    return "\n".join(lines)


def on_files(files, config, **kwargs):
    for slug, title, _ in AREAS:
        files.append(File.generated(config, f"results/{slug}.md", content=_area_page(slug, title)))
    files.append(File.generated(config, PLOTS_PAGE, content=_plots_page()))
    for path in _state.media:
        uri = path.relative_to(_state.repo).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    if page.file.src_uri != "results.md":
        return markdown
    lines = ["", "## Every section", ""]
    for slug, title, _ in AREAS:
        lines.append(f"**[{title}](results/{slug}.md)**\n")
        lines += [f"- [{s.title}](results/{slug}.md#{s.anchor})" for s in _state.sections if s.area == slug]
        lines.append("")
    lines.append("**[All plots](results/plots.md)**, by the run that wrote them.\n")
    return markdown + "\n".join(lines)


def _href(text_after: str) -> str:
    """Where a mention points, given the text after its opening quote (empty: no quote): the section whose title
    the quote holds (the longest that fits), the area page when a shorter quote names several sections of one area,
    else the overview."""
    closing = "\"'”"
    fitting = [
        s
        for s in _state.sections
        if text_after.startswith(s.title) and text_after[len(s.title) : len(s.title) + 1] in closing
    ]
    if fitting:
        section = max(fitting, key=lambda s: len(s.title))
        return f"results/{section.area}/#{section.anchor}"
    quoted = re.match(f"[^{closing}]+", text_after)
    areas = {s.area for s in _state.sections if quoted and s.title.startswith(quoted.group(0))}
    return f"results/{areas.pop()}/" if len(areas) == 1 else "results/"


def _linked(text: str, page) -> str:
    out, last = [], 0
    for match in MENTION.finditer(text):
        target = _href(text[match.end() :] if match.group("quote") else "")
        uri, _, anchor = target.partition("#")
        href = get_relative_url(uri, page.url) + (f"#{anchor}" if anchor else "")
        out += [text[last : match.start()], f'<a class="results-link" href="{href}">RESULTS.md</a>']
        last = match.start() + len("RESULTS.md")
    return "".join(out) + text[last:]


def on_page_content(html: str, page, **kwargs) -> str:
    """Every ``RESULTS.md`` in the page's text (outside code and existing links) becomes a link."""
    pieces = SKIPPED.split(html)
    for i in range(0, len(pieces), 2):  # even pieces are text between the skipped spans
        pieces[i] = _linked(pieces[i], page)
    return "".join(pieces)
