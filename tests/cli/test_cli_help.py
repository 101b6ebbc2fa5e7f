"""``--help`` of the CLI and of every subcommand is plain text: no reST markup reaches the terminal."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contrastkit.cli import COMMANDS, main

SRC = str(Path(__file__).resolve().parents[2] / "src")
# ``literal``, `interpreted`, :func:`role` / :class:... and the internal document's name
MARKUP = re.compile(r"``|`[^`\s][^`]*`|:[a-z]+:`|\bSPEC\b")


def help_text(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in COMMANDS], ids=lambda a: " ".join(a))
def test_help_has_no_rest_markup(capsys, argv):
    text = help_text(capsys, argv)
    assert "usage: contrastkit" in text
    found = MARKUP.findall(text)
    assert not found, f"reST markup in `contrastkit {' '.join(argv)}`: {found}"


def test_markup_pattern_catches_what_the_help_used_to_print():
    for bad in ("The ``contrastkit`` command line.", "see `contrastkit report`", "use :func:`pretrain`", "SPEC §2"):
        assert MARKUP.search(bad), bad
    assert not MARKUP.search("see: contrastkit report --help (default 0.5; 'quoted')")


def test_top_level_help_in_a_subprocess():
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "contrastkit", "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "contrastkit" in done.stdout and not MARKUP.findall(done.stdout)
    assert all(name in done.stdout for name in COMMANDS)
