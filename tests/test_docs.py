"""The README stays short and every relative link in the docs leads somewhere: to a
file that exists and, with an anchor, to a heading of it (GitHub's anchor rules)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "docker" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")


def _prose(text):
    """The text without code: fenced blocks, indented blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    return re.sub(r"`[^`]*`", "", text)


def anchors(path):
    """The anchors GitHub makes for the headings of a Markdown file."""
    seen, result = {}, set()
    for line in _prose_headings(path.read_text()):
        slug = re.sub(r"[^\w\- ]", "", line.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def _prose_headings(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return [m.group(1) for m in re.finditer(r"^#{1,6} (.*)$", text, flags=re.M)]


def relative_links(page):
    for target in LINK.findall(_prose(page.read_text())):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            yield target


def broken_links(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    orphans = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300)"
    assert lines[2].split("#")[0].strip() == "bash scripts/demo.sh"
    assert lines[3].split("#")[0].strip() == "bash scripts/test.sh"


def test_the_check_finds_a_broken_link_and_anchor(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# A heading (with `code`)\n")
    page.write_text("[a](other.md#a-heading-with-code) [b](missing.md) [c](other.md#nope)\n"
                    "    [in code](ignored.md)\n")
    assert list(relative_links(page)) == ["other.md#a-heading-with-code", "missing.md",
                                          "other.md#nope"]
    assert anchors(tmp_path / "other.md") == {"a-heading-with-code"}
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#nope: no heading with that anchor"]


def test_the_version_is_written_once():
    """pyproject.toml takes the version from ctdsfs.__version__; the changelog has it."""
    import tomllib

    from ctdsfs import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert f"## {__version__} " in (ROOT / "CHANGELOG.md").read_text()
