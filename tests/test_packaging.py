"""Packaging: the wheel's package list and where `shopsim.paths.data_dir` finds the shipped data.

The end-to-end check (build the wheel, install it without -e into a fresh venv, run `shopsim eval` from an empty
folder) is `.ci/wheel-check`, run by `.ci/run`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import setuptools

import shopsim
from shopsim import paths

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_listed_packages_are_every_package_on_disk_plus_the_mapped_data():
    """pyproject lists its packages (discovery cannot add `shopsim._data`); a new subpackage must be listed too, or
    the wheel would ship without it."""
    cfg = PYPROJECT["tool"]["setuptools"]
    on_disk = setuptools.find_packages(where=str(ROOT), include=["shopsim*", "agents*", "baselines*"])
    assert sorted(cfg["packages"]) == sorted([*on_disk, "shopsim._data"])
    mapped = ROOT / cfg["package-dir"]["shopsim._data"]
    assert mapped == ROOT / "data" and (mapped / "taxonomy.json").is_file()
    assert (ROOT / "shopsim" / "py.typed").is_file()


def test_version_has_one_source():
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "shopsim.__version__"}
    assert isinstance(shopsim.__version__, str) and shopsim.__version__


def test_data_dir_prefers_the_override_then_the_wheel_resource_then_the_checkout(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "shopsim"
    package.mkdir(parents=True)
    monkeypatch.setattr(paths, "resources", SimpleNamespace(files=lambda name: package))
    monkeypatch.delenv("SHOPSIM_DATA_DIR", raising=False)

    # A source checkout: no shopsim/_data, so the repository's data/.
    assert paths.packaged_data_dir() is None
    assert paths.data_dir() == ROOT / "data"

    # An installed wheel: shopsim/_data.
    (package / paths.PACKAGE_DATA).mkdir()
    assert paths.data_dir() == paths.packaged_data_dir() == package / "_data"

    # The environment variable wins over both; an empty value is no override.
    monkeypatch.setenv("SHOPSIM_DATA_DIR", str(tmp_path / "mine"))
    assert paths.data_dir() == tmp_path / "mine"
    monkeypatch.setenv("SHOPSIM_DATA_DIR", "")
    assert paths.data_dir() == package / "_data"


def test_the_data_folder_resolves_to_the_shipped_files(monkeypatch):
    monkeypatch.delenv("SHOPSIM_DATA_DIR", raising=False)
    assert (paths.data_dir() / "splits" / "Replenishment-v0.json").is_file()
