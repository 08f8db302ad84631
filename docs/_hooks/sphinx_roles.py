"""A mkdocs hook (mkdocs.yml ``hooks``): the docstrings' Sphinx roles rendered as code on the API page.

The package's docstrings cross-reference with Sphinx roles (``:class:`DiversedHead```,
``:func:`~diversed_hf.verifiers.ops.residual```), which mkdocstrings' Markdown leaves as raw text before the code
span. This hook drops the role and, as Sphinx does for a leading ``~``, shows the last dotted component.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):<code>(~?)([^<]*)</code>")


def _code(match: re.Match) -> str:
    short, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **kwargs) -> str:
    return ROLE.sub(_code, html)
