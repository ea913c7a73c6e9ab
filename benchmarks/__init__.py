"""Benchmark scripts (`python -m benchmarks --list`); shared option parsing lives here."""

from __future__ import annotations


def shopping_families(parser, value: str) -> list[str]:
    """A ``--families`` value ('all', or comma-separated Shopping task families) as a list; an unknown or empty
    choice is a `parser.error` naming the choices."""
    from shopsim.envs.shopping import FAMILIES

    fams = list(FAMILIES) if value == "all" else [f for f in str(value).split(",") if f]
    bad = [f for f in fams if f not in FAMILIES]
    if bad or not fams:
        parser.error(f"--families: unknown {bad or 'empty'}; choose from {', '.join(FAMILIES)}")
    return fams
