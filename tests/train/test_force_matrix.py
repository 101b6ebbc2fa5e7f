"""What ``--force`` deletes: exactly the files a folder's manifest lists, unchanged, and never
anything else (run folders, user folders, mixed folders, symbolic links, a study with a
user's run in ``runs/``, tampered manifests, files changed after writing).

One tiny pretraining run and one tiny study are made once and copied into each case (a copy
keeps every byte, so the manifests' hashes still match). Most cases check
:func:`contrastkit.manifest.plan_removal` directly; the reproductions of the reported bugs go
through ``pretrain`` / ``experiment`` and the command line.
"""

import json
import os
import shutil

import pytest

from contrastkit import layout
from contrastkit.cli import main
from contrastkit.manifest import MANIFEST, Manifest, file_sha256, plan_removal
from contrastkit.report import write_explorer, write_report
from contrastkit.studies import POSITIVE_PAIRS
from contrastkit.train import PretrainConfig, pretrain

TINY_GLYPHLAB = {"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28}
TINY_CLI = ["--epochs", "1", "--batch-size", "8", "--quiet"] + [
    arg for key, value in TINY_GLYPHLAB.items() for arg in ("--data-option", f"{key}={value}")]
# One run at a time, in this process: spawning a pool of run processes (the default on a machine
# with several cores) is tested in tests/studies/test_study_jobs.py, not what these tests check.
TINY_STUDY = ["--seeds", "1", "--epochs", "1", "--batch-size", "8", "--no-progress", "--jobs", "1"] + [
    arg for key, value in TINY_GLYPHLAB.items() for arg in ("--data-option", f"{key}={value}")]
# A one-epoch run: the checkpoint and its SHA-256 file (no previous.pt yet), the last batch kept for
# the pictures, the report and the explorer page on that batch the report links to.
RUN_FILES = {"config.json", "config.yaml", "metrics.jsonl", "summary.json", "checkpoints/last.pt", "checkpoints/last.pt.sha256",
             "last_batch.pt", "report.html", "explorer.html"}
PAGES = {"report.html", "explorer.html"}


def tiny_config(out, **overrides):
    options = dict(data="glyphlab", data_options=dict(TINY_GLYPHLAB), epochs=1, batch_size=8, out=str(out),
                   device="cpu", log_every=1)
    options.update(overrides)
    return PretrainConfig(**options)


@pytest.fixture(scope="module")
def run_template(tmp_path_factory):
    out = tmp_path_factory.mktemp("template") / "run"
    pretrain(tiny_config(out), progress=False, baselines=False)
    write_report(out)
    return out


@pytest.fixture(scope="module")
def study_template(tmp_path_factory):
    out = tmp_path_factory.mktemp("template") / "study"
    POSITIVE_PAIRS.run(str(out), progress=False, seeds=1, epochs=1, batch_size=8, jobs=1,
                       data_options=dict(TINY_GLYPHLAB))
    return out


@pytest.fixture
def run(tmp_path, run_template):
    shutil.copytree(run_template, tmp_path / "run", symlinks=True)
    return tmp_path / "run"


@pytest.fixture
def study(tmp_path, study_template):
    shutil.copytree(study_template, tmp_path / "study", symlinks=True)
    return tmp_path / "study"


def tree(root):
    """Every path under ``root`` (relative, ``/``-separated), links not followed: what it is
    and its content (file hash, link target)."""
    entries = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if os.path.islink(path):
                entries[relative] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                entries[relative] = ("dir",)
            else:
                entries[relative] = ("file", file_sha256(path))
    return entries


def listed(root, prefix=""):
    """Every path the manifests of ``root`` (nested ones too, and those manifests) list."""
    manifest = Manifest(root)
    names = {prefix + name for name in manifest.files}
    for sub in manifest.nested:
        folder = os.path.join(root, *sub.split("/"))
        if os.path.isdir(folder) and os.path.exists(os.path.join(folder, MANIFEST)):
            names |= listed(folder, f"{prefix}{sub}/") | {f"{prefix}{sub}/{MANIFEST}"}
    return names


def force(root, **options):
    """Plan and apply ``--force`` on ``root``; asserts that nothing outside the manifests was
    removed or changed, and that a folder was removed only with everything in it."""
    before, names = tree(root), listed(root)
    plan_removal(root, **options).apply()
    after = tree(root)
    removed = set(before) - set(after)
    for path in removed:
        if before[path][0] == "dir":
            assert all(p in removed for p in before if p.startswith(path + "/")), path
        else:
            assert before[path][0] == "file" and path in names, f"{path} was removed but is not listed"
    assert {p for p in after if before.get(p) != after[p]} == set(), "a kept file changed"
    return removed


def refused(root, match, **options):
    """``--force`` on ``root`` is refused with ``match`` and leaves the folder as it was."""
    before = tree(root)
    with pytest.raises((FileExistsError, ValueError), match=match) as err:
        plan_removal(root, **options).apply()
    assert tree(root) == before
    return str(err.value)


# ------------------------------------------------------------------------------ what is written

def test_every_file_a_run_writes_is_in_its_manifest(run):
    manifest = Manifest(run)
    assert manifest.read()["kind"] == "run"
    assert set(manifest.files) == RUN_FILES  # the report recorded itself too
    on_disk = {p for p, kind in tree(run).items() if kind[0] == "file"} - {MANIFEST}
    assert on_disk == RUN_FILES and manifest.check() == []
    entry = manifest.files["checkpoints/last.pt"]
    assert entry == {"size": os.path.getsize(run / "checkpoints" / "last.pt"),
                     "sha256": file_sha256(run / "checkpoints" / "last.pt")}


def test_a_study_lists_its_files_and_its_runs_as_nested_manifests(study):
    manifest = Manifest(study)
    assert manifest.read()["kind"] == POSITIVE_PAIRS.label
    assert sorted(manifest.nested) == ["runs/pairsA-seed0", "runs/pairsB-seed0"]
    assert set(manifest.files) == {"experiment.json", "results.csv", "verdicts.json", "positive_pairs.png"}
    for sub in manifest.nested:
        assert set(Manifest(study / sub).files) == RUN_FILES - PAGES
        assert Manifest(study / sub).check() == []
    assert manifest.check() == []


def test_resume_keeps_the_manifest_consistent(tmp_path):
    out = tmp_path / "run"

    def stop(epoch, record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pretrain(tiny_config(out, epochs=2), progress=False, baselines=False, on_epoch_end=stop)
    # interrupted: what was written so far is listed, and matches
    assert Manifest(out).check() == [] and "checkpoints/last.pt" in Manifest(out).files
    pretrain(tiny_config(out, epochs=2), resume=True, progress=False, baselines=False)
    assert Manifest(out).check() == []
    # two epochs: the first checkpoint is kept as previous.pt, with its digest
    assert set(Manifest(out).files) == (RUN_FILES - PAGES) | {"checkpoints/previous.pt",
                                                                       "checkpoints/previous.pt.sha256"}


def test_resuming_a_run_of_an_older_version_adopts_its_run_files(run):
    (run / MANIFEST).unlink()
    (run / "notes.txt").write_text("mine")
    pretrain(tiny_config(run), resume=True, progress=False, baselines=False)  # nothing left to train
    assert set(Manifest(run).files) == RUN_FILES and Manifest(run).check() == []
    force(run)
    assert sorted(tree(run)) == [MANIFEST, "notes.txt"]


def test_probe_save_and_pages_are_recorded(run, tmp_path, capsys):
    assert main(["probe", str(run), "--no-baselines", "--save", "--json", "--device", "cpu"]) == 0
    assert Manifest(run).files["probe.json"]["sha256"] == file_sha256(run / "probe.json")
    pages = tmp_path / "pages"
    pages.mkdir()
    write_explorer(pages / "explorer.html")
    assert set(Manifest(pages).files) == {"explorer.html"}
    assert force(pages) == {"explorer.html"}


# ------------------------------------------------------------------------------ the matrix

def test_run_folder_everything_listed_goes_the_folder_stays(run):
    removed = force(run)
    assert removed == RUN_FILES | {"checkpoints"}
    assert sorted(os.listdir(run)) == [MANIFEST]


@pytest.mark.parametrize("names", [["notes.txt"], ["config.json", "report.html", "tokenizer.json"],
                                   [f"file{i}.txt" for i in range(9)]])
def test_user_folder_without_a_manifest_is_refused_saying_what_is_there(tmp_path, names):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in names:
        (folder / name).write_text("mine")
    message = refused(folder, "no contrastkit-manifest.json")
    assert f"holds {len(names)} entr" in message and names[0] in message
    assert "older contrastkit" in message and "by hand" in message and "another --out" in message
    if len(names) > 5:
        assert f"and {len(names) - 5} more" in message and names[-1] not in message


def test_empty_or_missing_folder_needs_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    assert plan_removal(tmp_path / "empty").files == []
    assert plan_removal(tmp_path / "missing").files == []


def test_mixed_folder_keeps_the_users_files_everywhere(run):
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints" / "my_other_model.pt").write_bytes(b"weights")
    (run / "analysis").mkdir()
    (run / "analysis" / "plot.png").write_bytes(b"png")
    removed = force(run)
    assert removed == RUN_FILES
    assert sorted(tree(run)) == ["analysis", "analysis/plot.png", "checkpoints", "checkpoints/my_other_model.pt",
                                 MANIFEST, "notes.txt"]


def test_a_symlink_the_user_added_is_kept_and_its_target_untouched(run, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.txt").write_text("precious")
    (run / "link-to-file").symlink_to(outside / "data.txt")
    (run / "link-to-folder").symlink_to(outside, target_is_directory=True)
    force(run)
    assert os.path.islink(run / "link-to-file") and os.path.islink(run / "link-to-folder")
    assert tree(outside) == {"data.txt": ("file", file_sha256(outside / "data.txt"))}


def test_a_listed_file_replaced_by_a_symlink_is_refused(run, tmp_path):
    # The link's target has the very content contrastkit recorded: still refused, never followed.
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "model.pt"
    shutil.copy(run / "checkpoints" / "last.pt", target)
    (run / "checkpoints" / "last.pt").unlink()
    (run / "checkpoints" / "last.pt").symlink_to(target)
    before = tree(outside)
    refused(run, r"checkpoints/last.pt \(now a symbolic link\)")
    assert tree(outside) == before


def test_a_symlinked_checkpoints_folder_is_refused_and_not_followed(run, tmp_path):
    theirs = tmp_path / "their-checkpoints"
    shutil.move(run / "checkpoints", theirs)  # last.pt as recorded, now in the user's folder
    (theirs / "my_other_model.pt").write_bytes(b"weights")
    (run / "checkpoints").symlink_to(theirs, target_is_directory=True)
    before = tree(theirs)
    refused(run, "reached through the symbolic link checkpoints")
    assert tree(theirs) == before


def test_nested_study_removes_its_runs_only_through_their_manifests(study, run_template):
    # A user's own run (a contrastkit run folder, with its manifest) and notes in runs/.
    shutil.copytree(run_template, study / "runs" / "pretrain", symlinks=True)
    (study / "runs" / "notes.txt").write_text("mine")
    (study / "runs" / "pairsA-seed0" / "mine.txt").write_text("mine")  # inside one of the study's runs
    users_run = tree(study / "runs" / "pretrain")
    removed = force(study)
    assert "runs/pairsB-seed0" in removed and "runs/pairsA-seed0" not in removed
    assert sorted(os.listdir(study / "runs")) == ["notes.txt", "pairsA-seed0", "pretrain"]
    assert sorted(os.listdir(study / "runs" / "pairsA-seed0")) == ["mine.txt"]
    assert tree(study / "runs" / "pretrain") == users_run


def test_nested_run_without_its_manifest_is_refused(study):
    (study / "runs" / "pairsB-seed0" / MANIFEST).unlink()
    refused(study, r"runs/pairsB-seed0/ \(no contrastkit-manifest.json")


def test_symlinked_nested_run_or_runs_folder_is_refused(study, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.move(study / "runs" / "pairsB-seed0", moved)
    (study / "runs" / "pairsB-seed0").symlink_to(moved, target_is_directory=True)
    before = tree(moved)
    refused(study, "pairsB-seed0/ \\(a symbolic link")
    assert tree(moved) == before
    (study / "runs" / "pairsB-seed0").unlink()
    shutil.move(study / "runs", tmp_path / "runs")
    (study / "runs").symlink_to(tmp_path / "runs", target_is_directory=True)
    refused(study, "a symbolic link, or reached through one")


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/passwd", "checkpoints/../../outside.txt", "a//b",
                                  "./config.json", "a\\..\\..\\outside.txt", "C:/outside.txt", "", "a\x00b"])
def test_a_manifest_listing_a_path_outside_the_folder_is_refused(run, tmp_path, name):
    (tmp_path / "outside.txt").write_text("precious")
    data = json.loads((run / MANIFEST).read_text())
    data["files"][name] = dict(data["files"]["config.json"])
    (run / MANIFEST).write_text(json.dumps(data))
    refused(run, "not a plain path inside its folder|invalid path")
    assert (tmp_path / "outside.txt").read_text() == "precious"


@pytest.mark.parametrize("nested", ["..", "../other", "/tmp"])
def test_a_manifest_with_a_nested_folder_outside_is_refused(study, tmp_path, nested):
    data = json.loads((study / MANIFEST).read_text())
    data["nested"].append(nested)
    (study / MANIFEST).write_text(json.dumps(data))
    refused(study, "not a plain path inside its folder")


@pytest.mark.parametrize("damage, match", [
    (lambda m: m.write_text("{not json"), "not a valid manifest"),
    (lambda m: m.write_text(json.dumps({"format": "other"})), "not a contrastkit manifest"),
    (lambda m: m.write_text(json.dumps({"format": "contrastkit-manifest", "version": 1, "files": {
        "config.json": {"size": 1, "sha256": "xyz"}}})), "needs a size and a SHA-256"),
    (lambda m: m.write_text(json.dumps({"format": "contrastkit-manifest", "version": 1, "files": {
        "config.json": {"size": True, "sha256": "0" * 64}}})), "needs a size and a SHA-256"),
    (lambda m: m.write_text(json.dumps({"format": "contrastkit-manifest", "version": 2, "files": {}})),
     "manifest version 2"),
])
def test_an_unreadable_manifest_is_refused(run, damage, match):
    damage(run / MANIFEST)
    refused(run, match)


def test_a_symlinked_manifest_is_refused(run, tmp_path):
    shutil.move(run / MANIFEST, tmp_path / "elsewhere.json")
    (run / MANIFEST).symlink_to(tmp_path / "elsewhere.json")
    refused(run, "not a plain file")


def test_a_file_changed_after_writing_is_refused(run):
    with open(run / "config.json", "a", encoding="utf-8") as handle:
        handle.write("\n")  # the user edited it
    checkpoint = bytearray((run / "checkpoints" / "last.pt").read_bytes())
    checkpoint[len(checkpoint) // 2] ^= 0xFF  # same size, other content
    (run / "checkpoints" / "last.pt").write_bytes(bytes(checkpoint))
    message = refused(run, "changed since contrastkit wrote it")
    assert "config.json" in message and "checkpoints/last.pt" in message and "nothing was deleted" in message


def test_a_listed_file_replaced_by_a_folder_is_refused(run):
    (run / "summary.json").unlink()
    (run / "summary.json").mkdir()
    (run / "summary.json" / "mine.txt").write_text("mine")
    refused(run, r"summary.json \(no longer a plain file\)")


def test_a_file_changed_between_the_check_and_the_deletion_is_kept(run):
    plan = plan_removal(run)
    (run / "summary.json").write_text("{}\n")
    before = tree(run)
    with pytest.raises(FileExistsError, match="summary.json changed while"):
        plan.apply()
    assert tree(run) == before


def test_a_file_being_written_when_the_process_died_is_ours(run):
    # kill -9 during the checkpoint write: the mark is left, and so is the temporary file.
    Manifest(run).mark_writing("checkpoints/last.pt")
    (run / "checkpoints" / "last.pt.tmp").write_bytes(b"half a checkpoint")
    (run / "checkpoints" / "last.pt").write_bytes(b"whatever")
    removed = force(run)
    assert {"checkpoints/last.pt", "checkpoints/last.pt.tmp", "checkpoints"} <= removed


def test_a_file_the_run_would_overwrite_that_is_not_listed_is_refused(run):
    data = json.loads((run / MANIFEST).read_text())
    del data["files"]["config.json"]  # e.g. a user's own config.json next to a run
    (run / MANIFEST).write_text(json.dumps(data))
    refused(run, r"config.json \(not listed in the manifest", will_write=layout.RUN_FILES)
    force(run)  # without anything to write, the listed files go and config.json stays
    assert (run / "config.json").exists()


def test_a_symlinked_folder_where_the_run_writes_is_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    Manifest(folder).reset()
    (tmp_path / "theirs").mkdir()
    (folder / "checkpoints").symlink_to(tmp_path / "theirs", target_is_directory=True)
    refused(folder, "checkpoints \\(a symbolic link where contrastkit writes", will_write=layout.RUN_FILES)


# ------------------------------------------------------------------------------ the reported bugs

def test_pretrain_force_keeps_a_users_checkpoint(run):
    """Reported: ``pretrain --force`` deleted ``checkpoints/`` whole, with the user's
    ``checkpoints/my_other_model.pt`` in it."""
    (run / "checkpoints" / "my_other_model.pt").write_bytes(b"my weights")
    (run / "notes.txt").write_text("mine")
    pretrain(tiny_config(run, seed=3), force=True, progress=False, baselines=False)
    assert (run / "checkpoints" / "my_other_model.pt").read_bytes() == b"my weights"
    assert (run / "notes.txt").read_text() == "mine"
    assert Manifest(run).check() == [] and "notes.txt" not in Manifest(run).files
    assert not (run / "report.html").exists()  # the old run's report went with it


def test_pretrain_force_refuses_a_folder_it_did_not_write(tmp_path, capsys):
    """Reported: ``pretrain --force`` deleted ``config.json``, ``report.html`` and
    ``tokenizer.json`` by name, whether or not contrastkit wrote them."""
    folder = tmp_path / "mine"
    (folder / "checkpoints").mkdir(parents=True)
    for name in ("config.json", "report.html", "tokenizer.json", "checkpoints/model.pt"):
        (folder / name).write_text(f"my {name}")
    before = tree(folder)
    assert main(["pretrain", "--out", str(folder), "--force"] + TINY_CLI) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no contrastkit-manifest.json" in err and "another --out" in err
    assert tree(folder) == before


def test_experiment_force_keeps_a_users_run_in_runs(study, run_template, capsys):
    """Reported: ``sweep --force`` deleted all of ``OUT/runs/``, including unrelated runs such
    as the default ``runs/pretrain``."""
    shutil.copytree(run_template, study / "runs" / "pretrain", symlinks=True)
    users_run = tree(study / "runs" / "pretrain")
    assert main(["experiment", "positive-pairs", "--out", str(study), "--force"] + TINY_STUDY) == 0
    capsys.readouterr()
    assert tree(study / "runs" / "pretrain") == users_run
    assert sorted(Manifest(study).nested) == ["runs/pairsA-seed0", "runs/pairsB-seed0"]
    assert Manifest(study).check() == []


def test_a_study_refuses_a_folder_of_someone_else_where_its_run_goes(study):
    """After --force, a folder under a run's name that the study does not list is not reused."""
    foreign = study / "runs" / "pairsB-seed0"
    (foreign / MANIFEST).unlink()  # no longer the study's run
    data = json.loads((study / MANIFEST).read_text())
    data["nested"].remove("runs/pairsB-seed0")
    (study / MANIFEST).write_text(json.dumps(data))
    before = tree(foreign)
    with pytest.raises(FileExistsError, match="runs/pairsB-seed0 .* not runs"):
        POSITIVE_PAIRS.run(str(study), force=True, progress=False, seeds=1, epochs=1, batch_size=8, jobs=1,
                           data_options=dict(TINY_GLYPHLAB))
    assert tree(foreign) == before


def test_sweep_force_keeps_a_users_folder_in_runs_and_recreates_its_own_runs(tmp_path, run_template, capsys):
    """Reported: ``sweep --force`` deleted all of ``OUT/runs/``, the default ``runs/pretrain``
    included; now it removes its own runs (through their manifests) and trains them again."""
    out = tmp_path / "sweep"
    sweep = ["sweep", "--temperatures", "0.5,0.1", "--no-variants", "--out", str(out)] + TINY_STUDY
    assert main(sweep) == 0
    own = sorted(Manifest(out).nested)
    assert own == ["runs/nt_xent-tau0.1-seed0", "runs/nt_xent-tau0.5-seed0"]
    shutil.copytree(run_template, out / "runs" / "pretrain", symlinks=True)  # a run of the user's
    (out / "runs" / "pretrain" / "notes.txt").write_text("my notes\n")  # and a file contrastkit never wrote
    (out / "runs" / "mine.txt").write_text("mine\n")
    users = tree(out / "runs" / "pretrain")
    # Hard links keep the old files alive: a recreated file is a new inode, not the old one kept.
    old = {}
    for name in own:
        old[name] = tmp_path / f"{name.replace('/', '_')}.summary.json"
        os.link(out / name / "summary.json", old[name])
    assert main(sweep) == 2  # the folder holds a sweep: --force (or --resume) is needed
    assert main(sweep + ["--force"]) == 0
    capsys.readouterr()
    assert tree(out / "runs" / "pretrain") == users and (out / "runs" / "mine.txt").read_text() == "mine\n"
    assert sorted(Manifest(out).nested) == own and Manifest(out).check() == []
    for name in own:
        summary = out / name / "summary.json"
        assert summary.is_file() and not os.path.samefile(summary, old[name]), name  # removed and written again
        assert json.loads(summary.read_text())["epochs"] == 1
