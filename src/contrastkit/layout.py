"""The layout of every folder contrastkit writes: the one place that knows its file names.

A *run* folder (``contrastkit pretrain --out RUN``)::

    RUN/config.json          resolved configuration + derived facts
    RUN/config.yaml          the same options as a config file (``pretrain --config``)
    RUN/metrics.jsonl        one JSON record per logged step and per epoch
    RUN/metrics.csv          ``--logger csv``: the logged scalars, one per row
    RUN/tensorboard/         ``--logger tensorboard``: TensorBoard event files
    RUN/summary.json         the final numbers
    RUN/checkpoints/last.pt  the latest checkpoint (written atomically)
    RUN/checkpoints/previous.pt  the one before it, kept in case last.pt is damaged
    RUN/checkpoints/*.sha256     each checkpoint's SHA-256, recorded when it was written
    RUN/tokenizer.json       paired (image-text) runs only
    RUN/last_batch.pt        the last training batch: similarities, positives, a few views
                             (the report's pictures, ``contrastkit explore RUN``)
    RUN/probe.json           ``contrastkit probe RUN`` re-evaluation
    RUN/report.html          ``contrastkit report`` / written after a run
    RUN/skipped.txt          the damaged files an unlabeled collection's run skipped
    RUN/collection-index.npz an unlabeled collection's listing (its splits' files, what was left
                             out, a fingerprint of its folders or list), read back instead of
                             listing it again (``contrastkit.data.collection_index``)
    RUN/neighbors.png        ``contrastkit neighbors RUN ...``: the queries and their neighbors
    RUN/neighbors/<sha256>.faiss  ``neighbors --index faiss``: a FAISS index of the collection's
                             features, named by the SHA-256 of the encoder and the data it holds,
    RUN/neighbors/<sha256>.json   and what it was built from (``contrastkit.train.neighbors``)
    RUN/explorer.html        the temperature explorer on the last batch's rows (linked from the report)
    RUN/contrastkit-manifest.json   every file above that contrastkit wrote (see below)
    RUN/contrastkit.lock     while a run trains in RUN: its process id and host, so that a second
                             run on RUN is refused (removed when the run ends; ``train.faults``)

An *embedding export* (``contrastkit embed RUN --out FILE``)::

    FILE.npz                 h (z), labels, splits, names in one archive, or
    FILE.npy, FILE_z.npy     h (and z with --projection), one row per sample
    FILE.csv                 split, index, label and name of each row
    FILE.npz|FILE.npy.contrastkit.json   what the export wrote (a later --force replaces only these)

A *model export* (``contrastkit export RUN --format F --out FILE``)::

    FILE.safetensors | FILE.onnx | FILE.pt   the encoder (with --projection, and its head)
    FILE.<suffix>.contrastkit.json           its input contract and what was written

A *study* folder (``contrastkit sweep`` / ``contrastkit experiment``)::

    OUT/sweep.json | OUT/experiment.json   the settings (compared on --resume)
    OUT/sweep.csv  | OUT/results.csv       one row per run
    OUT/verdicts.json                      the verdicts printed
    OUT/*.png                              the plots
    OUT/runs/<run>/                        one run folder per run
    OUT/contrastkit-manifest.json          the files above, the runs as nested manifests

A *study over training budgets* (``contrastkit sweep --budgets`` / ``experiment --budgets``)::

    OUT/budgets.json                       the settings and the budgets (compared on --resume)
    OUT/budget-<SIZE>x<EPOCHS>/            one study folder (as above) per budget
    OUT/budgets.csv                        per budget, per setting: the means (the sweep's view)
    OUT/verdicts_by_budget.json            every verdict's status at each budget, and where it changes
    OUT/budgets_*.png, OUT/best_tau_vs_budget.png   the cross-budget plots (the sweep's view)
    OUT/contrastkit-manifest.json          the files above, the budget folders as nested manifests

The *baseline cache* (``pretrain --baseline-cache``, by default :func:`default_cache_root`)::

    CACHE/baselines/<sha256>.json   one read-out baseline's numbers (the raw pixels of a data set,
                                    or an untrained encoder on it), named by the SHA-256 of what
                                    decides them (``contrastkit.train.baselines``)

Every run folder and study folder holds a manifest (:data:`MANIFEST`, see
:mod:`contrastkit.manifest`): ``--force`` deletes the files it lists, and only those.

Standard library only, so that every layer may import it.
"""

