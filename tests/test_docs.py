"""The docs stand alone and match the code: every registered algorithm has a page in docs/algorithms/ listing each
of its config fields with the dataclass default, every relative link in README.md and docs/ resolves (file and
heading), and nothing in the repository points at documents that do not ship with it."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from baselines.registry import _REGISTRY, load_target

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ALGO_DOCS = DOCS / "algorithms"


def _page_of(module: str) -> Path:
    """docs/algorithms/<name>.md for `baselines.<name>`; the shared LM core is documented in core.md."""
    parts = module.split(".")
    return ALGO_DOCS / ("core.md" if parts[1] == "core" else f"{parts[1]}.md")


def _pages_for(cls: type) -> list[Path]:
    """The algorithm's own page plus the pages of the modules its config dataclass inherits fields from."""
    pages = [_page_of(cls.__module__)]
    for base in cls.Config.__mro__:
        if dataclasses.is_dataclass(base) and base.__module__.startswith("baselines."):
            page = _page_of(base.__module__)
            if page not in pages:
                pages.append(page)
    return pages


def _option_rows(page: Path) -> dict[str, list[str]]:
    """field name -> default cells of the table rows ``| `field` | `default` | ... |`` on a page."""
    rows: dict[str, list[str]] = {}
    for line in page.read_text().splitlines():
        m = re.match(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \| `([^`]*)` \|", line)
        if m:
            rows.setdefault(m.group(1), []).append(m.group(2))
    return rows


def _default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _same(cell: str, value) -> bool:
    try:
        parsed = ast.literal_eval(cell)
    except (ValueError, SyntaxError):
        return False
    if isinstance(value, float) or isinstance(parsed, float):
        return isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and float(parsed) == float(value)
    return parsed == value and type(parsed) is type(value)


ALGORITHMS = sorted({target for target in _REGISTRY.values()})


@pytest.mark.parametrize("target", ALGORITHMS)
def test_every_config_field_is_documented_with_its_default(target):
    cls = load_target(target)
    pages = _pages_for(cls)
    for page in pages:
        assert page.is_file(), f"{target}: write {page.relative_to(ROOT)}"
    rows: dict[str, list[str]] = {}
    for page in pages:
        for name, cells in _option_rows(page).items():
            rows.setdefault(name, []).extend(cells)
    missing, wrong = [], []
    for f in dataclasses.fields(cls.Config):
        value = _default(f)
        if f.name not in rows:
            missing.append(f.name)
        elif not any(_same(cell, value) for cell in rows[f.name]):
            wrong.append(f"{f.name} (code: {value!r}, docs: {', '.join(rows[f.name])})")
    where = " + ".join(str(p.relative_to(ROOT)) for p in pages)
    assert not missing, f"{target}: add option rows to {where} for: {', '.join(missing)}"
    assert not wrong, f"{target}: update the defaults in {where}: {'; '.join(wrong)}"


def test_index_links_every_algorithm_page_and_training_links_the_index():
    index = (ALGO_DOCS / "README.md").read_text()
    for target in ALGORITHMS:
        page = _page_of(load_target(target).__module__).name
        assert f"]({page})" in index, f"docs/algorithms/README.md does not link {page}"
    assert "(algorithms/README.md)" in (DOCS / "training.md").read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", md.read_text(), flags=re.M)}


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)  # links inside code blocks are not links
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", link):  # http(s), mailto
            continue
        path, _, anchor = link.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            broken.append(link)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(link)
    assert not broken, f"{md.relative_to(ROOT)}: broken links {broken}"


#: documents that do not ship with the repository (the project's working notes)
OUTSIDE = ("../shared", "shared/docs", "algorithms.md", "anchors.md", "style.md", "design document", "closing note")


def test_nothing_refers_to_files_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml", "Makefile", "*.cfg", "*.yml", "*.yaml"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not files:  # not a git checkout (e.g. an sdist): scan the tree
        files = [str(p.relative_to(ROOT)) for ext in ("py", "md", "toml") for p in ROOT.rglob(f"*.{ext}")
                 if ".venv" not in p.parts]
    hits = []
    for name in files:
        if name == "tests/test_docs.py":
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            low = line.lower()
            hits += [f"{name}:{n}: {pat}" for pat in OUTSIDE if pat in low]
    assert not hits, "references to documents outside the repository:\n" + "\n".join(hits)


def test_docs_pages_cited_in_code_exist():
    """Docstrings point readers at docs/ pages; each cited page must exist."""
    cited = set()
    for folder in ("agents", "baselines", "shopsim", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            cited |= {(path, m) for m in re.findall(r"docs/[\w/.-]*\w", path.read_text())}
    assert cited, "no docs/ page is cited in the code"
    missing = sorted(f"{path.relative_to(ROOT)}: {ref}" for path, ref in cited if not (ROOT / ref).exists())
    assert not missing, "docs pages cited in code but missing:\n" + "\n".join(missing)
