"""Every relative link in README.md and docs/*.md reaches a file, and every ``#anchor`` in it a
heading of that file (GitHub's rule: lower case, punctuation dropped, spaces to hyphens, a
repeated heading numbered -1, -2, ...). Code blocks are skipped."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    kept = (c for c in text if c in "- _" or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


def prose(path: Path) -> str:
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    names = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", prose(path), flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        names.add(base if n == 0 else f"{base}-{n}")
    return names


def test_the_slug_rule_matches_githubs_on_known_headings() -> None:
    assert slug("2026-11-26: the sequential experiment, first pair") == (
        "2026-11-26-the-sequential-experiment-first-pair"
    )
    assert slug("LLM claims (`llm-claims.md`)") == "llm-claims-llm-claimsmd"
    assert slug("a thirty-eighth run, `neg-abs` on seeds 6–8") == (
        "a-thirty-eighth-run-neg-abs-on-seeds-68"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no such heading")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)
