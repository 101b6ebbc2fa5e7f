"""Faults injected into a single-process ``contrastkit pretrain`` run, each followed by
``--resume``: the run ends with the summary, the step records and the epoch losses of an
uninterrupted one.

One helper process imports contrastkit once and forks a child per attempt (as the kill -9 test
does); each child arms one fault, runs the command line and reports its exit status and its
error line. The run: 16 images in batches of 4 (4 steps an epoch), 2 epochs, a checkpoint
every 3 steps. The faults, in order, on one output folder:

1. SIGTERM during the backward pass of step 2 (mid-epoch): the step finishes, the checkpoint
   holds step 2 (2 batches into epoch 1), exit status 75.
2. SIGUSR1 while the step-3 checkpoint (``--checkpoint-every 3``) is being written: the write
   completes and the run stops there (step 3), status 75.
3. A full disk (``ENOSPC`` half-way through ``torch.save``) while writing the epoch-1 checkpoint
   at step 4: status 2 and one error line naming the intact step-3 checkpoint; no partial file.
4. A second run on the folder while a first one holds it: refused (status 2, naming the
   holder's process id); the holder is then killed with SIGKILL, leaving a stale lock.
5. SIGTERM during step 4, the last of epoch 1 (the resume takes over the stale lock): the
   epoch's own checkpoint holds it, status 75.
6. SIGTERM during the final evaluation (the read-out's first linear probe): status 75 at
   once, the checkpoint of step 8 complete.
7. A last ``--resume`` with no fault: status 0.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from _bounded import SRC
from _tiny_run import TIMINGS, TINY_GLYPHLAB

HARNESS = textwrap.dedent('''
    import errno, io, json, os, signal, sys, time
    import torch
    from contrastkit.cli import main
    from contrastkit.train.checkpoint import load_checkpoint

    reference, out, plan, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    first = ["pretrain", *options]

    def send(name):
        os.kill(os.getpid(), getattr(signal, name))

    def arm(kind, n, action, ready):
        if kind == "backward":
            real, calls = torch.Tensor.backward, [0]
            def backward(self, *args, **kwargs):
                calls[0] += 1
                if calls[0] == n:
                    if action == "hold":  # hold the folder's lock until the parent kills us
                        os.write(ready, b"x")
                        while True:
                            time.sleep(1)
                    send(action)  # arrives while the step is being computed
                return real(self, *args, **kwargs)
            torch.Tensor.backward = backward
        elif kind == "torch.save":
            real_save, calls = torch.save, [0]
            def save(obj, handle, *args, **kwargs):
                if "checkpoints" not in str(getattr(handle, "name", handle)):
                    return real_save(obj, handle, *args, **kwargs)
                calls[0] += 1
                if calls[0] != n:
                    return real_save(obj, handle, *args, **kwargs)
                if action == "ENOSPC":  # the disk fills up half-way through the file
                    buffer = io.BytesIO()
                    real_save(obj, buffer, *args, **kwargs)
                    handle.write(buffer.getvalue()[:len(buffer.getvalue()) // 2])
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                send(action)  # arrives while the checkpoint is being written
                return real_save(obj, handle, *args, **kwargs)
            torch.save = save
        elif kind == "probe":
            import contrastkit.metrics.readout as readout
            real_probe = readout.linear_probe
            def probe(*args, **kwargs):  # the read-out's first linear probe
                send(action)
                return real_probe(*args, **kwargs)
            readout.linear_probe = probe

    def start(argv, fault=None, ready=None):
        err = os.path.join(os.path.dirname(out), f"stderr-{time.monotonic_ns()}")
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT), 2)
            if fault:
                arm(*fault, ready)
            code = main(argv)
            os._exit(100 + code)  # reached the end: not killed
        return pid, err

    def finish(pid, err):
        _, status = os.waitpid(pid, 0)
        outcome = "killed" if os.WIFSIGNALED(status) else os.WEXITSTATUS(status) - 100
        with open(err) as handle:
            lines = [line for line in handle.read().splitlines() if line.startswith("contrastkit")]
        return outcome, lines

    def state(folder):
        last = os.path.join(folder, "checkpoints", "last.pt")
        if not os.path.exists(last):
            return None
        data = load_checkpoint(last)
        return {"step": data["step"], "epoch": data["epoch"], "epoch_step": data.get("epoch_step", 0),
                "files": sorted(os.listdir(os.path.dirname(last)))}

    outcome, _ = finish(*start(first + ["--out", reference]))
    results = [{"point": "reference", "outcome": outcome}]
    resume = ["pretrain", "--out", out, "--resume", "--quiet", "--json", "--no-report", "--no-baselines"]
    for index, fault in enumerate(plan + [None]):
        argv = first + ["--out", out] if index == 0 else resume
        if fault and fault[2] == "hold":
            ready, signal_ready = os.pipe()
            holder, holder_err = start(argv, fault, signal_ready)
            os.read(ready, 1)  # the holder is training: it holds the lock
            outcome, lines = finish(*start(resume))
            os.kill(holder, signal.SIGKILL)
            finish(holder, holder_err)
            results.append({"point": fault, "outcome": outcome, "lines": lines, "holder": holder,
                            "lock_left": os.path.exists(os.path.join(out, "contrastkit.lock")), **state(out)})
            continue
        outcome, lines = finish(*start(argv, fault))
        results.append({"point": fault, "outcome": outcome, "lines": lines, **(state(out) or {})})
    print(json.dumps(results))
''')

OPTIONS = ["--data", "glyphlab", *[f"--data-option={key}={value}" for key, value in TINY_GLYPHLAB.items()],
           "--epochs", "2", "--batch-size", "4", "--checkpoint-every", "3", "--device", "cpu", "--threads", "1",
           "--log-every", "1", "--quiet", "--json", "--no-report", "--no-baselines"]

# (fault, expected exit status, (step, epochs done, batches into the next epoch) of last.pt after it)
PLAN = [
    (["backward", 2, "SIGTERM"], 75, (2, 0, 2)),
    (["torch.save", 1, "SIGUSR1"], 75, (3, 0, 3)),
    (["torch.save", 1, "ENOSPC"], 2, (3, 0, 3)),
    (["backward", 1, "hold"], 2, (3, 0, 3)),
    (["backward", 1, "SIGTERM"], 75, (4, 1, 0)),
    (["probe", 1, "SIGTERM"], 75, (8, 2, 0)),
]


def _records(folder, kind):
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["step"], r["loss"]) for r in records if r["kind"] == kind]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_signals_full_disk_and_a_second_run_then_resume_give_the_uninterrupted_run(tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", HARNESS, str(reference), str(out),
                           json.dumps([fault for fault, _, _ in PLAN]), json.dumps(OPTIONS)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results[0]["outcome"] == 0
    for result, (fault, status, (step, epoch, epoch_step)) in zip(results[1:], PLAN):
        assert result["outcome"] == status, result
        assert (result["step"], result["epoch"], result["epoch_step"]) == (step, epoch, epoch_step), result
        assert "last.pt.tmp" not in result["files"], result  # nothing half-written is left
        assert len(result["lines"]) == 1, result  # one line says what happened
    stopped = [r["lines"][0] for r in results[1:] if r["outcome"] == 75]
    assert "stopped by SIGTERM after step 2" in stopped[0] and "--resume" in stopped[0]
    assert "stopped by SIGUSR1 after step 3" in stopped[1]
    assert "stopped by SIGTERM after step 4" in stopped[2] and "stopped by SIGTERM after step 8" in stopped[3]
    full = results[3]["lines"][0]
    assert "No space left on device" in full and "step 4" in full
    assert "previous checkpoint (step 3" in full and "free some space" in full
    refused = results[4]
    assert "in use by another run" in refused["lines"][0] and f"pid {refused['holder']}" in refused["lines"][0]
    assert refused["lock_left"]  # the killed holder's lock stays behind: stale, taken over by the next run
    final = results[-1]
    assert final["outcome"] == 0 and (final["step"], final["epoch"]) == (8, 2)
    assert not (out / "contrastkit.lock").exists()

    expected = json.loads((reference / "summary.json").read_text())
    resumed = json.loads((out / "summary.json").read_text())
    assert set(expected) == set(resumed)
    for key in set(expected) - set(TIMINGS):
        assert resumed[key] == expected[key], key
    assert _records(out, "step") == _records(reference, "step")  # every step once, the same losses
    assert _records(out, "epoch") == _records(reference, "epoch")
