"""The README is a newcomer's first page (at most 1,200 words), and every relative link in it and in docs/
leads somewhere: to a file that exists and, for a `#anchor` into a Markdown page, to one of its headings.
The glossary's pictures of the collectives come from scripts/draw_collectives.py, which must still draw them."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote

import pytest
from fixtures import load_script
from test_notebooks import GUIDE_AS_SEED

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_WORDS = 1200

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`+[^`\n]*`+")
# [text](target) and ![alt](target); a target may hold one level of parentheses
LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+(?:\([^()\s]*\)[^()\s>]*)?)>?(?:\s+\"[^\"]*\")?\s*\)"
)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text without code: a link-like string in a code block or span is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def relative_links(page: Path) -> list[str]:
    targets = [m.group(1) for m in LINK.finditer(_prose(page.read_text()))]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # not https:, mailto:, ...


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not destination.is_file():
            shown = destination.relative_to(ROOT) if destination.is_relative_to(ROOT) else destination
            broken.append(f"{target} (no file {shown})")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target} (no heading #{anchor} in {destination.name})")
    return broken


# ------------------------------------------------------------------------------------- the checker itself
def test_the_link_checker_finds_links_anchors_and_breakage(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section: with `code`, too\n")
    (tmp_path / "image.svg").write_text("<svg/>")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n[fine](other.md#a-section-with-code-too) ![pic](image.svg) [web](https://example.org)\n"
        "[here](#title) [gone](missing.md) [bad anchor](other.md#nowhere)\n"
        "`[not a link](nowhere.md)`\n\n```\n[nor this](nowhere.md)\n```\n"
    )
    assert relative_links(page) == [
        "other.md#a-section-with-code-too",
        "image.svg",
        "#title",
        "missing.md",
        "other.md#nowhere",
    ]
    broken = broken_links(page)
    assert len(broken) == 2, broken
    assert broken[0].startswith("missing.md (no file") and broken[1].startswith(
        "other.md#nowhere (no heading"
    )


# ------------------------------------------------------------------------------------------- the pages
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)} links to what is not there: {broken}"


def test_the_readme_reads_in_five_minutes():
    words = len(README.read_text().split())
    assert words <= README_MAX_WORDS, (
        f"README.md has {words} words (at most {README_MAX_WORDS}): move reference to docs/"
    )


def test_the_readme_says_what_the_container_guide_is_and_links_the_docs():
    text = README.read_text()
    assert "the PyTorch-CUDA 2.7 container guide" in text, (
        "the README says once what 'the container guide' is"
    )
    linked = {Path(t.partition("#")[0]).name for t in relative_links(README)}
    unlinked = sorted(p.name for p in DOCS if p.name not in linked)
    assert not unlinked, f"README.md does not link these pages of docs/: {unlinked}"
    assert "make test-deeper" in text and "notebooks/deeper/" in text, "the README says where the depth lives"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_the_docs_never_call_the_container_guide_the_seed(page):
    """The README's check (tests/test_notebooks.py) follows the text that moved from it to docs/."""
    found = sorted({m.group(0) for m in GUIDE_AS_SEED.finditer(page.read_text())})
    assert not found, f"{page.name} calls the container guide {found}: say 'the container guide'"


def test_every_make_target_has_a_row_in_make_targets_md():
    """docs/make-targets.md holds every target's details: a target added to the Makefile gets its row."""
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE)
    assert phony is not None
    internal = {"venv", "browser-deps", "slurm-deps"}  # set-up steps that other targets run
    text = (ROOT / "docs" / "make-targets.md").read_text()
    missing = sorted(t for t in phony.group(1).split() if t not in internal and f"`make {t}`" not in text)
    assert not missing, f"docs/make-targets.md does not describe: {missing}"


# ---------------------------------------------------------------------------- the glossary's pictures
def test_the_collectives_script_draws_every_picture_the_glossary_shows(tmp_path):
    draw = load_script("draw_collectives", ROOT / "scripts" / "draw_collectives.py")
    written = draw.main(["--out", str(tmp_path)])
    drawn = sorted(p.name for p in written)
    committed = sorted(p.name for p in (ROOT / "docs" / "images").glob("collective-*.svg"))
    assert drawn == committed, f"the script draws {drawn}, docs/images holds {committed}"
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    for name in ("all-reduce", "reduce-scatter", "all-gather", "broadcast", "reduce"):
        assert f"images/collective-{name}.svg" in glossary, f"the glossary does not show {name}"
    for path in written:
        texts = {el.text for el in ET.parse(path).iter() if el.tag.endswith("text") and el.text}
        ranks = {f"rank {r}" for r in range(draw.RANKS)}
        assert ranks | {"before", "after"} <= texts, f"{path.name} lacks rank or before/after labels: {texts}"


# ------------------------------------------------------------------------------------------- the notebooks
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted(
    (ROOT / "notebooks" / "deeper").glob("[0-9][0-9]_*.ipynb")
)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_every_relative_link_in_a_notebook_leads_to_a_file(notebook, tmp_path):
    """A lesson's link to its companion, a companion's back to its lesson, both to the glossary: as JupyterLab
    opens them, relative to the notebook's folder (the markdown cells, read as one page there)."""
    import json

    cells = json.loads(notebook.read_text())["cells"]
    page = notebook.with_suffix(".links.md")  # beside the notebook, so that its links resolve from there
    text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    try:
        page.write_text(text)
        broken = [b for b in broken_links(page) if not b.startswith("#")]  # in-notebook anchors: not checked
    finally:
        page.unlink(missing_ok=True)
    assert not broken, f"{notebook.relative_to(ROOT)} links to what is not there: {broken}"


def test_every_lesson_with_a_companion_links_it():
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = []
    for companion in sorted((ROOT / "notebooks" / "deeper").glob("[0-9][0-9]_*.ipynb")):
        lesson = next(p for p in lessons if p.stem[:2] == companion.stem[:2])
        if f"deeper/{companion.name}" not in lesson.read_text():
            missing.append(f"{lesson.name} -> deeper/{companion.name}")
    assert not missing, f"lessons that never link their companion: {missing}"
