"""The benchmark scripts write the committed tables in docs/results/ only when asked to (`--results DIR`).

Read from the sources with `ast`, like `benchmarks.__main__.accepts_option` (importing every module would load torch,
Ray and the envs): a `--results` option defaults to None, and no module builds a docs/results path of its own (a
module constant, an argument default or a path in a function), so `python -m benchmarks.X --quick` or `make bench`
never replaces a table of record with quick figures.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
MODULES = sorted(p.stem for p in BENCH_DIR.glob("*.py") if p.stem != "__init__")
#: the scripts that write a table under docs/results/ (with --results docs/results)
TABLE_WRITERS = ("bench_lm_eval", "bench_lm_rl", "bench_scale", "bench_serve", "bench_shopping_options",
                 "diagnose_vapo", "eval_shipped_lm", "grad_noise_lm", "learning_lm", "models_board", "prorl_ladder",
                 "repro_arc",
                 "repro_basis", "repro_bipace", "repro_delta", "repro_midtrain", "repro_tropd", "repro_wapo",
                 "sb3_recipes")
#: a string that is a path into docs/results (not prose that mentions it, such as "e.g. --results docs/results")
RESULTS_PATH = re.compile(r"^(\./)?docs/results(/|$)|[/\\]docs[/\\]results([/\\]|$)")


def _add_argument_calls(tree: ast.AST, option: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            and any(isinstance(a, ast.Constant) and a.value == option for a in node.args)]


def _prose(tree: ast.AST) -> set[int]:
    """ids of the string constants that are text, not paths: docstrings and argparse help."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.keyword) and node.arg == "help":
            skip.update(id(n) for n in ast.walk(node.value))
    return skip


def _path_parts(node: ast.AST) -> list[str | None]:
    """The operands of a `a / b / c` chain, string constants as their value (others None)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _path_parts(node.left) + _path_parts(node.right)
    return [node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None]


def _adjacent(parts: list[str | None]) -> bool:
    return any(a == "docs" and b == "results" for a, b in zip(parts, parts[1:], strict=False))


def results_path_references(source: str) -> list[str]:
    """Where `source` builds a path into docs/results itself: `ROOT / "docs" / "results"`, `Path("docs", "results")`,
    `"docs/results"` as a default or a path (docstrings and help texts are prose and not counted)."""
    tree = ast.parse(source)
    prose = _prose(tree)
    found: dict[int, str] = {}  # one per line: the outermost expression (ast.walk goes outside in)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose \
                and RESULTS_PATH.search(node.value):
            found.setdefault(node.lineno, repr(node.value))
        elif isinstance(node, ast.BinOp) and _adjacent(_path_parts(node)):
            found.setdefault(node.lineno, ast.unparse(node))
        elif isinstance(node, ast.Call) and _adjacent(
                [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in node.args]):
            found.setdefault(node.lineno, ast.unparse(node))
    return [f"line {line}: {text}" for line, text in sorted(found.items())]


def results_defaults(source: str) -> list[object]:
    """The default of each `--results` option declared in `source` (None where it has none)."""
    out = []
    for call in _add_argument_calls(ast.parse(source), "--results"):
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        out.append(None if default is None else ast.literal_eval(default) if isinstance(default, ast.Constant)
                   else ast.unparse(default))
    return out


def _source(module: str) -> str:
    return (BENCH_DIR / f"{module}.py").read_text()


def test_the_checks_catch_the_old_defaults():
    """What the scripts did before: a module constant under docs/results, a --results default pointing there."""
    old = '''
"""Writes ``docs/results/bench_lm_rl.md``."""
import argparse
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "bench_lm_rl.md"
def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--results", default="docs/results", help="folder (default docs/results)")
    p.add_argument("--out", default=str(ROOT / "docs" / "results"))
    p.add_argument("--table", default=Path("docs", "results"))
'''
    assert len(results_path_references(old)) == 4  # RESULTS, the two defaults, Path("docs", "results")
    assert results_defaults(old) == ["docs/results"]
    new = '''
"""Writes ``DIR/x.md`` with ``--results DIR`` (the committed table: ``--results docs/results``)."""
import argparse
def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--results", default=None, help="write DIR/x.md (the committed one: docs/results)")
    print("no table written (pass --results DIR, e.g. --results docs/results)")
'''
    assert results_path_references(new) == [] and results_defaults(new) == [None]


def test_every_table_writer_takes_results():
    from benchmarks.__main__ import accepts_option

    assert [m for m in TABLE_WRITERS if not accepts_option(m, "--results")] == []
    assert [m for m in TABLE_WRITERS if accepts_option(m, "--no-table")] == []


@pytest.mark.parametrize("module", MODULES)
def test_results_defaults_to_none_and_no_module_builds_a_docs_results_path(module):
    source = _source(module)
    defaults = results_defaults(source)
    assert all(d is None for d in defaults), f"{module}: --results defaults to {defaults}"
    assert results_path_references(source) == [], f"{module} writes into docs/results without --results"


def test_eval_shipped_lm_without_results_writes_no_table(tmp_path, monkeypatch):
    """Run in a scratch working directory with the evaluation faked: nothing appears under ./docs, and the
    committed table is untouched; with --results the table is written there."""
    import benchmarks.eval_shipped_lm as esl
    from shopsim.paths import data_dir

    committed = [BENCH_DIR.parent / "docs" / "results" / f"shipped_lm.{ext}" for ext in ("md", "json")]
    before = [p.read_bytes() if p.is_file() else None for p in committed]

    def fake(path, family, tasks, tries):
        return {"family": family, "tasks": tasks, "tries": tries, "seeds": [0], "episodes": tasks * tries,
                "success": {"mean": 0.5, "ci95": [0.25, 0.75]}, "turns": None, "invalid_rate": None, "wall_s": 0.0}

    monkeypatch.setattr(esl, "evaluate_cell", fake)
    monkeypatch.chdir(tmp_path)
    argv = ["--checkpoints", str(data_dir() / "lm" / "sft"), "--families", "find_and_buy", "--tasks", "2",
            "--out", str(tmp_path / "cells"), "--json", str(tmp_path / "figures.json")]
    assert esl.main(argv) == 0
    assert not (tmp_path / "docs").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cells", "figures.json"]
    assert [p.read_bytes() if p.is_file() else None for p in committed] == before
    assert json.loads((tmp_path / "figures.json").read_text())["tasks"] == 2  # --json works as before
    assert esl.main([*argv, "--results", str(tmp_path / "res")]) == 0
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == ["shipped_lm.json", "shipped_lm.md"]
