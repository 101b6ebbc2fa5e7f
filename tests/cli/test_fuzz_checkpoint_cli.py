"""Fuzzing checkpoint loading and the CLI: a run's ``last.pt`` damaged (truncated, bit-flipped,
a header field overwritten, grown, over the input ceiling) is always refused while its
recorded SHA-256 stands; with the digest rewritten to match the damage (or removed) what
torch and the content checks see is fuzzed too. ``contrastkit probe`` on a damaged run and
``contrastkit explain --matrix`` on damaged matrices exit 0, or 2 after one error line, and
write nothing. Everything runs in a child limited to 1 GiB of memory above its start
(``_bounded.py``).
``CONTRASTKIT_FUZZ_EXAMPLES=500`` runs a deeper search than the default."""

import hashlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _bounded import assert_clean, damage, fuzz_settings, worker, write_damaged

FUZZ = fuzz_settings()
TINY = {"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, worker):
    out = tmp_path_factory.mktemp("fuzzed") / "run"
    config = dict(data="glyphlab", data_options=TINY, epochs=1, batch_size=8, out=str(out), device="cpu",
                  log_every=1, threads=1)
    assert worker.call("pretrain", config, timeout=300) == {"returned": 1, "warnings": []}  # also under the limit
    return out


def _copy(run):
    folder = Path(tempfile.mkdtemp(dir=run.parent)) / "run"
    shutil.copytree(run, folder)
    return folder


def _record_digest(path, mode):
    sidecar = Path(f"{path}.sha256")
    if mode == "removed":
        sidecar.unlink()
    elif mode == "matching":
        sidecar.write_text(f"{hashlib.sha256(Path(path).read_bytes()).hexdigest()}  last.pt\n")


def _damaged_checkpoints(run):
    data = (run / "checkpoints" / "last.pt").read_bytes()
    return st.tuples(damage(data, header=512), st.sampled_from(["kept", "matching", "removed"]))


def test_damaged_checkpoint_is_refused_while_its_digest_stands(worker, finished_run):
    original = (finished_run / "checkpoints" / "last.pt").read_bytes()

    @FUZZ
    @given(case=_damaged_checkpoints(finished_run))
    def check(case):
        damaged, digest = case
        folder = _copy(finished_run)
        last = folder / "checkpoints" / "last.pt"
        written = write_damaged(last, damaged)
        _record_digest(last, digest)
        answer = worker.call("load_checkpoint", str(last))
        assert_clean(answer, str(last))
        if digest == "kept" and (written != original or damaged[0] == "oversize"):
            assert "raised" in answer, "a damaged checkpoint was loaded despite its recorded SHA-256"
        shutil.rmtree(folder.parent)

    check()


def test_probe_on_a_damaged_run_exits_0_or_2_and_writes_nothing(worker, finished_run):
    original = (finished_run / "checkpoints" / "last.pt").read_bytes()

    @settings(FUZZ, max_examples=max(4, FUZZ.max_examples // 3))
    @given(case=_damaged_checkpoints(finished_run))
    def check(case):
        damaged, digest = case
        folder = _copy(finished_run)
        last = folder / "checkpoints" / "last.pt"
        changed = write_damaged(last, damaged) != original or damaged[0] == "oversize"
        _record_digest(last, digest)
        answer = worker.call("cli", "probe", str(folder), "--save", "--no-baselines", "--json", timeout=120)
        assert "returned" in answer, answer.get("traceback", answer)
        result = answer["returned"]
        if result["rc"] == 2:
            lines = result["err"].strip().splitlines()
            assert lines[-1].startswith("contrastkit probe: error: ") and str(folder) in lines[-1], result["err"]
            assert all(line.startswith(("contrastkit probe: error: ", "warning")) for line in lines), result["err"]
            assert not (folder / "probe.json").exists()
        else:
            assert result["rc"] == 0 and (digest != "kept" or not changed), result
        shutil.rmtree(folder.parent)

    check()


def _matrices():
    rng = np.random.default_rng(0)
    matrix = np.round(rng.uniform(-1, 1, (4, 4)), 3)
    buffer = io.BytesIO()
    np.save(buffer, matrix)
    text = "# similarities\n" + "\n".join(",".join(str(x) for x in row) for row in matrix) + "\n"
    return {"m.npy": buffer.getvalue(), "m.csv": text.encode()}


@pytest.mark.parametrize("name", ["m.npy", "m.csv"])
def test_explain_matrix_on_damaged_files(worker, tmp_path_factory, name):
    data = _matrices()[name]
    root = tmp_path_factory.mktemp("matrices")

    @FUZZ
    @given(damaged=damage(data, header=128), flags=st.sampled_from([["--diagonal"], ["--positives", "1,0,3,2"]]))
    def check(damaged, flags):
        path = Path(tempfile.mkdtemp(dir=root)) / name
        write_damaged(path, damaged)
        answer = worker.call("cli", "explain", "--matrix", str(path), *flags, "--json")
        assert "returned" in answer, answer.get("traceback", answer)
        result = answer["returned"]
        if result["rc"] == 2:
            lines = result["err"].strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("contrastkit explain: error: "), result["err"]
            assert "Traceback" not in result["err"] and result["out"] == ""
        else:
            assert result["rc"] == 0, result
        assert os.listdir(path.parent) == [name]  # nothing written next to it

    check()
