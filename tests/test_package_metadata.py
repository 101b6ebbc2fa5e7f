"""Packaging facts that users and tools rely on: types, licence, extras, the test command."""

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


def test_the_package_ships_py_typed():
    assert (ROOT / "src" / "contrastkit" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["contrastkit"]


def test_the_license_file_matches_the_metadata():
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) the contrastkit authors" in text
    assert not any(c.startswith("License ::") for c in PROJECT.get("classifiers", [])), \
        "a license classifier next to an SPDX license expression is rejected by PEP 639"


def test_every_extra_is_in_the_readme_dependency_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Dependencies and why"):]
    table = table[:table.index("\n## ", 1)]
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for requirement in requirements:
            package = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
            row = next((line for line in table.splitlines()
                        if line.startswith("|") and package in line.split("|")[1]), None)
            assert row is not None, f"{package} ([{extra}]) has no row in the README's dependency table"
            assert f"`{extra}`" in row, f"the README's row for {package} does not name the extra [{extra}]"


def test_the_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = re.search(r"^python3 -m venv .* -m pytest .*$", ci, re.M).group(0)
    assert f"```bash\n{command}\n```" in readme
    assert '".[all,test,browser,docs]"' in command
    # In parallel (pytest-xdist, in the test extra), in the work units of tests/conftest.py.
    assert command.endswith("-m pytest -q -n auto")
