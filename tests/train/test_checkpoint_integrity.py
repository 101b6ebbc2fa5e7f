"""Checkpoints: SHA-256 recorded and checked, the previous checkpoint kept, a write that dies
at any point loses nothing, and damaged content is one clear error naming the file (on the
CLI: exit status 2, one line, nothing written)."""

import hashlib
import os
import shutil
import struct
import warnings
import zipfile

import pytest
import torch

from contrastkit.cli import main
from contrastkit.train import PretrainConfig, pretrain
from contrastkit.train import checkpoint as ckpt

TINY = {"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    config = PretrainConfig(data="glyphlab", data_options=dict(TINY), epochs=2, batch_size=8, out=str(out),
                            device="cpu", log_every=1)
    pretrain(config, progress=False)
    return out


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy, symlinks=True)
    return copy


def _snapshot(folder):
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                files[os.path.relpath(path, folder)] = handle.read()
    return files


def _one_error_line(capsys, command):
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"contrastkit {command}: error: ")
    return lines[0]


def _tensor_data_offset(path):
    """Offset in ``path`` of the first byte of the largest tensor's storage."""
    with zipfile.ZipFile(path) as archive:
        entry = max((e for e in archive.infolist() if "/data/" in e.filename), key=lambda e: e.file_size)
    with open(path, "rb") as handle:
        handle.seek(entry.header_offset)
        local = handle.read(30)
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    return entry.header_offset + 30 + name_length + extra_length + entry.file_size // 2


def _flip_tensor_byte(path):
    data = bytearray(open(path, "rb").read())
    data[_tensor_data_offset(path)] ^= 0x10
    open(path, "wb").write(bytes(data))


def _resave(path, **changes):
    """Rewrite a checkpoint with some entries changed (and its digest recorded anew)."""
    state = torch.load(path, weights_only=True)
    state.update(changes)
    ckpt.save_checkpoint(str(path), {k: v for k, v in state.items() if k not in ("format", "version")})


# ------------------------------------------------------------------------------ files kept


def test_digest_and_previous_checkpoint_are_written(run):
    folder = run / "checkpoints"
    assert sorted(os.listdir(folder)) == ["last.pt", "last.pt.sha256", "previous.pt", "previous.pt.sha256"]
    for name in ("last.pt", "previous.pt"):
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert (folder / f"{name}.sha256").read_text() == f"{digest}  {name}\n"  # `sha256sum -c` reads it
    assert ckpt.load_checkpoint(str(folder / "last.pt"))["epoch"] == 2
    assert ckpt.load_checkpoint(str(folder / "previous.pt"))["epoch"] == 1


class _Died(BaseException):
    """Stands for the process dying at that instant (nothing after it runs)."""


@pytest.mark.parametrize("dies_after", range(6))
def test_a_write_dying_at_any_step_leaves_a_loadable_checkpoint(tmp_path, monkeypatch, dies_after):
    path = str(tmp_path / "checkpoints" / "last.pt")
    base = {"config": {}, "model": {"w": torch.arange(50.0)}, "optimizer": {}, "scheduler": {},
            "rng": ckpt.rng_state(), "step": 0}
    ckpt.save_checkpoint(path, {**base, "epoch": 1})
    ckpt.save_checkpoint(path, {**base, "epoch": 2})
    real_replace, calls = os.replace, []

    def replace(src, dst):
        if len(calls) == dies_after:
            raise _Died
        calls.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", replace)
    with pytest.raises(_Died) if dies_after < 5 else warnings.catch_warnings():
        ckpt.save_checkpoint(path, {**base, "epoch": 3})
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, no missing digest: last.pt itself is good
        epoch = ckpt.load_checkpoint(path)["epoch"]
    assert epoch == (3 if dies_after >= 4 else 2)
    previous = ckpt.previous_checkpoint(path)
    if dies_after == 1:  # its digest is recorded, the file not yet in place: last.pt is the good one
        with pytest.raises(ValueError, match="previous.pt is damaged"):
            ckpt.load_checkpoint(previous)
    else:
        assert ckpt.load_checkpoint(previous)["epoch"] == (1 if dies_after == 0 else 2)
    ckpt.save_checkpoint(path, {**base, "epoch": 4})  # and the next write recovers the layout
    assert ckpt.load_checkpoint(path)["epoch"] == 4
    assert not [n for n in os.listdir(tmp_path / "checkpoints") if n.endswith(".tmp")]


def test_checkpoint_without_digest_loads_with_a_warning_and_bad_digest_file_is_named(run):
    last = run / "checkpoints" / "last.pt"
    os.remove(f"{last}.sha256")
    with pytest.warns(UserWarning, match="no recorded SHA-256"):
        assert ckpt.load_checkpoint(str(last))["epoch"] == 2
    (run / "checkpoints" / "last.pt.sha256").write_text("not a digest\n")
    with pytest.raises(ValueError, match="last.pt.sha256 holds no SHA-256"):
        ckpt.load_checkpoint(str(last))


# ------------------------------------------------------------------------------ the reproductions


