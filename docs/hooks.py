"""MkDocs hook: render the Sphinx roles of the docstrings as cross-references.

The package's docstrings use Sphinx roles (``:class:`~pkg.mod.Name```), which
mkdocstrings prints literally. After a page is rendered, turn each role into
an optional mkdocs-autorefs reference: it links to the API reference when the
target is documented there, and stays plain code when it is not (a relative
name, or a class of Python or Django), so it never breaks a strict build.
"""

from __future__ import annotations

import re

ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):<code>(?P<tilde>~?)"
    r"(?P<target>[A-Za-z_][\w.]*)(?P<call>\(\))?</code>"
)


def _reference(match: re.Match) -> str:
    target = match.group("target")
    shown = target.rsplit(".", 1)[-1] if match.group("tilde") else target
    shown += match.group("call") or ""
    if "." not in target or not target.startswith("django_distlock."):
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, **kwargs) -> str:
    return ROLE.sub(_reference, html)
