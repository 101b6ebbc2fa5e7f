"""A two-rank ``contrastkit pretrain`` under torchrun (gloo, CPU) that survives a cluster:
preemption signals, a rank that dies, two nodes. Each run ends with the summary and the step
records of one uninterrupted two-rank run (the module's reference, one agent with two ranks).

The faults are armed in the ranks by ``tests/cluster_workers.py``; the two-node run is the
SLURM script of docs/distributed.md, run with stand-ins for ``srun`` (the command once per
node, here twice on this machine) and ``scontrol`` (the nodes are 127.0.0.1), so the commands
the documentation gives are the ones tested. Each launch starts fresh interpreters (about a
minute per launch on a busy 2-core machine; eight launches).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import contrastkit
from contrastkit.train.checkpoint import load_checkpoint

from _ports import unused_port

ROOT = Path(__file__).resolve().parents[2]
WORKERS = str(ROOT / "tests" / "cluster_workers.py")
DOC = ROOT / "docs" / "distributed.md"
TIMINGS = {"seconds", "train_seconds", "eval_seconds", "images_per_second"}
# 16 images, a global batch of 4 (2 per rank): 4 steps an epoch, 2 epochs; a checkpoint every 3 steps.
CONFIG = """\
data: glyphlab
data_options: {train_scenes: 16, val_scenes: 9, test_scenes: 12, size: 28}
epochs: 2
batch_size: 4
checkpoint_every: 3
device: cpu
threads: 1
log_every: 1
"""
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")


def _env(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    src = os.path.dirname(os.path.dirname(os.path.abspath(contrastkit.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # torchrun
    return env


def _torchrun(config: Path, out: Path, *options: str, fault: dict | None = None,
              resume: bool = False) -> subprocess.CompletedProcess:
    """One agent with two ranks running tests/cluster_workers.py (contrastkit's command line):
    the run of ``config`` in ``out``, or with ``resume`` its continuation."""
    run = ["--resume"] if resume else ["--config", str(config)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--signals-to-handle", SIGNALS, *options, WORKERS, "pretrain", *run, "--out", str(out)]
    env = _env(CONTRASTKIT_TEST_FAULT=json.dumps(fault) if fault else "")
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def _summary(out: Path) -> dict:
    return {key: value for key, value in json.loads((out / "summary.json").read_text()).items()
            if key not in TIMINGS}


def _steps(out: Path) -> list:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["kind"], r["epoch"], r["step"], r["loss"]) for r in records if r["kind"] in ("step", "epoch")]


def _stops(result: subprocess.CompletedProcess) -> dict:
    """rank -> (signal, step) of each rank's line saying it stopped; a rank that stopped on the
    other rank's word before its own copy of the signal arrived says so (``None`` here)."""
    found = re.findall(r"rank (\d+): stopped by (\w+|a signal another rank received) after step (\d+)", result.stderr)
    return {int(rank): (None if " " in name else name, int(step)) for rank, name, step in found}


def _one_stop(stops: dict, log: str) -> tuple:
    """The signal and step every rank stopped at (each rank's line, one step; at least one rank
    names the signal)."""
    assert set(stops) == {0, 1}, (stops, log)
    assert len({step for _, step in stops.values()}) == 1, (stops, log)
    names = {name for name, _ in stops.values()} - {None}
    assert len(names) == 1, (stops, log)
    return names.pop(), stops[0][1]


def _log(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-2000:] + result.stderr[-6000:]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "run.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def reference(config) -> Path:
    """One agent, two ranks, nothing goes wrong."""
    out = config.parent / "reference"
    result = _torchrun(config, out)
    assert result.returncode == 0, _log(result)
    return out


def test_preemption_signals_stop_every_rank_at_one_step_and_resume_gives_the_uninterrupted_run(config, reference):
    out = config.parent / "preempted"
    # SIGTERM to the agent (as a scheduler sends it) during rank 0's second step.
    first = _torchrun(config, out, fault={"rank": 0, "backward": 2, "action": "SIGTERM"})
    assert first.returncode != 0, _log(first)  # torchrun reports the signal it received
    name, step = _one_stop(_stops(first), _log(first))  # both ranks, one step
    state = load_checkpoint(str(out / "checkpoints" / "last.pt"))
    assert name == "SIGTERM" and 2 <= step < 4 and (state["step"], state["epoch"], state["epoch_step"]) == (step, 0, step)
    assert "exit status 75" in first.stderr

    # SIGUSR1 to the agent during rank 1's step 4, the last of epoch 1 (it reaches the ranks
    # during that step or the next one: either way they stop together, checkpointed).
    second = _torchrun(config, out, fault={"rank": 1, "backward": 4 - step, "action": "SIGUSR1"}, resume=True)
    name, step = _one_stop(_stops(second), _log(second))
    state = load_checkpoint(str(out / "checkpoints" / "last.pt"))
    assert name == "SIGUSR1" and step in (4, 5) and state["step"] == step and state["world_size"] == 2

    last = _torchrun(config, out, resume=True)
    assert last.returncode == 0, _log(last)
    assert _summary(out) == _summary(reference)
    assert _steps(out) == _steps(reference)  # every step once, with the uninterrupted losses
    assert not (out / "contrastkit.lock").exists()


def test_a_stream_preempted_under_torchrun_resumes_to_the_uninterrupted_run(tmp_path):
    """Tar shards (a stream: each rank reads its own shards, one DataLoader worker each):
    SIGTERM to the agent in the middle of epoch 2, then ``--resume``, give the summary, step
    records and weights of the uninterrupted two-rank run."""
    from _shards import write_shards

    shards = write_shards(tmp_path, per_shard=6, per_class=12)
    config = tmp_path / "stream.yaml"
    config.write_text(f"data: {shards}\ndata_options: {{size: 16}}\nepochs: 2\nbatch_size: 4\nworkers: 1\n"
                      "device: cpu\nthreads: 1\nlog_every: 1\n")
    reference, out = tmp_path / "reference", tmp_path / "preempted"
    straight = _torchrun(config, reference)
    assert straight.returncode == 0, _log(straight)
    per_epoch = json.loads((reference / "config.json").read_text())["derived"]["steps_per_epoch"]
    assert per_epoch >= 3
    first = _torchrun(config, out, fault={"rank": 0, "backward": per_epoch + 2, "action": "SIGTERM"})
    name, step = _one_stop(_stops(first), _log(first))
    assert name == "SIGTERM" and per_epoch < step < 2 * per_epoch  # in the middle of epoch 2
    last = _torchrun(config, out, resume=True)
    assert last.returncode == 0, _log(last)
    assert _summary(out) == _summary(reference)
    assert _steps(out) == _steps(reference)
    ours, theirs = (load_checkpoint(str(folder / "checkpoints" / "last.pt"))["model"] for folder in (out, reference))
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_a_rank_that_dies_restarts_the_group_which_resumes_without_a_flag(config, reference):
    out = config.parent / "rank-died"
    # Rank 1 is killed during step 5 (epoch 2) of the first start; the last checkpoint is step 4's.
    result = _torchrun(config, out, "--max-restarts", "1",
                       fault={"rank": 1, "attempt": 0, "backward": 5, "action": "SIGKILL"})
    assert result.returncode == 0, _log(result)
    assert Path(f"{out}.died-rank1-attempt0").exists()  # the rank did die (killed itself there)...
    assert f"torchrun restarted the group: resuming from {out / 'checkpoints' / 'last.pt'} (step 4)" \
        in result.stderr  # ...and the restarted group resumed on its own
    assert _summary(out) == _summary(reference)
    assert _steps(out) == _steps(reference)


def test_a_rank_that_dies_before_the_first_checkpoint_restarts_the_group_which_starts_the_run_over(config, reference):
    out = config.parent / "died-setting-up"
    # Rank 1 dies as the run starts its first checkpoint (before the first step): rank 0 has
    # started the folder (its manifest, config.json...), no checkpoint exists. A file of the
    # user's lands in the folder meanwhile.
    result = _torchrun(config, out, "--max-restarts", "1",
                       fault={"rank": 1, "attempt": 0, "checkpoint": 1, "action": "SIGKILL", "leave": "notes.txt"})
    assert result.returncode == 0, _log(result)
    assert Path(f"{out}.died-rank1-attempt0").exists()  # the rank did die (killed itself there)...
    assert f"torchrun restarted the group before the run's first checkpoint: starting the run over in {out}" \
        in result.stderr  # ...and the restarted group took the folder as its own start
    assert _summary(out) == _summary(reference)
    assert _steps(out) == _steps(reference)
    assert (out / "notes.txt").read_text() == "mine\n"  # not contrastkit's: kept


def _doc_blocks() -> list:
    return re.findall(r"```bash\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _one_line(command: str) -> str:
    return re.sub(r"\s*\\\n\s*", " ", command).strip()


def _stand_in(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _slurm_job(config: Path, out: Path, job_id: str, **extra: str) -> subprocess.CompletedProcess:
    """The documented SLURM script as SLURM would run it on a 2-node allocation (``extra``: more
    of SLURM's variables), with stand-ins for ``srun`` and ``scontrol``."""
    blocks = _doc_blocks()
    per_node = [block for block in blocks if block.startswith("torchrun --nnodes 2")]
    script = [block for block in blocks if "#SBATCH" in block]
    assert len(per_node) == 1 and len(script) == 1
    # The SLURM script runs the documented per-node command on each node.
    assert "srun " + _one_line(per_node[0]) in _one_line(script[0])

    bin_dir = config.parent / "slurm-bin"
    if not bin_dir.is_dir():
        bin_dir.mkdir()
        # srun on a 2-node allocation: the command once per node (here both on this machine).
        _stand_in(bin_dir, "srun", 'pids=()\nfor node in 0 1; do SLURM_NODEID=$node SLURM_PROCID=$node "$@" & '
                                   'pids+=($!); done\n'
                                   'status=0\nfor pid in "${pids[@]}"; do wait "$pid" || status=$?; done\nexit $status\n')
        # `show hostnames`: the two nodes, the second written after a pause, so that a reader that
        # stops at the first name (and the SIGPIPE scontrol then gets) is always seen.
        _stand_in(bin_dir, "scontrol", 'echo 127.0.0.1\nsleep 0.5\necho 127.0.0.1\n')
    env = _env(CONFIG=str(config), OUT=str(out), MASTER_PORT=str(unused_port()), SLURM_JOB_ID=job_id,
               SLURM_JOB_NODELIST="node[1-2]", SLURM_GPUS_ON_NODE="1", **extra)
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    job = config.parent / "job.sbatch"
    job.write_text(script[0])
    return subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=str(config.parent))


def test_two_nodes_from_the_documented_slurm_script_train_as_one_node(config, reference):
    out = config.parent / "two-nodes"
    result = _slurm_job(config, out, uuid.uuid4().hex[:12])
    assert result.returncode == 0, _log(result)
    with open(out / "config.json", encoding="utf-8") as handle:
        assert json.load(handle)["derived"]["world_size"] == 2  # one rank on each of the two agents
    assert _summary(out) == _summary(reference)
    assert _steps(out) == _steps(reference)


class _Died(BaseException):
    """Every rank of the job dies (a lost node): nothing in the run catches it."""


def test_a_requeued_slurm_job_whose_ranks_died_before_the_first_checkpoint_starts_the_run_over(
        config, reference, monkeypatch):
    from contrastkit.cli import main
    from contrastkit.train import loop

    out, job_id = config.parent / "requeued", uuid.uuid4().hex[:12]
    # The job's first allocation (torchrun's launch: the script's --rdzv-id, the job id) dies
    # as the run starts its first checkpoint, before the first step: rank 0 had started the
    # folder (its manifest, config.json...), no checkpoint exists. A file of the user's lands
    # in the folder meanwhile. (Here in this process: the folder is what that start leaves.)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", job_id)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")

    def die(*args, **kwargs):
        (out / "notes.txt").write_text("mine\n")
        raise _Died

    monkeypatch.setattr(loop, "_write_checkpoint", die)
    with pytest.raises(_Died):
        main(["pretrain", "--config", str(config), "--out", str(out), "--quiet"])
    assert not (out / "checkpoints" / "last.pt").exists() and (out / "config.json").is_file()
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"):
        monkeypatch.delenv(name)

    # SLURM requeues the job (the same job id, SLURM_RESTART_COUNT 1): the script passes
    # --resume, and the run, finding no checkpoint in the folder its own launch started,
    # starts over there instead of stopping with "nothing to resume".
    result = _slurm_job(config, out, job_id, SLURM_RESTART_COUNT="1")
    assert result.returncode == 0, _log(result)
    assert f"--resume: {out} holds no checkpoint; this launch ({job_id}) started it and stopped before the run's " \
           "first checkpoint: starting the run over in it" in result.stderr
    assert _summary(out) == _summary(reference)
    assert _steps(out) == _steps(reference)
    assert (out / "notes.txt").read_text() == "mine\n"  # not contrastkit's: kept
