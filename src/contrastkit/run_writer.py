"""The one writer of a pretraining run's folder: every file the trainer writes there
(``config.json``, ``config.yaml``, ``metrics.jsonl`` and the loggers' files, ``summary.json``,
``skipped.txt``, the checkpoints, ``last_batch.pt``, the method's own files such as
``tokenizer.json``) and ``contrastkit probe --save``'s ``probe.json`` go through a :class:`RunWriter`, which records each in the folder's
manifest (:mod:`contrastkit.manifest`) as it is written, so that ``--force`` deletes exactly
these. The file names are :mod:`contrastkit.layout`'s. ``contrastkit pretrain`` and the
Lightning integration (``skipped.txt``) write through it.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional

from contrastkit import layout, records
from contrastkit._io import append_file, atomic_file
from contrastkit.config_files import write_config_file
from contrastkit.manifest import Manifest, RemovalPlan, plan_removal

__all__ = ["RunWriter"]


class RunWriter:
    """The writer of the run folder ``root`` (:class:`~contrastkit.layout.RunFolder` names its files)."""

    def __init__(self, root: "str | os.PathLike[str]") -> None:
        self.folder = layout.RunFolder(os.fspath(root))
        self._manifest = Manifest(self.folder.root, "run")

    @property
    def root(self) -> str:
        return self.folder.root

    def manifest_record(self) -> Dict[str, Any]:
        """The folder's manifest as read (a ``ValueError`` naming it when unreadable)."""
        return self._manifest.read()

    # -- before the run -----------------------------------------------------------------

    def check_new_run(self, resume: bool, force: bool) -> Optional[RemovalPlan]:
        """Refuse before any work: a non-empty folder needs ``resume`` or ``force``, and
        ``force`` a folder whose manifest accounts for what would be deleted (returns that
        plan); ``resume`` a checkpoint to resume and a readable manifest."""
        if resume and force:
            raise ValueError("--resume and --force exclude each other: resume continues a run, force starts over")
        out = self.root
        if resume:  # (an OUT that is not a folder was refused by the folder's lock)
            checkpoint = self.folder.last_checkpoint
            if not os.path.isfile(checkpoint):
                raise FileNotFoundError(f"nothing to resume: {checkpoint} does not exist")
            self._manifest.read()  # an unreadable manifest is refused before any work
            return None
        if os.path.isdir(out) and set(os.listdir(out)) - {layout.LOCK} and not force:
            raise FileExistsError(f"output folder {out} is not empty; pass --resume to continue the run "
                                  f"in it or --force to start over (this deletes the files its {layout.MANIFEST} "
                                  "lists as contrastkit's, nothing else)")
        return plan_removal(out, will_write=layout.RUN_FILES) if force else None

    def start(self, resume: bool, plan: Optional[RemovalPlan] = None, launch: Optional[str] = None) -> None:
        """Once the run is set up: with ``force`` delete the previous run's files (``plan``, from
        :meth:`check_new_run`) and start the manifest, recording the torchrun ``launch`` that
        started the run; on resume keep it (a run of an older contrastkit, without one, gets one
        listing its run files)."""
        if resume:
            if not self._manifest.exists():
                self._manifest.adopt(layout.RUN_FILES)
        else:
            if plan is not None:
                plan.apply()
            self._manifest.reset(launch=launch)
        os.makedirs(self.folder.checkpoints, exist_ok=True)

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

    def write_method_files(self, save: Callable[[layout.RunFolder], None]) -> None:
        """The method's own files (``tokenizer.json`` of the paired methods): ``save(folder)``."""
        with self._manifest.writing(layout.TOKENIZER):
            save(self.folder)

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

    def write_probe(self, result: Dict[str, Any]) -> None:
        """``probe.json``: ``contrastkit probe --save``'s re-evaluation of the run."""
        self._manifest.write_json(layout.PROBE, result)

    def write_summary(self, summary: Dict[str, Any]) -> None:
        """``summary.json``: the run's final numbers."""
        self._manifest.write_json(layout.SUMMARY, records.summary_to_dict(summary))