from __future__ import annotations

import os
from typing import Dict, Tuple

__all__ = [
    "DEFAULT_ROOT", "MANIFEST", "RUN_FILES", "CHECKPOINT_FILES",
    "CONFIG", "CONFIG_FILE", "METRICS", "METRICS_CSV", "TENSORBOARD", "SUMMARY", "CHECKPOINTS", "LAST_CHECKPOINT",
    "PREVIOUS_CHECKPOINT", "DIGEST_SUFFIX", "LOCK", "TOKENIZER", "PROBE", "REPORT", "SKIPPED", "COLLECTION_INDEX", "LAST_BATCH", "EXPLORER",
    "RUN_OUTPUTS", "RUN_MARKERS", "RunFolder", "EXPORT_MARKER", "EMBEDDINGS_MARKER", "embedding_files",
    "MODEL_FORMATS", "model_export_files", "model_format", "refuse_folder_out",
    "NEIGHBORS_PICTURE", "NEIGHBOR_INDEXES", "neighbor_index_files",
    "RUNS", "VERDICTS", "SWEEP_SETTINGS", "SWEEP_TABLE", "SWEEP_PLOTS", "EXPERIMENT_SETTINGS",
    "EXPERIMENT_TABLE", "POSITIVE_PAIRS_PLOT", "CONVIRT_ABLATION_PLOT", "SCHEDULES_PLOT", "TEMPERATURE_METHODS_PLOT",
    "ACCURACY_PLOT", "UNIFORMITY_PLOT", "TOLERANCE_PLOT", "UNIFORMITY_TOLERANCE_PLOT", "SIMILARITY_PROFILE_PLOT",
    "BUDGETS_SETTINGS", "BUDGETS_TABLE", "VERDICTS_BY_BUDGET", "BUDGET_PREFIX", "BUDGETS_SUFFIX", "budget_folder",
    "BUDGETS_ACCURACY_PLOT", "BUDGETS_UNIFORMITY_PLOT", "BUDGETS_TOLERANCE_PLOT", "BEST_TAU_PLOT", "BUDGET_PLOTS",
    "CACHE_ENV", "BASELINES", "default_cache_root", "baseline_file", "CACHE_AUTO", "CACHE_OFF", "check_cache_setting",
    "read_run_record",
]

#: Where the commands put their output folders by default (``runs/pretrain``, ``runs/sweep``...).
DEFAULT_ROOT = "runs"

# ------------------------------------------------------------------------------ a run folder
CONFIG = "config.json"
CONFIG_FILE = "config.yaml"
METRICS = "metrics.jsonl"
METRICS_CSV = "metrics.csv"
TENSORBOARD = "tensorboard"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.pt"
PREVIOUS_CHECKPOINT = "previous.pt"
#: A checkpoint's SHA-256 lives next to it, in ``<checkpoint><DIGEST_SUFFIX>`` (``sha256sum -c`` format).
DIGEST_SUFFIX = ".sha256"
#: Held by the run training in the folder, and removed when it ends (not a run output).
LOCK = "contrastkit.lock"
TOKENIZER = "tokenizer.json"
PROBE = "probe.json"
REPORT = "report.html"
#: The damaged files an unlabeled collection's run skipped, one ``path<TAB>reason`` a line.
SKIPPED = "skipped.txt"
#: An unlabeled collection's recorded listing (:mod:`contrastkit.data.collection_index`).
COLLECTION_INDEX = "collection-index.npz"
#: ``contrastkit neighbors``' picture (its default ``--out``), and the folder of its FAISS indexes.
NEIGHBORS_PICTURE = "neighbors.png"
NEIGHBOR_INDEXES = "neighbors"
LAST_BATCH = "last_batch.pt"
EXPLORER = "explorer.html"

