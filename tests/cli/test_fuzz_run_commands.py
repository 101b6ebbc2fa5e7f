"""Fuzzing what reads a finished run or a weights file: ``--encoder-weights`` files (``.pt`` and
``.safetensors``) damaged, made of arbitrary bytes or special files are read or refused in one
error naming the file (never one advising ``weights_only=False``: that runs the file's code);
``contrastkit neighbors``, ``embed`` and ``export`` with hostile arguments (queries such as
``train:99999``, ``-1``, huge rows, empty strings, damaged or special files; damaged ``--data``
and ``--checkpoint``) on a run whose ``config.json``, ``last.pt``, manifest or summary may be
damaged exit 0, or 2 after one error line, with no traceback, nothing written outside ``--out``
and nothing the user wrote changed. Everything runs in a child limited to 1 GiB of memory above
its start (``_bounded.py``); one tiny run is trained per module.
``CONTRASTKIT_FUZZ_EXAMPLES=500`` searches deeper."""

import argparse
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from _bounded import assert_clean, damage, fuzz_settings, worker, write_damaged  # noqa: F401 (a fixture)
from _tiny_run import TINY_GLYPHLAB

pytestmark = pytest.mark.skipif(os.name == "nt", reason="FIFOs and symbolic links are POSIX")

FUZZ = fuzz_settings()
# Advice to load with weights_only=False, in any of the spellings torch uses: it runs the file's code.
UNSAFE_ADVICE = re.compile(r"weights_only\W*(?:argument\W*)?(?:set\s+to|=)\W*False", re.IGNORECASE)


# ------------------------------------------------------------------------------ weights files

def _weights_files(root):
    tensors = {"features.0.weight": torch.randn(4, 3, 3, 3), "features.0.bias": torch.zeros(4)}
    torch.save(tensors, root / "encoder.pt")
    torch.save({"state_dict": tensors, "epoch": 3}, root / "nested.pth")
    torch.save({**tensors, "args": argparse.Namespace(lr=0.1)}, root / "code.pt")  # more than tensors
    from safetensors.torch import save_file

    save_file(tensors, str(root / "encoder.safetensors"))
    return {path.name: path.read_bytes() for path in root.iterdir()}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return _weights_files(tmp_path_factory.mktemp("weights"))


def _assert_weights_answer(answer, path):
    assert_clean(answer, str(path))
    if "raised" in answer:
        assert not UNSAFE_ADVICE.search(answer["message"]), answer["message"]


@pytest.mark.parametrize("name", ["encoder.pt", "nested.pth", "code.pt", "encoder.safetensors"])
def test_a_damaged_weights_file_is_read_or_one_clear_error(worker, weights, tmp_path_factory, name):
    root = tmp_path_factory.mktemp("damaged-weights")

    @FUZZ
    @given(damaged=damage(weights[name], header=128))
    def check(damaged):
        path = Path(tempfile.mkdtemp(dir=root)) / name
        write_damaged(path, damaged)
        _assert_weights_answer(worker.call("read_state_dict", str(path)), path)
        shutil.rmtree(path.parent)

    check()


def test_arbitrary_bytes_or_special_files_as_weights(worker, tmp_path_factory):
    root = tmp_path_factory.mktemp("noise-weights")

    @FUZZ
    @given(data=st.binary(max_size=512), suffix=st.sampled_from([".pt", ".safetensors", ".bin", ""]),
           kind=st.sampled_from(["bytes", "bytes", "fifo", "dev_zero", "folder", "dangling"]))
    def check(data, suffix, kind):
        path = Path(tempfile.mkdtemp(dir=root)) / f"weights{suffix}"
        if kind == "bytes":
            path.write_bytes(data)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "dev_zero":
            os.symlink("/dev/zero", path)
        elif kind == "folder":
            path.mkdir()
        else:
            os.symlink(path.parent / "nothing", path)
        answer = worker.call("read_state_dict", str(path), timeout=30)
        _assert_weights_answer(answer, path)
        if kind in ("fifo", "dev_zero", "folder"):  # there, but not a weights file: not "does not exist"
            assert answer.get("raised") == "ValueError" and "does not exist" not in answer["message"], answer
        shutil.rmtree(path.parent)

    check()


