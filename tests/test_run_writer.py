"""The folder writers (:mod:`contrastkit.run_writer`): what counts as contrastkit's file still as
written, and how a run's folder check settles resume / start over, from the folder alone."""

from __future__ import annotations

import os

import pytest

from contrastkit import layout
from contrastkit.run_writer import FolderWriter, RunWriter


def _written(folder, name, text="abc"):
    writer = FolderWriter(folder)
    with writer.writing(name):
        path = os.path.join(folder, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
    return path


def test_unchanged_is_what_contrastkit_wrote_and_nothing_else(tmp_path):
    folder = str(tmp_path)
    for name in ("same.txt", "longer.txt", "edited.txt", "sub/kept.txt"):
        _written(folder, name)
    with open(os.path.join(folder, "longer.txt"), "a") as handle:
        handle.write("d")
    with open(os.path.join(folder, "edited.txt"), "w") as handle:
        handle.write("abd")  # same size, other bytes
    with open(os.path.join(folder, "users.txt"), "w") as handle:
        handle.write("abc")  # never listed
    FolderWriter(folder).mark_writing("cut.txt")  # marked, never recorded: not complete
    with open(os.path.join(folder, "cut.txt"), "w") as handle:
        handle.write("ab")
    names = ["same.txt", "longer.txt", "edited.txt", "sub/kept.txt", "users.txt", "cut.txt", "gone.txt"]
    assert FolderWriter(folder).unchanged(names) == ["same.txt", "sub/kept.txt"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links here")
def test_unchanged_follows_no_link(tmp_path):
    folder = str(tmp_path / "out")
    os.makedirs(folder)
    path = _written(folder, "sub/kept.txt")
    elsewhere = tmp_path / "elsewhere"
    os.replace(os.path.dirname(path), elsewhere)
    os.symlink(elsewhere, os.path.join(folder, "sub"))  # same bytes, reached through a link
    assert FolderWriter(folder).unchanged(["sub/kept.txt"]) == []


def test_an_unreadable_manifest_vouches_for_nothing(tmp_path):
    folder = str(tmp_path)
    _written(folder, "same.txt")
    with open(os.path.join(folder, layout.MANIFEST), "w") as handle:
        handle.write("{not json")
    assert FolderWriter(folder).unchanged(["same.txt"]) == []
    with pytest.raises(ValueError, match=layout.MANIFEST):
        FolderWriter(folder).listed()


def _started_by(folder, launch, checkpoint_recorded=False):
    writer = RunWriter(folder)
    plan = writer.check_new_run(False, False)
    writer.start(plan, launch=launch, method_files=lambda run: None, config={}, derived={"defaults": {"b": 1}})
    if checkpoint_recorded:
        writer.write_checkpoint(lambda path: open(path, "w").write("x"))
        os.remove(writer.folder.last_checkpoint)


def test_a_launch_starts_over_only_its_own_start_without_a_checkpoint(tmp_path):
    ours, theirs, saved = (str(tmp_path / name) for name in ("ours", "theirs", "saved"))
    _started_by(ours, "launch-a")
    _started_by(theirs, "launch-b")
    _started_by(saved, "launch-a", checkpoint_recorded=True)
    start = RunWriter(ours).check_new_run(False, False, launch="launch-a")
    assert (start.resume, start.force, start.own_start_over) == (False, True, True)
    assert start.removal is not None and layout.CONFIG in [os.path.basename(p) for p in start.removal.files]
    start = RunWriter(ours).check_new_run(True, False, launch="launch-a")  # a requeued job's --resume
    assert (start.resume, start.force, start.own_start_over) == (False, True, True)
    for folder in (theirs, saved):  # another launch's start; a start that completed a checkpoint
        with pytest.raises(FileExistsError, match="not empty"):
            RunWriter(folder).check_new_run(False, False, launch="launch-a")
    with pytest.raises(FileExistsError, match="not empty"):
        RunWriter(ours).check_new_run(False, False)  # no launch given: the usual rules


def test_a_resume_reads_what_the_run_recorded(tmp_path):
    folder = str(tmp_path)
    _started_by(folder, None)
    writer = RunWriter(folder)
    writer.write_checkpoint(lambda path: open(path, "w").write("x"))
    start = writer.check_new_run(True, False)
    assert (start.resume, start.force, start.previous) == (True, False, {"defaults": {"b": 1}})
    with open(writer.folder.config, "w") as handle:
        handle.write("[1, 2")  # unreadable: the resume rewrites it, the record is empty
    assert writer.check_new_run(True, False).previous == {}
    os.remove(writer.folder.last_checkpoint)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        writer.check_new_run(True, False)
    with pytest.raises(ValueError, match="exclude each other"):
        writer.check_new_run(True, True)
