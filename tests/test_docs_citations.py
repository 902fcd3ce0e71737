"""Citations of the project's notes resolve: ``docs/<name>.md#<slug>`` names a real section.

Comments, docstrings, configs and the README cite the notes in ``docs/`` by file and GitHub
heading anchor. This test scans those trees and checks that every cited file exists, that a
heading with that anchor exists (GitHub's slug rules, duplicate headings suffixed ``-1``,
``-2``, ...), and that the section has body text. It also rejects citations of notes that do
not ship with the project: bare ``vllm.md`` / ``simulator.md`` / ... names, ``§`` section
numbers, and paths into the shared reference folder.

The checks are small pure functions tested on in-memory text first, so a broken citation is
shown to be reported before the repository scan is trusted to find none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCANNED_DIRS = ("autotune", "tests", "benchmarks", "scripts", "configs")
SCANNED_FILES = ("README.md",)
SCANNED_SUFFIXES = frozenset(
    {".py", ".sh", ".yaml", ".yml", ".toml", ".md", ".txt", ".json", ".jsonl", ".log", ".mako"}
)
# This file spells out the forbidden forms on purpose (patterns and planted examples).
SELF = Path(__file__).resolve()

# Names of the reference notes that once lived outside the repository. Cited without the
# ``docs/`` prefix they point nowhere a reader of this repository can follow.
NOTE_NAMES = ("vllm", "simulator", "loadgen", "vllm-cpu", "method", "prior-art", "ecosystem-notes")

_CITATION_RE = re.compile(r"(?<![\w/.-])docs/([\w.-]+?\.md)(?:#([\w-]+))?")
_BARE_NOTE_RE = re.compile(
    r"(?<![\w/.-])((?:" + "|".join(re.escape(n) for n in NOTE_NAMES) + r")\.md)\b"
    r"|(?<![\w/.-])(prior-art|ecosystem-notes)\b"
    r"|(§)"
)
_SHARED_RE = re.compile(r"\.\./shared|shared/reference|/work/shared")
_SEED_RE = re.compile(r"seed guide|the seed's", re.IGNORECASE)
_HEADING_RE = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_FENCE_RE = re.compile(r"^[ \t]{0,3}(```|~~~)")
_DOC_LINK_RE = re.compile(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)")


# -- pure logic ------------------------------------------------------------------------------
def slugify(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation removed (letters, digits,
    underscores, hyphens and spaces kept), each space turned into a hyphen."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@dataclass(frozen=True)
class Section:
    level: int
    title: str
    slug: str
    has_body: bool  # non-blank, non-heading text before the next heading of its level or higher


def parse_sections(markdown: str) -> dict[str, Section]:
    """Sections of a Markdown text keyed by anchor, duplicates suffixed ``-1``, ``-2`` in
    document order as GitHub does. Lines inside fenced code blocks are never headings."""
    lines = markdown.splitlines()
    heads: list[tuple[int, int, str]] = []  # (line index, level, title)
    in_fence = False
    for i, line in enumerate(lines):
        if _FENCE_RE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else _HEADING_RE.match(line)
        if m:
            heads.append((i, len(m.group(1)), m.group(2)))
    head_lines = {i for i, _, _ in heads}
    seen: dict[str, int] = {}
    sections: dict[str, Section] = {}
    for n, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
        body = any(lines[k].strip() and k not in head_lines for k in range(i + 1, end))
        base = slugify(title)
        slug = base
        if base in seen:
            seen[base] += 1
            slug = f"{base}-{seen[base]}"
        else:
            seen[base] = 0
        sections[slug] = Section(level, title, slug, body)
    return sections


@dataclass(frozen=True)
class Citation:
    line: int
    doc: str  # file name inside docs/
    anchor: str | None


def find_citations(text: str) -> list[Citation]:
    """Every ``docs/<name>.md`` reference in a text, with its ``#anchor`` if it has one."""
    return [
        Citation(n, m.group(1), m.group(2))
        for n, line in enumerate(text.splitlines(), 1)
        for m in _CITATION_RE.finditer(line)
    ]


def check_citation(c: Citation, docs: Mapping[str, str]) -> str | None:
    """Why a citation does not resolve against ``docs`` (file name -> text), or None."""
    if c.doc not in docs:
        return f"docs/{c.doc} does not exist"
    if c.anchor is None:
        return None
    section = parse_sections(docs[c.doc]).get(c.anchor)
    if section is None:
        return f"docs/{c.doc} has no heading with anchor #{c.anchor}"
    if not section.has_body:
        return f"docs/{c.doc}#{c.anchor} ({section.title!r}) has no body text"
    return None


