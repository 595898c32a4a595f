"""Links between the docs resolve: every ``[text](file.md#anchor)`` and ``[text](#anchor)`` in README.md and docs/
names a file that exists and a heading in it, and every ``[text](path)`` to a file of the repository names one
that exists (GitHub's anchors: lower case, punctuation dropped, spaces as
hyphens, a repeated heading suffixed -1, -2 ...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]*?\.md)?#([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_to_a_heading_resolves(page: Path) -> None:
    broken = []
    for target, anchor in LINK.findall(FENCE.sub("", page.read_text())):
        if target.startswith(("http://", "https://")):
            continue
        linked = (page.parent / target) if target else page
        if not linked.exists() or anchor not in anchors(linked):
            broken.append(f"{target or page.name}#{anchor}")
    assert not broken, f"{page.name} links to headings that do not exist: {broken}"


FILE_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_to_a_file_of_the_repository_resolves(page: Path) -> None:
    missing = [target for target in FILE_LINK.findall(FENCE.sub("", page.read_text()))
               if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"
