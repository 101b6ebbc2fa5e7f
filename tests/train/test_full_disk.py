"""A disk that fills up at any point of a ``contrastkit pretrain`` run: one clear line naming
the file it was writing (and the step, for a checkpoint), exit status 2, nothing half-written
left in the run folder (no ``*.tmp``), and the run finishes after space is freed.

The disk is simulated in the child that runs the command: every file opened for writing under
the run folder shares a budget of bytes; the write that crosses it writes what fits and raises
``OSError(ENOSPC)`` as the kernel's would (with no file name), and so does every write after
it (a full disk stays full). The budgets are taken from a whole run's
writes, so that the disk fills half-way through a chosen file: the run's config (before the
first step), a checkpoint in the middle of training, and the summary and the report (after
training).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from _bounded import SRC, TESTS
from _tiny_run import TINY_GLYPHLAB

HARNESS = textwrap.dedent('''
    import json, os, sys
    import _disk
    out, budget, argv = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    state, _ = _disk.install(out, "full", budget)

    from contrastkit.cli import main
    err = os.path.join(os.path.dirname(os.path.realpath(out)), "stderr.txt")
    saved, target = os.dup(2), os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, 2)
    try:
        code = main(argv)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
    with open(err) as handle:
        lines = [line for line in handle.read().splitlines() if line.startswith(("contrastkit", "warning: no report"))]
    print(json.dumps({"rc": code, "lines": lines, "written": state["written"], "opened": state["opened"]}))
''')

OPTIONS = ["--data", "glyphlab", *[f"--data-option={key}={value}" for key, value in TINY_GLYPHLAB.items()],
           "--epochs", "2", "--batch-size", "4", "--checkpoint-every", "3", "--device", "cpu", "--threads", "1",
           "--log-every", "1", "--quiet", "--json", "--no-baselines"]


def _run(out, budget, argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, TESTS]), OMP_NUM_THREADS="1")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-c", HARNESS, str(out), str(budget), json.dumps(argv)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _leftovers(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder)
                  for f in files if f.endswith(".tmp"))


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX paths")
def test_a_disk_that_fills_up_anywhere_leaves_one_line_no_partial_file_and_a_run_that_finishes(tmp_path):
    whole = _run(tmp_path / "unlimited" / "run", -1, ["pretrain", *OPTIONS, "--out",
                                                      str(tmp_path / "unlimited" / "run")])
    assert whole["rc"] == 0, whole
    checkpoints = [event for event in whole["opened"] if event[0] == "checkpoints/last.pt.tmp"]
    assert len(checkpoints) == 4  # steps 3, 4, 6, 8 (every 3 steps, and each epoch's end)

    def first(name):
        return next(event for event in whole["opened"] if os.path.basename(event[0]).startswith(name))

    points = {"config.json": first("config."), "the step-6 checkpoint": checkpoints[2],
              "summary.json": first("summary.json"), "report.html": first(".report.html")}
    for number, (name, event) in enumerate(points.items()):
        out = tmp_path / f"full-{number}" / "run"
        failed = _run(out, event[1] + event[2] // 2, ["pretrain", *OPTIONS, "--out", str(out)])
        assert len(failed["lines"]) == 1, (name, failed)
        line = failed["lines"][0]
        assert "No space left on device" in line and str(out) in line, (name, line)
        assert "Errno" not in line and "Traceback" not in line, (name, line)
        assert _leftovers(out) == [], (name, line)
        if name == "report.html":
            # The report never fails a run whose results are on disk: a warning naming it, and
            # `contrastkit report` writes it once space is freed.
            assert failed["rc"] == 0 and line.startswith("warning: no report written"), (name, line)
            assert _run(out, -1, ["report", str(out)])["rc"] == 0 and (out / "report.html").is_file()
            continue
        assert failed["rc"] == 2, (name, failed)
        assert "at step" in line or "before training started" in line, (name, line)
        assert "free some space" in line, (name, line)
        # Space freed: --resume continues from the last checkpoint (or, where none was written,
        # --force starts the run over in the folder contrastkit made).
        again = ["pretrain", "--out", str(out), "--resume", "--quiet", "--json"] \
            if (out / "checkpoints" / "last.pt").exists() else ["pretrain", *OPTIONS, "--out", str(out), "--force"]
        finished = _run(out, -1, again)
        assert finished["rc"] == 0, (name, line, finished)
        assert json.loads((out / "summary.json").read_text())["steps"] == 8, name
        assert _leftovers(out) == [], name