def broken_citations(texts: Mapping[str, str], docs: Mapping[str, str]) -> list[str]:
    """``where: why`` for every citation in ``texts`` (name -> text) that does not resolve."""
    return [
        f"{name}:{c.line}: {why}"
        for name, text in texts.items()
        for c in find_citations(text)
        if (why := check_citation(c, docs)) is not None
    ]


def bare_note_mentions(text: str) -> list[tuple[int, str]]:
    """``(line, what)`` for notes cited without ``docs/``: bare note file names, the old
    reference folder's other notes, and ``§`` section numbers."""
    return [
        (n, m.group(0))
        for n, line in enumerate(text.splitlines(), 1)
        for m in _BARE_NOTE_RE.finditer(line)
    ]


def shared_folder_mentions(text: str) -> list[tuple[int, str]]:
    """``(line, text)`` for lines that point into the shared reference folder."""
    return [
        (n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if _SHARED_RE.search(line)
    ]


def seed_without_method_citation(text: str) -> bool:
    """True when a text names the seed guide as a source but never cites docs/method.md."""
    return bool(_SEED_RE.search(text)) and not any(
        c.doc == "method.md" and c.anchor for c in find_citations(text)
    )


# -- the repository --------------------------------------------------------------------------
def _scanned_files() -> Iterator[Path]:
    for d in SCANNED_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if (
                p.is_file()
                and p.suffix in SCANNED_SUFFIXES
                and "__pycache__" not in p.parts
                and p.resolve() != SELF
            ):
                yield p
    for f in SCANNED_FILES:
        yield ROOT / f


def _texts(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


@pytest.fixture(scope="module")
def repo_texts() -> dict[str, str]:
    return _texts(_scanned_files())


@pytest.fixture(scope="module")
def docs() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))}


# -- unit tests of the pure logic ------------------------------------------------------------
@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("4.4 KV cache too small", "44-kv-cache-too-small"),
        ("1 Engine args and their defaults", "1-engine-args-and-their-defaults"),
        ("What `gpu_memory_utilization` means", "what-gpu_memory_utilization-means"),
        ("Arrivals: rate, burstiness (gamma)!", "arrivals-rate-burstiness-gamma"),
        ("  Trailing spaces  ", "trailing-spaces"),
        ("A - B", "a---b"),
        ("Überblick", "überblick"),
    ],
)
def test_slugify(heading: str, slug: str) -> None:
    assert slugify(heading) == slug


SAMPLE = """# Title
Intro.

## 1 Alpha
Alpha text.

### 1.1 Sub
Sub text.

## 2 Only subheadings
### 2.1 Empty
## 3 Body in a subsection
### 3.1 Filled
Some text.

## Notes
First.
## Notes ##
Second.

```bash
# not a heading
```
"""


def test_parse_sections_slugs_levels_and_duplicates() -> None:
    s = parse_sections(SAMPLE)
    assert list(s) == [
        "title",
        "1-alpha",
        "11-sub",
        "2-only-subheadings",
        "21-empty",
        "3-body-in-a-subsection",
        "31-filled",
        "notes",
        "notes-1",
    ]
    assert s["11-sub"].level == 3 and s["1-alpha"].level == 2
    assert s["notes-1"].title == "Notes"  # closing hashes are not part of the title


def test_parse_sections_body_text() -> None:
    s = parse_sections(SAMPLE)
    assert s["1-alpha"].has_body and s["11-sub"].has_body
    assert not s["2-only-subheadings"].has_body  # only a sub-heading
    assert not s["21-empty"].has_body
    assert s["3-body-in-a-subsection"].has_body  # a section spans its sub-sections
    assert s["notes"].has_body and s["notes-1"].has_body  # the code block is body text


def test_headings_in_code_fences_are_ignored() -> None:
    assert "not-a-heading" not in parse_sections(SAMPLE)


def test_find_citations() -> None:
    text = (
        "# see docs/vllm.md#3-the-v1-scheduler, and (docs/method.md#1-background).\n"
        "plain docs/vllm-cpu.md mention; not mydocs/vllm.md#x nor ../docs/x.md#y\n"
    )
    assert find_citations(text) == [
        Citation(1, "vllm.md", "3-the-v1-scheduler"),
        Citation(1, "method.md", "1-background"),
        Citation(2, "vllm-cpu.md", None),
    ]


DOCS_SAMPLE = {"vllm.md": SAMPLE}