#: What ``pretrain`` writes in its folder (``--force`` removes those of them its manifest lists).
RUN_OUTPUTS: Tuple[str, ...] = (CONFIG, CONFIG_FILE, METRICS, METRICS_CSV, TENSORBOARD, SUMMARY, CHECKPOINTS,
                                TOKENIZER, LAST_BATCH, REPORT, EXPLORER, SKIPPED, COLLECTION_INDEX)
#: Any of these marks a folder as a run folder.
RUN_MARKERS: Tuple[str, ...] = (SUMMARY, METRICS, CONFIG)

# ------------------------------------------------------------------------------ manifests
#: The manifest of every folder contrastkit writes (the files it wrote, their sizes and hashes).
MANIFEST = "contrastkit-manifest.json"
#: The files (paths inside the folder) ``pretrain`` writes; one of them that exists and is not
#: in the manifest stops ``--force`` (it would be overwritten).
#: The checkpoint files (paths inside the run folder): the latest, the one before it, and
#: their SHA-256 files.
CHECKPOINT_FILES: Tuple[str, ...] = tuple(f"{CHECKPOINTS}/{name}{suffix}" for name in (LAST_CHECKPOINT, PREVIOUS_CHECKPOINT)
                                          for suffix in ("", DIGEST_SUFFIX))
RUN_FILES: Tuple[str, ...] = (CONFIG, CONFIG_FILE, METRICS, METRICS_CSV, SUMMARY) + CHECKPOINT_FILES + (
    TOKENIZER, LAST_BATCH, REPORT, EXPLORER, SKIPPED, COLLECTION_INDEX)
# ------------------------------------------------------------------------------ (manifests end)


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
    def config_file(self) -> str:
        return self._path(CONFIG_FILE)

    @property
    def metrics(self) -> str:
        return self._path(METRICS)

    @property
    def metrics_csv(self) -> str:
        return self._path(METRICS_CSV)

    @property
    def tensorboard(self) -> str:
        return self._path(TENSORBOARD)

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
    def lock(self) -> str:
        return self._path(LOCK)

    @property
    def tokenizer(self) -> str:
        return self._path(TOKENIZER)

    @property
    def probe(self) -> str:
        return self._path(PROBE)

    @property
    def report(self) -> str:
        return self._path(REPORT)

    @property
    def skipped(self) -> str:
        return self._path(SKIPPED)

    @property
    def collection_index(self) -> str:
        return self._path(COLLECTION_INDEX)

    @property
    def neighbors_picture(self) -> str:
        return self._path(NEIGHBORS_PICTURE)

    @property
    def neighbor_indexes(self) -> str:
        return self._path(NEIGHBOR_INDEXES)

    @property
    def last_batch(self) -> str:
        return self._path(LAST_BATCH)

    @property
    def explorer(self) -> str:
        return self._path(EXPLORER)

    def __repr__(self) -> str:
        return f"RunFolder({self.root!r})"


# ------------------------------------------------------------------------------ an embedding export
#: Suffix of the marker an export (embeddings or a model) writes next to its files.
EXPORT_MARKER = ".contrastkit.json"
#: The embedding export's marker suffix (:data:`EXPORT_MARKER`).
EMBEDDINGS_MARKER = EXPORT_MARKER


