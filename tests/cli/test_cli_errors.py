"""How a failing command reads: a mistake of the user's is one line and exit status 2; a bug
(any other exception, or a TypeError that Python or another library raised) keeps its
traceback; ``--traceback`` / ``CONTRASTKIT_TRACEBACK=1`` show the traceback of every error."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _tiny_run import one_error_line
import contrastkit.commands.explain as explain_command
from contrastkit.cli import main
from contrastkit.commands.errors import is_user_error, raised_by_contrastkit
from contrastkit.commands.explain_output import fmt

SRC = str(Path(__file__).resolve().parents[2] / "src")


def explain_sigmoid_with_a_text_bias(args):
    from contrastkit.analysis import explain_sigmoid

    return explain_sigmoid([1.0, 0.0], temperature=0.5, bias="high")  # contrastkit: "bias must be a number"


def a_python_type_error_inside_contrastkit(args):
    return fmt(None)  # float(None) inside contrastkit's fmt: Python's TypeError, a bug


def a_key_error(args):
    return {}["missing"]


def test_user_errors_are_one_line(capsys, monkeypatch):
    assert one_error_line(capsys, ["explain", "1", "abc"]) == \
        "contrastkit explain: error: similarity 'abc' is not a number"
    # A TypeError that contrastkit's own validation raises is the user's too.
    monkeypatch.setattr(explain_command, "run", explain_sigmoid_with_a_text_bias)
    line = one_error_line(capsys, ["explain"])
    assert line.startswith("contrastkit explain: error: ") and "bias must be a number" in line


@pytest.mark.parametrize("bug, error", [(a_python_type_error_inside_contrastkit, TypeError),
                                        (a_key_error, KeyError)])
def test_a_bug_keeps_its_exception_and_traceback(capsys, monkeypatch, bug, error):
    monkeypatch.setattr(explain_command, "run", bug)
    with pytest.raises(error) as raised:
        main(["explain"])
    assert raised.value.__traceback__ is not None
    assert capsys.readouterr().err == ""  # not turned into a one-line "error:"


def test_who_raised_a_type_error():
    with pytest.raises(TypeError) as python_raised:
        fmt(None)
    assert not raised_by_contrastkit(python_raised.value) and not is_user_error(python_raised.value)
    with pytest.raises(TypeError) as library_raised:
        import numpy
        numpy.zeros("three")
    assert not is_user_error(library_raised.value)
    with pytest.raises(TypeError) as contrastkit_raised:
        explain_sigmoid_with_a_text_bias(None)
    assert raised_by_contrastkit(contrastkit_raised.value) and is_user_error(contrastkit_raised.value)
    assert is_user_error(ValueError("bad")) and is_user_error(FileNotFoundError("gone"))
    assert not is_user_error(KeyError("k")) and not is_user_error(TypeError("never raised: no traceback"))


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_traceback_on_request(capsys, monkeypatch, how):
    argv = ["explain", "1", "abc"]
    if how == "flag":
        argv = ["--traceback"] + argv
    else:
        monkeypatch.setenv("CONTRASTKIT_TRACEBACK", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last)") and "ValueError: similarity 'abc'" in err
    assert err.strip().splitlines()[-1] == "contrastkit explain: error: similarity 'abc' is not a number"


def test_traceback_flag_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--traceback" in out and "CONTRASTKIT_TRACEBACK=1" in out


def test_a_bug_prints_its_traceback_in_a_subprocess():
    script = ("import sys, contrastkit.commands.explain as c; from contrastkit.cli import main; "
              "c.run = lambda args: None[0]; sys.exit(main(['explain']))")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CONTRASTKIT_TRACEBACK", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "TypeError: 'NoneType' object is not subscriptable" \
        in done.stderr and "error:" not in done.stderr


def test_an_output_on_a_read_only_file_system_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """EROFS (an --out on a read-only mount) is the user's to fix, as a full disk is: one line
    naming the path, exit status 2, whichever write meets it first (here the run folder's lock)."""
    import errno

    from contrastkit.train import faults

    out = tmp_path / "mounted-read-only" / "run"

    def read_only(folder):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder))

    monkeypatch.setattr(faults.RunLock, "acquire", classmethod(lambda cls, folder: read_only(folder)))
    line = one_error_line(capsys, ["pretrain", "--data", "glyphlab", "--epochs", "1", "--out", str(out)])
    assert line == f"contrastkit pretrain: error: [Errno {errno.EROFS}] {os.strerror(errno.EROFS)}: '{out}'"