def test_planted_broken_citations_are_reported() -> None:
    texts = {
        "ok.py": "# docs/vllm.md#1-alpha and docs/vllm.md#notes-1 and docs/vllm.md\n",
        "bad.py": (
            "x = 1\n"
            "# docs/vllm.md#no-such-section\n"
            "# docs/nowhere.md#1-alpha\n"
            "# docs/vllm.md#2-only-subheadings\n"
            "# docs/vllm.md#notes-2\n"
        ),
    }
    assert broken_citations(texts, DOCS_SAMPLE) == [
        "bad.py:2: docs/vllm.md has no heading with anchor #no-such-section",
        "bad.py:3: docs/nowhere.md does not exist",
        "bad.py:4: docs/vllm.md#2-only-subheadings ('2 Only subheadings') has no body text",
        "bad.py:5: docs/vllm.md has no heading with anchor #notes-2",
    ]


def test_bare_note_mentions() -> None:
    text = (
        "a (vllm.md §4.4) b\n"
        "c docs/vllm.md#44-x and docs/vllm-cpu.md are fine\n"
        "d vllm-cpu.md, simulator.md 3.2, loadgen.md\n"
        "e prior-art and ecosystem-notes.md\n"
        "f my-vllm.md and notes/simulator.md are other files\n"
    )
    assert bare_note_mentions(text) == [
        (1, "vllm.md"),
        (1, "§"),
        (3, "vllm-cpu.md"),
        (3, "simulator.md"),
        (3, "loadgen.md"),
        (4, "prior-art"),
        (4, "ecosystem-notes.md"),
    ]


def test_shared_folder_mentions() -> None:
    text = 'A = ROOT / "shared/reference/x"\nB = "../shared/y"\nC = "tests/data/shared-server"\n'
    assert [n for n, _ in shared_folder_mentions(text)] == [1, 2]


def test_seed_guide_needs_a_method_citation() -> None:
    assert seed_without_method_citation("the seed guide's method")
    assert seed_without_method_citation("the seed's step 2 (docs/vllm.md#5-x)")
    assert not seed_without_method_citation("the seed guide (docs/method.md#4-one-step)")
    assert not seed_without_method_citation("random seed 0")


# -- the repository --------------------------------------------------------------------------
def test_docs_exist(docs: dict[str, str]) -> None:
    assert {"vllm.md", "simulator.md", "loadgen.md", "method.md", "vllm-cpu.md"} <= set(docs)


def test_the_scan_finds_citations(repo_texts: dict[str, str]) -> None:
    # Guards the scan itself: if the file walk or the pattern broke, nothing would be checked.
    cited = {c.doc for text in repo_texts.values() for c in find_citations(text)}
    assert {"vllm.md", "simulator.md", "loadgen.md", "method.md", "vllm-cpu.md"} <= cited
    assert "README.md" in repo_texts and "autotune/sim/memory.py" in repo_texts


def test_every_citation_resolves(repo_texts: dict[str, str], docs: dict[str, str]) -> None:
    broken = broken_citations(repo_texts, docs)
    assert not broken, "broken citations:\n" + "\n".join(broken)


def test_links_between_docs_resolve(docs: dict[str, str]) -> None:
    broken = []
    for name, text in docs.items():
        for n, line in enumerate(text.splitlines(), 1):
            for m in _DOC_LINK_RE.finditer(line):
                why = check_citation(Citation(n, m.group(1), m.group(2)), docs)
                if why:
                    broken.append(f"docs/{name}:{n}: {why}")
    assert not broken, "broken links between docs:\n" + "\n".join(broken)


def test_no_bare_note_names_or_section_signs(repo_texts: dict[str, str]) -> None:
    found = [
        f"{name}:{n}: {what}"
        for name, text in repo_texts.items()
        for n, what in bare_note_mentions(text)
    ]
    assert not found, "cite docs/<name>.md#<anchor> instead of:\n" + "\n".join(found)


def test_seed_guide_mentions_cite_the_method(repo_texts: dict[str, str]) -> None:
    missing = [name for name, text in repo_texts.items() if seed_without_method_citation(text)]
    where = ", ".join(missing)
    assert not missing, f"cite docs/method.md#<anchor> where the seed guide is named: {where}"


def test_no_paths_into_the_shared_folder(repo_texts: dict[str, str]) -> None:
    found = [
        f"{name}:{n}: {line}"
        for name, text in repo_texts.items()
        for n, line in shared_folder_mentions(text)
    ]
    assert not found, "code and tests must not read the shared folder:\n" + "\n".join(found)
