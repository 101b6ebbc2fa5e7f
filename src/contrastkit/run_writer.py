"""The writers of the folders contrastkit writes: every file goes through one, which records
it in the folder's manifest (:mod:`contrastkit.manifest`) as it is written, so that
``--force`` deletes exactly these and a file a user put there is never replaced. No other
module keeps a folder's manifest.

* :class:`RunWriter`, the one writer of a pretraining run's folder: every file the trainer
  writes there (``config.json``, ``config.yaml``, ``metrics.jsonl`` and the loggers' files,
  ``summary.json``, ``skipped.txt``, ``collection-index.npz``, the checkpoints, ``last_batch.pt``, the method's own files
  such as ``tokenizer.json``), and what other commands add to a run (``contrastkit probe
  --save``'s ``probe.json``, ``contrastkit neighbors``' saved FAISS indexes). The file names
  are :mod:`contrastkit.layout`'s. ``contrastkit pretrain`` and the Lightning integration
  (``skipped.txt``) write through it.
* :class:`FolderWriter`, the writer of any other folder contrastkit writes into: a study's
  (its tables, verdicts and plots), an export's, a report page's, a picture's.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from contrastkit import layout, records
from contrastkit._io import append_file, atomic_file, read_json
from contrastkit.config_files import write_config_file
from contrastkit.manifest import Manifest, RemovalPlan, plan_removal

__all__ = ["FolderStart", "FolderWriter", "RunWriter", "prepare_folder"]


class FolderWriter:
    """The writer of ``root``, a folder contrastkit writes files into, each recorded in the
    folder's manifest (``kind``, e.g. ``"sweep"``, is stored when the manifest is created and
    only says what the folder is). Names are paths relative to ``root``, ``/``-separated."""

    def __init__(self, root: "str | os.PathLike[str]", kind: str = "folder") -> None:
        self.root = os.fspath(root)
        self._manifest = Manifest(self.root, kind)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    # -- what contrastkit wrote here -------------------------------------------------------

    def exists(self) -> bool:
        """Whether the folder has a manifest (contrastkit wrote here)."""
        return self._manifest.exists()

    def listed(self) -> Dict[str, Dict[str, Any]]:
        """The files contrastkit wrote here: name -> ``{"size", "sha256"}`` or ``{"writing":
        True}`` (a ``ValueError`` naming the manifest when it cannot be read)."""
        return self._manifest.files

    @property
    def nested(self) -> List[str]:
        """The listed sub-folders that have manifests of their own (a study's runs)."""
        return self._manifest.nested

    def unchanged(self, names: Iterable[str]) -> List[str]:
        """Those of ``names`` that are listed as written and are still what contrastkit wrote:
        plain files, reached through no symbolic link, of the recorded size and SHA-256 (what
        may be reused or replaced). An unreadable manifest vouches for nothing (``[]``)."""
        try:
            listed = self.listed()
        except ValueError:
            return []
        return [name for name in names if self._manifest.unchanged(name, listed.get(name))]

    # -- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, *names: "str | os.PathLike[str]") -> Iterator[Dict[str, str]]:
        """Mark ``names`` as being written, run the body, then record them (also when the body
        raises: a file cut off is still contrastkit's). The body may put digests it computed
        into the dict it receives (``{name: sha256}``)."""
        with self._manifest.writing(*names) as known:
            yield known

    def mark_writing(self, *names: "str | os.PathLike[str]") -> List[str]:
        """Mark ``names`` as being written before they appear; returns them for :meth:`record`."""
        return self._manifest.mark_writing(*names)

    def record(self, *names: "str | os.PathLike[str]", sha256: Optional[Dict[str, str]] = None) -> None:
        """Record ``names`` as written (their size and SHA-256; ``sha256`` saves hashing what the
        caller hashed); a name no longer there is dropped from the list."""
        self._manifest.record(*names, sha256=sha256)

    def write_json(self, name: str, data: Any) -> None:
        """``name``: ``data`` as indented, key-sorted JSON, written atomically and recorded."""
        self._manifest.write_json(name, data)

    def write_csv(self, name: str, rows: List[Dict[str, Any]]) -> None:
        """``name``: ``rows`` (dicts with the same keys) as CSV with a header, atomically, recorded."""
        self._manifest.write_csv(name, rows)

    def adopt(self, names: Iterable[str]) -> None:
        """Record those of ``names`` that are there as plain files and not listed yet (a folder
        of an older contrastkit, without a manifest, that the user resumes)."""
        self._manifest.adopt(names)

    def add_nested(self, *names: "str | os.PathLike[str]") -> None:
        """List the sub-folders ``names`` as folders with manifests of their own."""
        self._manifest.add_nested(*names)

    def reset(self) -> None:
        """Start an empty manifest (the folder's files were removed, or there were none)."""
        self._manifest.reset()


def prepare_folder(out: str, *, resume: bool, force: bool, owned: Iterable[str], settings: Dict[str, Any],
                   settings_file: str, kind: str, what: Optional[str] = None, not_empty: str = "") -> FolderWriter:
    """Make ``out``, a folder whose files are written by settings (a study, a shard set), ready
    and return its writer: a new or empty folder, its settings written to ``settings_file``;
    with ``force`` the files its manifest lists (folders with manifests of their own through
    them) are deleted first, and a folder without a manifest is refused
    (:func:`contrastkit.manifest.plan_removal`); with ``resume`` the stored settings must equal
    ``settings``. ``owned`` are the names written in ``out`` (one that is there and not listed
    stops ``force``); ``kind`` the manifest's kind, ``what`` the folder in messages (default
    ``kind``), ``not_empty`` how to get past a non-empty folder.

    Anything else in a non-empty folder is never overwritten or deleted.
    """
    what = what or kind
    if resume and force:
        raise ValueError("--resume and --force exclude each other: resume continues, force starts over")
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileExistsError(f"output path {out} exists and is not a folder")
    settings = json.loads(json.dumps(settings))  # compare as stored
    settings_path = os.path.join(out, settings_file)
    writer = FolderWriter(out, kind)
    if resume:
        if not os.path.isfile(settings_path):
            raise FileNotFoundError(f"nothing to resume: {settings_path} does not exist")
        stored = read_json(settings_path, hint="; remove it or start over with --force")
        differing = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
        if differing:
            details = ", ".join(f"{k}: stored {stored.get(k)!r} vs now {settings.get(k)!r}" for k in differing)
            raise ValueError(f"{out} holds a {what} with other settings ({details}); "
                             "resume with the same options or start over with --force")
        if not writer.exists():  # a folder of an older contrastkit: its own files by name
            writer.adopt(owned)
        return writer
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise FileExistsError(f"output folder {out} is not empty; {not_empty or 'pass --force to start over'}")
    plan_removal(out, will_write=list(owned)).apply()
    writer.reset()
    writer.write_json(settings_file, settings)
    return writer


class RunWriter(FolderWriter):
    """The writer of the run folder ``root`` (:class:`~contrastkit.layout.RunFolder` names its files)."""

    def __init__(self, root: "str | os.PathLike[str]") -> None:
        super().__init__(root, "run")
        self.folder = layout.RunFolder(self.root)

    # -- before the run -----------------------------------------------------------------

    def check_new_run(self, resume: bool, force: bool, launch: Optional[str] = None) -> "FolderStart":
        """Refuse before any work: a non-empty folder needs ``resume`` or ``force``, and
        ``force`` a folder whose manifest accounts for what would be deleted (the plan is
        returned); ``resume`` a checkpoint to resume and a readable manifest.

        ``launch``: this torchrun launch (:func:`contrastkit.train.faults.launch_id`), given
        where a folder it started itself and that holds no checkpoint is started over (a
        restarted group, a requeued job's ``--resume``); such a folder is started over as with
        ``force``, replacing only the files its manifest lists."""
        own_start_over = launch is not None and self._started_unsaved_by(launch)
        if own_start_over:
            resume, force = False, True
        if resume and force:
            raise ValueError("--resume and --force exclude each other: resume continues a run, force starts over")
        out = self.root
        if resume:  # (an OUT that is not a folder was refused by the folder's lock)
            checkpoint = self.folder.last_checkpoint
            if not os.path.isfile(checkpoint):
                raise FileNotFoundError(f"nothing to resume: {checkpoint} does not exist")
            self._manifest.read()  # an unreadable manifest is refused before any work
            return FolderStart(True, False, False, None, self._recorded_derived())
        if os.path.isdir(out) and set(os.listdir(out)) - {layout.LOCK} and not force:
            raise FileExistsError(f"output folder {out} is not empty; pass --resume to continue the run "
                                  f"in it or --force to start over (this deletes the files its {layout.MANIFEST} "
                                  "lists as contrastkit's, nothing else)")
        removal = plan_removal(out, will_write=layout.RUN_FILES) if force else None
        return FolderStart(False, force, own_start_over, removal, {})

    def _started_unsaved_by(self, launch: str) -> bool:
        """Whether the manifest records ``launch`` as the one that started this folder and no
        checkpoint was ever completed here: none on disk (``checkpoints/last.pt``,
        ``previous.pt``) and none recorded in the manifest (a finished run whose checkpoints
        were deleted since is not an unstarted one; one marked as being written, by a rank that
        died writing it, is). An unreadable manifest is left to the usual rules."""
        if any(os.path.lexists(path) for path in (self.folder.last_checkpoint, self.folder.previous_checkpoint)):
            return False
        try:
            record = self._manifest.read()
        except ValueError:
            return False
        written = [name for name in layout.CHECKPOINT_FILES if "sha256" in record["files"].get(name, {})]
        return record.get("launch") == launch and not written

    def _recorded_derived(self) -> Dict[str, Any]:
        """``config.json``'s ``derived`` of the run a resume continues (``{}`` where it recorded
        none, or the file cannot be read: the resume rewrites it)."""
        try:
            derived = layout.read_run_record(self.root).get("derived")
        except (OSError, ValueError, AttributeError):
            return {}
        return derived if isinstance(derived, dict) else {}

    def start(self, start: "FolderStart", *, launch: Optional[str], method_files: Callable[[layout.RunFolder], None],
              config: Dict[str, Any], derived: Dict[str, Any], resumed_at: Optional[Tuple[int, int]] = None) -> None:
        """Once the run is set up, open the folder for training, in this order: without
        ``start.resume`` delete the previous run's files (``start.removal``, with ``force``) and
        start the manifest, recording the torchrun ``launch`` that started the run (a resume
        keeps it; a run of an older contrastkit, without one, gets one listing its run files);
        the method's own files (``method_files(folder)``); on resume ``metrics.jsonl`` cut back to
        the checkpoint (``resumed_at``: its epochs and steps done, :meth:`truncate_metrics`);
        ``config.json`` (:meth:`write_run_record`)."""
        if start.resume:
            if not self._manifest.exists():
                self._manifest.adopt(layout.RUN_FILES)
        else:
            if start.removal is not None:
                start.removal.apply()
            self._manifest.reset(launch=launch)
        os.makedirs(self.folder.checkpoints, exist_ok=True)
        with self._manifest.writing(layout.TOKENIZER):
            method_files(self.folder)
        if resumed_at is not None:
            self.truncate_metrics(*resumed_at)
        self.write_run_record(config, derived)

    def truncate_metrics(self, epoch: int, step: int) -> None:
        """Drop the records of ``metrics.jsonl`` written after the checkpoint a run resumes from
        (``epoch`` epochs and ``step`` steps done: an interrupted epoch); a record of an unknown
        format version is a ``ValueError`` naming the file and line (before anything is rewritten)."""
        path = self.folder.metrics
        if not os.path.isfile(path):
            return
        kept = []
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut off by the interruption
                if isinstance(record, dict):
                    records.metrics_record_from_dict(record, f"{path} line {number}")
                # Up to the checkpoint's step (it may lie inside the epoch after the `epoch` done ones).
                if record.get("step", 0) <= step and (record.get("kind") != records.EPOCH
                                                       or record.get("epoch", 0) <= epoch):
                    kept.append(json.dumps(record) + "\n")
        with self._manifest.writing(layout.METRICS):
            with atomic_file(path, encoding="utf-8") as handle:
                handle.writelines(kept)

    # -- what the run is ----------------------------------------------------------------

    def write_config_file(self, options: Dict[str, Any]) -> None:
        """``config.yaml``: the run's options as a ``--config`` file."""
        marked = self._manifest.mark_writing(layout.CONFIG_FILE)
        write_config_file(self.folder.config_file, options,
                          header="contrastkit pretrain --config FILE reruns this run (options given override it)")
        self._manifest.record(*marked)

    def write_run_record(self, config: Dict[str, Any], derived: Dict[str, Any]) -> None:
        """``config.json``: the resolved configuration and what the run derived from it."""
        self._manifest.write_json(layout.CONFIG, {"config": config, "derived": derived})

    # -- while it trains ----------------------------------------------------------------

    @contextlib.contextmanager
    def appending_metrics(self) -> Iterator[IO[str]]:
        """``metrics.jsonl`` open for appending, marked as being written until it is closed."""
        with self._manifest.writing(layout.METRICS), append_file(self.folder.metrics, encoding="utf-8") as handle:
            yield handle

    def mark_logger_files(self, kinds: Iterable[str]) -> None:
        """Before the loggers open: ``metrics.csv`` (``csv``) is marked as being written until
        :meth:`record_logger_files`."""
        if "csv" in kinds:
            self._manifest.mark_writing(layout.METRICS_CSV)

    def record_logger_files(self) -> None:
        """List what the loggers wrote (``metrics.csv``, the TensorBoard event files)."""
        names = [layout.METRICS_CSV, f"{layout.METRICS_CSV}.tmp"]  # a missing one leaves the list
        for directory, _, files in os.walk(os.path.join(self.root, layout.TENSORBOARD)):
            names += [os.path.relpath(os.path.join(directory, name), self.root).replace(os.sep, "/")
                      for name in files]
        self._manifest.record(*names)

    def write_checkpoint(self, save: Callable[[str], None]) -> None:
        """``checkpoints/last.pt`` (and its digest, the previous one kept): ``save(path)``
        writes it; recorded once it is complete (a failed write leaves it marked, the last
        complete one in place)."""
        marked = self._manifest.mark_writing(*layout.CHECKPOINT_FILES)
        save(self.folder.last_checkpoint)
        self._manifest.record(*marked)  # hashed once, here

    def write_last_batch(self, record: Dict[str, Any]) -> None:
        """``last_batch.pt``: the last training batch's record (:mod:`contrastkit.train.last_batch`)."""
        import torch

        with self._manifest.writing(layout.LAST_BATCH, f"{layout.LAST_BATCH}.tmp"):
            with atomic_file(self.folder.last_batch, "wb") as handle:
                torch.save(record, handle)

    # -- at the end ---------------------------------------------------------------------

    def write_skipped(self, lines: List[str]) -> Optional[str]:
        """``skipped.txt``: the damaged files a run skipped, ``"path<TAB>reason"`` one a line;
        its path, or ``None`` (nothing written) where a file of that name is there that
        contrastkit did not write."""
        path = self.folder.skipped
        os.makedirs(self.root, exist_ok=True)
        if os.path.lexists(path) and layout.SKIPPED not in self._manifest.files:
            return None
        with self._manifest.writing(layout.SKIPPED):
            with atomic_file(path, encoding="utf-8") as handle:
                handle.writelines(line + "\n" for line in lines)
        return path

    def write_collection_index(self, save: Callable[[str], None]) -> None:
        """``collection-index.npz``: an unlabeled collection's listing; ``save(path)`` writes it
        (atomically, :meth:`contrastkit.data.collection_index.RecordedIndex.write`)."""
        with self._manifest.writing(layout.COLLECTION_INDEX, f"{layout.COLLECTION_INDEX}.tmp"):
            save(self.folder.collection_index)

    def write_probe(self, result: Dict[str, Any]) -> None:
        """``probe.json``: ``contrastkit probe --save``'s re-evaluation of the run."""
        self._manifest.write_json(layout.PROBE, result)

    def write_summary(self, summary: Dict[str, Any]) -> None:
        """``summary.json``: the run's final numbers."""
        self._manifest.write_json(layout.SUMMARY, records.summary_to_dict(summary))


@dataclass
class FolderStart:
    """How a run opens its folder, as :meth:`RunWriter.check_new_run` settled it before any work."""

    resume: bool                     # continues the checkpoint in the folder
    force: bool                      # starts over, replacing the files ``removal`` lists
    own_start_over: bool             # the folder was this launch's own start, with no checkpoint: started over
    removal: Optional[RemovalPlan]   # what ``force`` deletes (checked), else None
    previous: Dict[str, Any]         # on resume, the ``derived`` record of the run it continues ({} if none)