def embedding_files(out: "str | os.PathLike[str]", projection: bool) -> Dict[str, str]:
    """The files ``contrastkit embed --out OUT`` writes, by role: ``archive`` (``OUT`` ending in
    ``.npz``) or ``h`` / ``z`` (with ``projection``) / ``rows`` (``.npy`` + ``.csv``), and
    ``marker``. ``OUT`` without either suffix is a stem: ``OUT.npy``, ``OUT_z.npy``, ``OUT.csv``;
    an ``OUT`` that is a folder is refused (:func:`refuse_folder_out`)."""
    out = os.fspath(out)
    refuse_folder_out(out, "embeddings.npz")
    stem, suffix = os.path.splitext(out)
    if suffix.lower() == ".npz":
        files = {"archive": out}
    else:
        if suffix.lower() != ".npy":
            stem = out
        files = {"h": f"{stem}.npy", **({"z": f"{stem}_z.npy"} if projection else {}), "rows": f"{stem}.csv"}
    files["marker"] = f"{files.get('archive') or files['h']}{EXPORT_MARKER}"
    return files


# ------------------------------------------------------------------------------ a model export
#: ``contrastkit export --format``: each format's file suffix.
MODEL_FORMATS: Dict[str, str] = {"safetensors": ".safetensors", "onnx": ".onnx", "torchscript": ".pt"}


def refuse_folder_out(out: "str | os.PathLike[str]", example: str) -> None:
    """``ValueError`` when ``--out`` names an existing folder: its files would otherwise be
    written beside it under the folder's name (``DIR.onnx``); ``example`` is a file name the
    message suggests inside it."""
    if os.path.isdir(out):
        raise ValueError(f"--out {os.fspath(out)} is a folder: give a file name such as "
                         f"{os.path.join(os.fspath(out), example)}")


def model_export_files(out: "str | os.PathLike[str]", fmt: str) -> Dict[str, str]:
    """The files ``contrastkit export --format FMT --out OUT`` writes, by role: ``model``
    (``OUT``, given the format's suffix when it has none) and ``marker`` (the input contract,
    ``<model>.contrastkit.json``). ``ValueError`` for an unknown format, an ``OUT`` whose
    suffix is another format's, or one that is a folder (:func:`refuse_folder_out`)."""
    if fmt not in MODEL_FORMATS:
        raise ValueError(f"format must be one of {', '.join(MODEL_FORMATS)}, got {fmt!r}")
    out = os.fspath(out)
    refuse_folder_out(out, f"model{MODEL_FORMATS[fmt]}")
    suffix = os.path.splitext(out)[1].lower()
    other = next((name for name, known in MODEL_FORMATS.items() if known == suffix and name != fmt), None)
    if other is not None:
        raise ValueError(f"{out} has the suffix of the {other} format, not {fmt}'s ({MODEL_FORMATS[fmt]})")
    model = out if suffix == MODEL_FORMATS[fmt] else f"{out}{MODEL_FORMATS[fmt]}"
    return {"model": model, "marker": f"{model}{EXPORT_MARKER}"}


def model_format(out: "str | os.PathLike[str]") -> str:
    """The format whose suffix ``out`` has (``ValueError`` when none has it, or ``out`` is a folder)."""
    refuse_folder_out(out, f"model{MODEL_FORMATS['onnx']}")
    suffix = os.path.splitext(os.fspath(out))[1].lower()
    for name, known in MODEL_FORMATS.items():
        if known == suffix:
            return name
    raise ValueError(f"give --format ({', '.join(MODEL_FORMATS)}): the suffix of {os.fspath(out)} names none of them")


def neighbor_index_files(key: str) -> Tuple[str, str]:
    """The FAISS index named ``key`` (a hex SHA-256) inside a run folder and its description,
    as paths relative to the run folder (how its manifest lists them):
    ``(neighbors/KEY.faiss, neighbors/KEY.json)``."""
    return f"{NEIGHBOR_INDEXES}/{key}.faiss", f"{NEIGHBOR_INDEXES}/{key}.json"


# ------------------------------------------------------------------------------ a shard set
# ``contrastkit shard SOURCE OUT`` (:mod:`contrastkit.data.shard_writer`)::
#
#     OUT/shards.json                  the settings (source, shard size, resize), compared when OUT is written again
#     OUT[/PART]/00000.tar, ...        the shards (one set per part of the source: train, val, test)
#     OUT[/PART]/index.json            every shard with its samples' keys, and the files left out
#     OUT[/PART]/classes.txt           labelled data: line i names class id i
#     OUT/contrastkit-manifest.json    the files above
SHARD_SETTINGS = "shards.json"
SHARD_INDEX = "index.json"
SHARD_CLASSES = "classes.txt"