def test_bytes_flipped_inside_a_tensor_are_refused_by_probe(run, capsys):
    last = run / "checkpoints" / "last.pt"
    _flip_tensor_byte(last)
    torch.load(last, weights_only=True)  # torch itself reads the damaged file without complaint
    before = _snapshot(run)
    assert main(["probe", str(run), "--save", "--no-baselines"]) == 2
    line = _one_error_line(capsys, "probe")
    assert str(last) in line and "SHA-256" in line and "previous.pt (epoch 1) is intact" in line
    assert _snapshot(run) == before  # no probe.json


def test_bytes_flipped_inside_a_tensor_are_refused_by_embed(run, tmp_path, capsys):
    last = run / "checkpoints" / "last.pt"
    _flip_tensor_byte(last)
    out = tmp_path / "embeddings"
    out.mkdir()
    before = _snapshot(run)
    for target in ("emb.npz", "emb.npy"):
        assert main(["embed", str(run), "--out", str(out / target), "--quiet"]) == 2
        line = _one_error_line(capsys, "embed")
        assert str(last) in line and "SHA-256" in line
    assert _snapshot(run) == before and os.listdir(out) == []  # no embeddings, marker, manifest or work folder


def test_damaged_last_checkpoint_resume_is_refused_or_falls_back(run, capsys):
    last = run / "checkpoints" / "last.pt"
    _flip_tensor_byte(last)
    before = _snapshot(run)
    assert main(["pretrain", "--out", str(run), "--resume", "--epochs", "3", "--quiet", "--no-report"]) == 2
    line = _one_error_line(capsys, "pretrain")
    assert str(last) in line and "rename it" in line
    assert _snapshot(run) == before
    with pytest.warns(UserWarning, match="falling back to the previous checkpoint"):
        assert ckpt.load_checkpoint(str(last), fallback=True)["epoch"] == 1
    (run / "checkpoints" / "previous.pt").write_bytes(b"gone")
    with pytest.raises(ValueError, match="last.pt is damaged") as err:
        ckpt.load_checkpoint(str(last), fallback=True)
    assert "previous" not in str(err.value)  # nothing intact to point to


@pytest.mark.parametrize("changes, fragment", [
    ({"rng": {"torch": torch.zeros(3, dtype=torch.uint8), "numpy": {}, "python": {}}}, "invalid RNG state in rng"),
    ({"rng_per_rank": [{"torch": "x"}]}, "invalid RNG state in rng_per_rank[0]"),
    ({"epoch": 1.5}, "epoch is 1.5, not a non-negative integer"),
    ({"epoch": "1"}, "epoch is '1', not a non-negative integer"),
    ({"step": -4}, "step is -4"),
    ({"model": [1, 2]}, "model is a list, not a dict"),
], ids=["torch-rng", "rank-rng", "float-epoch", "text-epoch", "negative-step", "model-list"])
def test_bad_checkpoint_content_is_one_named_error(run, capsys, changes, fragment):
    last = run / "checkpoints" / "last.pt"
    _resave(last, **changes)
    before = _snapshot(run)
    assert main(["pretrain", "--out", str(run), "--resume", "--epochs", "3", "--quiet", "--no-report"]) == 2
    line = _one_error_line(capsys, "pretrain")
    assert str(last) in line and fragment in line, line
    assert _snapshot(run) == before


def test_numpy_rng_keys_out_of_range_are_refused(run):
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=True)
    keys = state["rng"]["numpy"]["keys"].clone()
    keys[0] = 2**33  # would wrap around silently to a different stream
    _resave(last, rng={**state["rng"], "numpy": {**state["rng"]["numpy"], "keys": keys}})
    with pytest.raises(ValueError, match="numpy keys"):
        ckpt.load_checkpoint(str(last))


@pytest.mark.parametrize("linked", ["folder", "file"])
def test_symlinked_checkpoints_are_refused(run, tmp_path, capsys, linked):
    folder = run / "checkpoints"
    elsewhere = tmp_path / "elsewhere"
    if linked == "folder":
        shutil.move(folder, elsewhere)
        os.symlink(elsewhere, folder)
        named = str(folder)
    else:
        elsewhere.mkdir()
        shutil.move(folder / "last.pt", elsewhere / "last.pt")
        os.symlink(elsewhere / "last.pt", folder / "last.pt")
        named = str(folder / "last.pt")
    before = _snapshot(run)
    assert main(["probe", str(run), "--save", "--no-baselines"]) == 2
    line = _one_error_line(capsys, "probe")
    assert named in line and "symbolic link" in line
    assert main(["pretrain", "--out", str(run), "--resume", "--epochs", "3", "--quiet", "--no-report"]) == 2
    assert "symbolic link" in _one_error_line(capsys, "pretrain")
    with pytest.raises(ValueError, match="symbolic link"):
        ckpt.save_checkpoint(str(folder / "last.pt"), {})
    assert _snapshot(run) == before


def test_checkpoint_over_the_ceiling_is_refused(run, monkeypatch):
    monkeypatch.setenv("CONTRASTKIT_MAX_INPUT_BYTES", "1K")
    with pytest.raises(ValueError, match="last.pt holds .* more than the input ceiling"):
        ckpt.load_checkpoint(str(run / "checkpoints" / "last.pt"))
