"""The documentation holds together: the README stays a short front page, and every
relative link in it, in ``docs/`` and in the changelog leads to a file (and heading)
that exists, so that moving or renaming a page cannot leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The README is the front door: a newcomer reads it in minutes; the rest is in docs/.
MAX_README_LINES = 450

#: A date or a results file's timestamp: the mark of a run log, which docs/ does not keep.
DATED = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|[0-9]{8}T[0-9]{4}")

#: ``[text](target)``; images (``![...](...)``) are links too.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)


def pages() -> list[Path]:
    """Every markdown page a reader of the repository follows links through."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped,
    spaces as hyphens, a repeated one suffixed ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` (outside code blocks) whose file or heading is
    missing; links to other sites are not followed."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: {broken_links(page)}"


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading: yes\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-code-heading-yes) [ok](https://example.com/x)\n"
        "[gone](missing.md) [gone](other.md#nowhere) [here](#page)\n"
        "```\n[in a code block](not-checked.md)\n```\n# Page\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nowhere (no such heading)"]


def test_the_readme_is_a_short_front_page_that_links_into_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < MAX_README_LINES
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    every_page = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert every_page <= linked, f"the README does not link {sorted(every_page - linked)}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda page: page.name)
def test_a_page_is_reference_not_a_dated_run_log(page: Path) -> None:
    """A page says what is true now and how to reproduce it; what changed when is in
    the changelog, and a figure's run is the result file the page links."""
    assert not DATED.findall(page.read_text()), f"{page.name}: {DATED.findall(page.read_text())}"
