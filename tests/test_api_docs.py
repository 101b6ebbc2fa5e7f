"""The API reference (docs/api) builds from the docstrings without a single warning.

A docstring that breaks reST, a cross-reference to a contrastkit name that does not exist, or a
name in a package's ``__all__`` that the reference leaves out fails the build (``-W``).
"""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
PACKAGES = ("losses", "analysis", "data", "models", "methods", "train", "metrics", "distributed",
            "temperature", "temperature_methods", "report", "manifest", "records")


def _build(source: Path, out: Path, conf: Path = API) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", "-E",
         "-c", str(conf), str(source), str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_api_reference_builds_without_warnings(tmp_path):
    result = _build(API, tmp_path)
    assert result.returncode == 0 and not result.stderr.strip(), \
        f"the API reference has warnings (sphinx exit {result.returncode}):\n{result.stderr}"
    for package in PACKAGES:
        page = (tmp_path / f"{package}.html").read_text(encoding="utf-8")
        module = importlib.import_module(f"contrastkit.{package}")
        missing = [name for name in module.__all__
                   if f'id="contrastkit.{package}.{name}"' not in page]
        assert not missing, f"{package}.html does not document {missing}"


@pytest.fixture(scope="module")
def broken_build(tmp_path_factory):
    """A page built with the real configuration that holds one good internal-path reference
    (redirected to the public name), one foreign reference (quiet), two broken references and
    a package with one of its public names left out."""
    tmp_path = tmp_path_factory.mktemp("broken")
    source = tmp_path / "src"
    source.mkdir()
    (source / "index.rst").write_text(
        "Analysis\n========\n\n.. automodule:: contrastkit.analysis\n   :exclude-members: sweep\n\n"
        "See :func:`contrastkit.analysis.explanation.explain`, :class:`torch.Tensor`, "
        ":func:`contrastkit.analysis.no_such_function` and :class:`NoSuchClass`.\n",
        encoding="utf-8")
    result = _build(source, tmp_path / "out")
    return result, (tmp_path / "out" / "index.html").read_text(encoding="utf-8")


def test_broken_references_fail_the_build_and_foreign_ones_do_not(broken_build):
    result, page = broken_build
    assert result.returncode != 0
    references = [line for line in result.stderr.splitlines()
                  if "index.rst" in line and "reference target not found" in line]
    assert len(references) == 2, result.stderr
    assert "contrastkit.analysis.no_such_function" in result.stderr
    assert "NoSuchClass" in result.stderr
    assert "torch.Tensor" not in result.stderr and "explanation.explain" not in result.stderr
    assert re.search(r'href="#contrastkit\.analysis\.explain"[^>]*><code[^>]*>'
                     r'<span class="pre">contrastkit\.analysis\.explanation\.explain', page)


def test_a_public_name_missing_from_the_reference_fails_the_build(broken_build):
    result, _ = broken_build
    assert result.returncode != 0
    assert "contrastkit.analysis.sweep is in contrastkit.analysis.__all__" in result.stderr, \
        result.stderr
