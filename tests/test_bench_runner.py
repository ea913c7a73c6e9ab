"""`python -m benchmarks` (`make bench`): which modules it finds and the command line it gives each."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.__main__ import accepts_option, command, discover, main

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def test_every_benchmark_module_on_disk_is_found_and_nothing_else():
    found = discover()
    on_disk = {p.stem for p in BENCH_DIR.glob("*.py")}
    assert {m for m, kind in found.items() if kind == "throughput"} == {m for m in on_disk if m.startswith("bench_")}
    assert {m for m, kind in found.items() if kind == "reproduction"} == {
        m for m in on_disk if m.startswith(("repro_", "learning_"))}
    assert "example_algo" not in found and "__main__" not in found


def test_json_is_passed_only_to_modules_that_declare_it(tmp_path):
    assert accepts_option("bench_shopping", "--json") and accepts_option("bench_replenishment", "--json")
    assert not accepts_option("bench_lm", "--json")
    assert command("bench_shopping", full=False, json_dir=tmp_path) == [
        sys.executable, "-m", "benchmarks.bench_shopping", "--quick", "--json", str(tmp_path / "bench_shopping.json")]
    assert command("bench_lm", full=False, json_dir=tmp_path) == [sys.executable, "-m", "benchmarks.bench_lm",
                                                                  "--quick"]
    assert command("bench_lm", full=True, json_dir=None) == [sys.executable, "-m", "benchmarks.bench_lm"]


def test_list_and_unknown_module(capsys):
    assert main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == sorted(m for m in discover() if m.startswith("bench_"))
    assert main(["bench_nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown module bench_nope" in err



def test_a_sweep_skips_modules_without_a_quick_variant(monkeypatch, capsys):
    """`python -m benchmarks --repro` passes --quick; a module that does not declare it is skipped, not started
    with an argument it would reject (or run at its full, hours-long budget)."""
    from types import SimpleNamespace

    import benchmarks.__main__ as runner

    assert accepts_option("learning_lm", "--quick") and not accepts_option("bench_lm", "--nope")
    ran = []
    monkeypatch.setattr(runner.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or SimpleNamespace(returncode=0))
    real = runner.accepts_option
    monkeypatch.setattr(runner, "accepts_option", lambda m, o: False if m == "repro_hpo" else real(m, o))
    assert runner.main(["repro_hpo", "learning_lm"]) == 0
    assert [c[2] for c in ran] == ["benchmarks.learning_lm"] and ran[0][3] == "--quick"
    assert "repro_hpo: skipped" in capsys.readouterr().out
    ran.clear()
    assert runner.main(["repro_hpo", "--full"]) == 0 and [c[2] for c in ran] == ["benchmarks.repro_hpo"]