def test_the_undamaged_weights_files_are_read(worker, weights, tmp_path):
    for name, data in weights.items():
        (tmp_path / name).write_bytes(data)
        answer = worker.call("read_state_dict", str(tmp_path / name))
        if name == "code.pt":
            _assert_weights_answer(answer, tmp_path / name)
            assert "raised" in answer and "more than tensors" in answer["message"], answer
        else:
            assert answer["returned"] == 2, (name, answer)


# ------------------------------------------------------------------------------ neighbors, embed, export

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, worker):
    out = tmp_path_factory.mktemp("commands") / "run"
    config = dict(data="glyphlab", data_options=TINY_GLYPHLAB, epochs=1, batch_size=8, out=str(out), device="cpu",
                  log_every=1, threads=1)
    assert worker.call("pretrain", config, timeout=300)["returned"] == 1
    return out


RUN_FILES = ("config.json", "checkpoints/last.pt", "contrastkit-manifest.json", "summary.json")


def _user_files(folder):
    """What the user's hostile arguments point at: a damaged image, an empty file, a FIFO, a
    folder, a link to /dev/zero (created once per example in ``folder``)."""
    folder.mkdir()
    (folder / "damaged.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "notes.txt").write_text("my notes\n")
    os.mkfifo(folder / "fifo.png")
    os.symlink("/dev/zero", folder / "zero.pt")
    (folder / "album").mkdir()
    return {name: str(folder / name) for name in ("damaged.png", "empty.jpg", "notes.txt", "fifo.png", "zero.pt",
                                                  "album")}


def _hostile(user):
    """One hostile argument value: a query, a path, a number."""
    return st.one_of(
        st.sampled_from(["train:99999", "-1", "99999999999999999999999", "test:-3", "val:", ":", "", " ", "train:1",
                         "0", "5", "test:0", "all:1", "train:1.5", "nan", "1e9", "--k", "-", "./0"]),
        st.sampled_from(["damaged.png", "empty.jpg", "notes.txt", "fifo.png", "zero.pt", "album",
                         "missing.png"]).map(lambda name: user.get(name, str(Path(user["album"]).parent / name))),
        st.text(max_size=12),
    )


def _argv(command, draw, run, user, out):
    """A command line of ``command`` on ``run`` with hostile arguments (outputs under ``out``)."""
    hostile = draw(_hostile(user))
    # a hostile --data or --checkpoint one time in four, so that many command lines get to the run
    optional = lambda flag: [flag, draw(_hostile(user))] if draw(st.integers(0, 3)) == 0 else []  # noqa: E731
    if command == "neighbors":
        queries = draw(st.lists(st.one_of(st.sampled_from(["train:1", "0", "test:2", "val:0"]), _hostile(user)),
                                min_size=1, max_size=2))
        picture = ["--no-picture"] if draw(st.booleans()) else ["--out", str(out / "pic.png")]
        return ["neighbors", str(run), *queries, "--k", draw(st.sampled_from(["1", "3", "3", "0", "99999"])), *picture,
                "--device", "cpu", *optional("--data"), *optional("--checkpoint")]
    if command == "embed":
        target = str(out / draw(st.sampled_from(["e.npz", "e.npy", "e", "e.csv"])))
        return ["embed", str(run), "--out", target, "--device", "cpu", "--quiet",
                "--split", draw(st.sampled_from(["all", "train", "test"])), *optional("--data"),
                *optional("--checkpoint"), *(["--projection"] if hostile == "5" else [])]
    target = str(out / draw(st.sampled_from(["m.safetensors", "m", "m.pt"])))
    return ["export", str(run), "--out", target, *optional("--checkpoint"),
            *(["--format", "torchscript"] if target.endswith(".pt") else [])]


def _snapshot(folder):
    """{relative path: (kind, sha-256 of a regular file)} of everything below ``folder``."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            relative = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[relative] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    found[relative] = ("file", hashlib.sha256(handle.read()).hexdigest())
            else:
                found[relative] = ("other", "")
    return found


@pytest.mark.parametrize("command", ["neighbors", "embed", "export"])
def test_run_commands_with_hostile_arguments_and_damaged_runs(worker, finished_run, command):
    originals = {name: (finished_run / name).read_bytes() for name in RUN_FILES}

    @settings(FUZZ, max_examples=max(5, FUZZ.max_examples * 2 // 3))
    @given(data=st.data(), damaged_file=st.sampled_from((None,) * 3 + RUN_FILES))
    def check(data, damaged_file):
        scratch = Path(tempfile.mkdtemp(dir=finished_run.parent))
        run = scratch / "run"
        shutil.copytree(finished_run, run)
        if damaged_file is not None:
            write_damaged(run / damaged_file, data.draw(damage(originals[damaged_file], header=64)))
        user = _user_files(scratch / "mine")
        out = scratch / "out"
        out.mkdir()
        argv = _argv(command, data.draw, run, user, out)
        before = {"run": _snapshot(run), "mine": _snapshot(scratch / "mine")}
        answer = worker.call("cli", *argv, timeout=120)
        assert "returned" in answer, answer.get("traceback", answer)
        result = answer["returned"]
        event(f"exit status {result['rc']}")
        assert "Traceback" not in result["err"], result["err"]
        if result["rc"] == 2:
            lines = result["err"].strip().splitlines()
            errors = [line for line in lines if line.startswith(f"contrastkit {command}: error: ")]
            assert len(errors) == 1 and lines[-1] == errors[0], result["err"]
            # before it, argparse's usage (a malformed command line) or warnings, nothing else
            before_error = ("usage:", " ") if lines[0].startswith("usage:") else ("warning",)
            assert all(line.startswith(before_error) for line in lines[:-1]), result["err"]
        else:
            assert result["rc"] == 0, (argv, result)
        # nothing written outside --out, nothing of the user's (or of the run) changed
        assert {"run": _snapshot(run), "mine": _snapshot(scratch / "mine")} == before, (argv, result)
        assert sorted(os.listdir(scratch)) == ["mine", "out", "run"], (argv, result)
        shutil.rmtree(scratch)

    check()


@pytest.mark.parametrize("command", ["neighbors", "embed", "export"])
def test_run_commands_on_a_read_only_or_full_output_disk(worker, finished_run, command):
    """``--out`` on a read-only file system, or on a disk with a few bytes to a few hundred KiB
    free: the command works (what it writes fits) or exits 2 after one line that names the
    file or folder it could not write; no traceback, no temporary file left in ``--out``,
    nothing outside it changed."""

    @settings(FUZZ, max_examples=max(3, FUZZ.max_examples // 3))
    @given(mode=st.sampled_from(["read-only", "full"]), budget=st.integers(0, 400_000),
           target=st.sampled_from(["e.npz", "e.npy", "m.safetensors", "pic.png"]), in_folder=st.booleans())
    def check(mode, budget, target, in_folder):
        scratch = Path(tempfile.mkdtemp(dir=finished_run.parent))
        run = scratch / "run"
        shutil.copytree(finished_run, run)
        out = scratch / "out"
        out.mkdir()
        file = out / "sub" / target if in_folder else out / target
        if command == "neighbors":
            argv = ["neighbors", str(run), "0", "train:1", "--k", "2", "--out", str(file.with_suffix(".png")),
                    "--device", "cpu"]
        elif command == "embed":
            argv = ["embed", str(run), "--out", str(file.with_suffix(".npz" if target == "e.npz" else ".npy")),
                    "--device", "cpu", "--quiet"]
        else:
            argv = ["export", str(run), "--out", str(file.with_suffix(".safetensors"))]
        before = _snapshot(run)
        answer = worker.call("cli_on_disk", str(out), mode, budget, *argv, timeout=120)
        assert "returned" in answer, answer.get("traceback", answer)
        result = answer["returned"]
        event(f"{mode}: exit status {result['rc']}")
        assert "Traceback" not in result["err"], result["err"]
        if result["rc"] == 2:
            lines = [line for line in result["err"].strip().splitlines() if not line.startswith("warning")]
            assert len(lines) == 1 and lines[0].startswith(f"contrastkit {command}: error: "), result["err"]
            assert str(out) in lines[0], (mode, budget, lines[0])
            said = "Read-only file system" if mode == "read-only" else "No space left on device"
            assert said in lines[0] or "does not exist" in lines[0], lines  # (neighbors makes no folder)
        else:
            assert result["rc"] == 0, (argv, mode, budget, result)
        left = [os.path.join(d, f) for d, _, files in os.walk(out) for f in files if f.endswith(".tmp")]
        assert left == [], (argv, mode, budget, left)
        assert _snapshot(run) == before, (argv, result)
        assert sorted(os.listdir(scratch)) == ["out", "run"], (argv, result)
        shutil.rmtree(scratch)

    check()