def shard_name(number: int) -> str:
    """The file name of shard ``number`` of a shard set (img2dataset's: ``00000.tar``)."""
    return f"{number:05d}.tar"


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
TEMPERATURE_METHODS_PLOT = "temperature_methods.png"

# ------------------------------------------------------------------------------ a study over budgets
BUDGETS_SETTINGS = "budgets.json"
BUDGETS_TABLE = "budgets.csv"
VERDICTS_BY_BUDGET = "verdicts_by_budget.json"
#: A budget's study folder is ``<BUDGET_PREFIX><SIZE>x<EPOCHS>``.
BUDGET_PREFIX = "budget-"
#: A study over budgets goes by default in ``runs/<the study's folder><BUDGETS_SUFFIX>`` (``runs/sweep-budgets``).
BUDGETS_SUFFIX = "-budgets"
BUDGETS_ACCURACY_PLOT = "budgets_accuracy_vs_tau.png"
BUDGETS_UNIFORMITY_PLOT = "budgets_uniformity_vs_tau.png"
BUDGETS_TOLERANCE_PLOT = "budgets_tolerance_vs_tau.png"
BEST_TAU_PLOT = "best_tau_vs_budget.png"
#: The cross-budget plots of a sweep over budgets, in display order.
BUDGET_PLOTS: Tuple[str, ...] = (BUDGETS_ACCURACY_PLOT, BUDGETS_UNIFORMITY_PLOT, BUDGETS_TOLERANCE_PLOT, BEST_TAU_PLOT)


def budget_folder(budget: str) -> str:
    """The study folder of one training budget (``SIZExEPOCHS``: ``5000x18``) inside a study over
    budgets: ``budget-5000x18``."""
    return f"{BUDGET_PREFIX}{budget}"


# ------------------------------------------------------------------------------ the baseline cache
#: Environment variable naming the cache root (it wins over ``XDG_CACHE_HOME``).
CACHE_ENV = "CONTRASTKIT_CACHE"
BASELINES = "baselines"


def default_cache_root() -> str:
    """``$CONTRASTKIT_CACHE``, else ``$XDG_CACHE_HOME/contrastkit``, else ``~/.cache/contrastkit``."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "contrastkit")


def baseline_file(root: "str | os.PathLike[str]", key: str) -> str:
    """The file of the baseline named ``key`` (a hex SHA-256) in the cache ``root``."""
    return os.path.join(os.fspath(root), BASELINES, f"{key}.json")


#: ``baseline_cache`` settings: the default root (:func:`~contrastkit.layout.default_cache_root`), or none.
CACHE_AUTO = "auto"
CACHE_OFF = "off"


def check_cache_setting(setting: object) -> str:
    """A ``baseline_cache`` setting as stored: ``"auto"``, ``"off"``, or a folder made absolute
    (the same folder from any working directory); anything else is a ``ValueError``."""
    if not isinstance(setting, str) or not setting:
        raise ValueError(f"baseline_cache must be '{CACHE_AUTO}', '{CACHE_OFF}' or a folder, got {setting!r}")
    return setting if setting in (CACHE_AUTO, CACHE_OFF) else os.path.abspath(setting)


def read_run_record(folder: "str | os.PathLike[str]") -> Dict[str, object]:
    """``folder/config.json`` as the run wrote it (``{"config": {...}, "derived": {...}}``): the
    one reader of that file. A missing file is ``FileNotFoundError``, a file that is not a JSON
    object ``ValueError``, each naming it."""
    from contrastkit._io import read_json

    path = RunFolder(folder).config
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: is {os.fspath(folder)} a `contrastkit pretrain` output?")
    stored = read_json(path)
    if not isinstance(stored, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return stored
