"""The layout of every folder contrastkit writes: the one place that knows its file names.

A *run* folder (``contrastkit pretrain --out RUN``)::

    RUN/config.json          resolved configuration + derived facts
    RUN/metrics.jsonl        one JSON record per logged step and per epoch
    RUN/summary.json         the final numbers
    RUN/checkpoints/last.pt  the latest checkpoint (written atomically)
    RUN/checkpoints/previous.pt  the one before it, kept in case last.pt is damaged
    RUN/checkpoints/*.sha256     each checkpoint's SHA-256, recorded when it was written
    RUN/tokenizer.json       paired (image-text) runs only
    RUN/probe.json           ``contrastkit probe RUN`` re-evaluation
    RUN/report.html          ``contrastkit report`` / written after a run

A *study* folder (``contrastkit sweep`` / ``contrastkit experiment``)::

    OUT/sweep.json | OUT/experiment.json   the settings (compared on --resume)
    OUT/sweep.csv  | OUT/results.csv       one row per run
    OUT/verdicts.json                      the verdicts printed
    OUT/*.png                              the plots
    OUT/runs/<run>/                        one run folder per run

Standard library only, so that every layer may import it.
"""

from __future__ import annotations

import os
from typing import Tuple

__all__ = [
    "DEFAULT_ROOT",
    "CONFIG", "METRICS", "SUMMARY", "CHECKPOINTS", "LAST_CHECKPOINT", "PREVIOUS_CHECKPOINT", "DIGEST_SUFFIX",
    "TOKENIZER", "PROBE", "REPORT",
    "RUN_OUTPUTS", "RUN_MARKERS", "RunFolder",
    "RUNS", "VERDICTS", "SWEEP_SETTINGS", "SWEEP_TABLE", "SWEEP_PLOTS", "EXPERIMENT_SETTINGS",
    "EXPERIMENT_TABLE", "POSITIVE_PAIRS_PLOT", "CONVIRT_ABLATION_PLOT", "SCHEDULES_PLOT",
    "ACCURACY_PLOT", "UNIFORMITY_PLOT", "TOLERANCE_PLOT", "UNIFORMITY_TOLERANCE_PLOT", "SIMILARITY_PROFILE_PLOT",
]

#: Where the commands put their output folders by default (``runs/pretrain``, ``runs/sweep``...).
DEFAULT_ROOT = "runs"

# ------------------------------------------------------------------------------ a run folder
CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.pt"
PREVIOUS_CHECKPOINT = "previous.pt"
#: A checkpoint's SHA-256 lives next to it, in ``<checkpoint><DIGEST_SUFFIX>`` (``sha256sum -c`` format).
DIGEST_SUFFIX = ".sha256"
TOKENIZER = "tokenizer.json"
PROBE = "probe.json"
REPORT = "report.html"

#: What ``pretrain`` writes in its folder (``--force`` removes these, and only these).
RUN_OUTPUTS: Tuple[str, ...] = (CONFIG, METRICS, SUMMARY, CHECKPOINTS, TOKENIZER, REPORT)
#: Any of these marks a folder as a run folder.
RUN_MARKERS: Tuple[str, ...] = (SUMMARY, METRICS, CONFIG)


class RunFolder:
    """Paths inside one run folder ``root``."""

    def __init__(self, root: "str | os.PathLike[str]") -> None:
        self.root = os.fspath(root)

    def _path(self, *names: str) -> str:
        return os.path.join(self.root, *names)

    @property
    def config(self) -> str:
        return self._path(CONFIG)

    @property
    def metrics(self) -> str:
        return self._path(METRICS)

    @property
    def summary(self) -> str:
        return self._path(SUMMARY)

    @property
    def checkpoints(self) -> str:
        return self._path(CHECKPOINTS)

    @property
    def last_checkpoint(self) -> str:
        return self._path(CHECKPOINTS, LAST_CHECKPOINT)

    @property
    def previous_checkpoint(self) -> str:
        return self._path(CHECKPOINTS, PREVIOUS_CHECKPOINT)

    @property
    def tokenizer(self) -> str:
        return self._path(TOKENIZER)

    @property
    def probe(self) -> str:
        return self._path(PROBE)

    @property
    def report(self) -> str:
        return self._path(REPORT)

    def __repr__(self) -> str:
        return f"RunFolder({self.root!r})"


# ------------------------------------------------------------------------------ a study folder
RUNS = "runs"
VERDICTS = "verdicts.json"
SWEEP_SETTINGS = "sweep.json"
SWEEP_TABLE = "sweep.csv"
EXPERIMENT_SETTINGS = "experiment.json"
EXPERIMENT_TABLE = "results.csv"

ACCURACY_PLOT = "accuracy_vs_tau.png"
UNIFORMITY_PLOT = "uniformity_vs_tau.png"
TOLERANCE_PLOT = "tolerance_vs_tau.png"
UNIFORMITY_TOLERANCE_PLOT = "uniformity_tolerance.png"
SIMILARITY_PROFILE_PLOT = "similarity_profile.png"
#: The sweep's plots, in display order.
SWEEP_PLOTS: Tuple[str, ...] = (ACCURACY_PLOT, UNIFORMITY_PLOT, TOLERANCE_PLOT, UNIFORMITY_TOLERANCE_PLOT,
                                SIMILARITY_PROFILE_PLOT)
POSITIVE_PAIRS_PLOT = "positive_pairs.png"
CONVIRT_ABLATION_PLOT = "convirt_ablation.png"
SCHEDULES_PLOT = "schedules.png"
