"""kill -9 at several points of a `contrastkit pretrain` run, then `--resume`: the run ends with
the same summary numbers as an uninterrupted one.

One helper process imports contrastkit once and forks a child per attempt; each child arms one
kill point, runs the CLI and is killed there with SIGKILL (no cleanup of any kind runs). The
kill points: during a training step (in ``backward``), half-way through writing a checkpoint
(``torch.save`` has written half the file), between the renames that put a checkpoint in place
(after the third and after the fourth ``os.replace`` into ``checkpoints/``), during the final
evaluation (the read-out's first linear probe) and while writing the report (before
``report.html`` is renamed into place). After each kill, ``last.pt`` must load as it is.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from _bounded import SRC

TIMING_KEYS = {"seconds", "train_seconds", "eval_seconds", "images_per_second"}

HARNESS = textwrap.dedent('''
    import io, json, os, signal, sys
    import torch
    import contrastkit.report
    from contrastkit.cli import main
    from contrastkit.train.checkpoint import load_checkpoint

    reference, out, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    first = ["pretrain", "--data", "glyphlab", "--epochs", "3", "--batch-size", "8", "--device", "cpu",
             "--threads", "1", "--quiet", "--json", "--log-every", "1"]
    for option in ("train_scenes=16", "val_scenes=9", "test_scenes=12", "size=28"):
        first += ["--data-option", option]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def arm(kind, n):
        if kind == "backward":
            real, calls = torch.Tensor.backward, [0]
            def backward(self, *args, **kwargs):
                calls[0] += 1
                if calls[0] == n:
                    die()
                return real(self, *args, **kwargs)
            torch.Tensor.backward = backward
        elif kind == "torch.save":
            real_save = torch.save
            def save(obj, handle, *args, **kwargs):
                buffer = io.BytesIO()
                real_save(obj, buffer, *args, **kwargs)
                data = buffer.getvalue()
                handle.write(data[:len(data) // 2])
                handle.flush()
                os.fsync(handle.fileno())
                die()
            torch.save = save
        elif kind == "replace":
            real_replace, calls = os.replace, [0]
            def replace(src, dst):
                real_replace(src, dst)
                if os.sep + "checkpoints" + os.sep in str(dst):
                    calls[0] += 1
                    if calls[0] == n:
                        die()
            os.replace = replace
        elif kind == "probe":
            import contrastkit.metrics.readout as readout
            def probe(*args, **kwargs):  # the read-out's first linear probe
                die()
            readout.linear_probe = probe
        elif kind == "report":
            real_replace = os.replace
            def replace(src, dst):
                if str(dst).endswith("report.html"):
                    die()
                real_replace(src, dst)
            os.replace = replace

    def attempt(argv, kind=None, n=0):
        pid = os.fork()
        if pid == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            if kind:
                arm(kind, n)
            code = main(argv)
            os._exit(100 + code)  # reached the end: not killed
        _, status = os.waitpid(pid, 0)
        return "killed" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL \\
            else os.WEXITSTATUS(status) - 100

    results = [{"point": "reference", "outcome": attempt(first + ["--out", reference])}]
    for index, (kind, n) in enumerate(plan + [[None, 0]]):
        argv = first + ["--out", out] if index == 0 else ["pretrain", "--out", out, "--resume", "--quiet", "--json"]
        outcome = attempt(argv, kind, n)
        last = os.path.join(out, "checkpoints", "last.pt")
        epoch = load_checkpoint(last)["epoch"] if os.path.exists(last) else None
        results.append({"point": f"{kind} {n}", "outcome": outcome, "epoch": epoch,
                        "files": sorted(os.listdir(os.path.join(out, "checkpoints")))})
    print(json.dumps(results))
''')

# (kill point, which call) and the epoch of last.pt after the kill
PLAN = [
    (("backward", 3), 1),      # epoch 2, first step
    (("torch.save", 1), 1),    # the epoch-2 checkpoint half written
    (("replace", 3), 1),       # epoch-2 write: previous.pt in place, both digests listed for last.pt
    (("replace", 4), 2),       # epoch-2 write: the new last.pt in place, its digest not yet alone
    (("probe", 1), 3),         # the final evaluation
    (("report", 1), 3),        # writing report.html
]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kill_9_at_each_point_then_resume_gives_the_uninterrupted_summary(tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", HARNESS, str(reference), str(out),
                           json.dumps([list(point) for point, _ in PLAN])],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results[0]["outcome"] == 0
    for result, (point, epoch) in zip(results[1:], PLAN):
        assert result["outcome"] == "killed", result  # each kill point was reached
        assert result["epoch"] == epoch, result
    assert "last.pt.tmp" in results[2]["files"]  # the half-written file was left behind...
    assert results[-1]["outcome"] == 0 and results[-1]["epoch"] == 3
    assert "last.pt.tmp" not in results[-1]["files"]  # ...and replaced by a complete one

    expected = json.loads((reference / "summary.json").read_text())
    resumed = json.loads((out / "summary.json").read_text())
    assert set(expected) == set(resumed)
    for key in set(expected) - TIMING_KEYS:
        assert resumed[key] == expected[key], key

    def epoch_losses(folder):
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        return [(r["epoch"], r["loss"]) for r in records if r["kind"] == "epoch"]

    assert epoch_losses(out) == epoch_losses(reference)
    assert (out / "report.html").is_file()
