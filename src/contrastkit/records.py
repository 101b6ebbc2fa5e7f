"""A run's records, defined once: ``summary.json`` (the final numbers) and the lines of
``metrics.jsonl`` (one record per logged step, epoch, ...), with the format version they carry.

The trainer writes them through :func:`summary_to_dict` / :func:`metrics_line`; the report, the
studies, the CLI tables and the loggers read them through :func:`read_summary` /
:func:`metrics_record_from_dict` and the key names below, never through string literals of
their own.

The format version: every record written carries ``"format_version": FORMAT_VERSION``. A record
of a newer (unknown) version is refused with a one-line ``ValueError`` naming the file and the
version. A record without a version (written by this unreleased package before the version was
recorded) is read as the current format only when it has the current format's shape: a summary
holding the keys the trainer always writes (:data:`SUMMARY_REQUIRED`), a metrics line whose
``kind`` is one of :data:`METRICS_KINDS`; anything else is refused the same way.

Baselines: a summary holds every read-out of the pretrained encoder under its name
(``probe_accuracy``) and of each baseline of :data:`BASELINES` under
:func:`baseline_key` (``random_init_probe_accuracy``, ``raw_pixel_probe_accuracy``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

__all__ = ["FORMAT_VERSION", "VERSION_KEY", "PROBE_ACCURACY", "KNN_ACCURACY", "VIEW_RETRIEVAL_TOP1",
           "ONLINE_PROBE_ACCURACY", "ONLINE_KNN_ACCURACY", "ONLINE_VIEW_RETRIEVAL_TOP1", "ONLINE_KEYS",
           "RANDOM_INIT", "RAW_PIXEL", "BASELINES", "ENCODERS", "baseline_key", "baseline_numbers",
           "is_baseline_key", "beats_baselines", "ENCODER_NAMES", "table_number", "verdict_line", "SUMMARY_REQUIRED", "summary_to_dict", "summary_from_dict",
           "read_summary", "STEP", "EPOCH", "TAU", "SKIPPED", "TAU_HISTOGRAM", "METRICS_KINDS",
           "metrics_record", "metrics_line", "metrics_record_from_dict", "of_kind"]

#: The version of ``summary.json`` and of the ``metrics.jsonl`` records this package writes.
FORMAT_VERSION = 1
#: The key that holds it in each record.
VERSION_KEY = "format_version"

# -- summary.json ---------------------------------------------------------------------------

#: The linear probe's test accuracy on labelled data, which ``beats_baselines`` judges.
PROBE_ACCURACY = "probe_accuracy"
#: The weighted kNN's test accuracy (labelled data).
KNN_ACCURACY = "knn_accuracy"
#: The top-1 view retrieval rate of the label-free read-out, which ``beats_baselines_view_retrieval`` judges.
VIEW_RETRIEVAL_TOP1 = "view_retrieval_top1"
#: The online linear probe's val accuracy at an epoch's end (``--online-probe``; the epoch
#: records, and the last epoch's in the summary).
ONLINE_PROBE_ACCURACY = "online_probe_accuracy"
#: The online kNN monitor's val accuracy at an epoch's end (``--online-probe``).
ONLINE_KNN_ACCURACY = "online_knn_accuracy"
#: The online view retrieval's top-1 rate at an epoch's end (``--online-probe`` on data without
#: labels; ``online_view_retrieval_top5`` beside it).
ONLINE_VIEW_RETRIEVAL_TOP1 = "online_view_retrieval_top1"
#: Every number the online read-out writes into an epoch record, in the order shown.
ONLINE_KEYS = (ONLINE_PROBE_ACCURACY, ONLINE_KNN_ACCURACY, ONLINE_VIEW_RETRIEVAL_TOP1, "online_view_retrieval_top5")

#: The untrained encoder (the run's model at its initialisation), read out like the trained one.
RANDOM_INIT = "random_init"
#: The flattened images, read out like the trained encoder's features.
RAW_PIXEL = "raw_pixel"
#: The baselines every read-out is compared with, in the order tables show them.
BASELINES: Tuple[str, ...] = (RANDOM_INIT, RAW_PIXEL)
#: The pretrained encoder (``None``) and the baselines, in the order tables show them.
ENCODERS: Tuple[Optional[str], ...] = (None,) + BASELINES

#: The keys every summary the trainer writes holds (an unversioned summary must have them).
SUMMARY_REQUIRED = ("epochs", "steps", "method", "data")


def baseline_key(key: str, baseline: Optional[str] = None) -> str:
    """The summary key of the read-out ``key`` of ``baseline`` (one of :data:`BASELINES`;
    ``None``: the pretrained encoder, the key itself)."""
    if baseline is None:
        return key
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}: expected one of {', '.join(BASELINES)}")
    return f"{baseline}_{key}"


def baseline_numbers(baseline: str, numbers: Mapping[str, Any]) -> Dict[str, Any]:
    """``numbers`` (a read-out of one encoder) under ``baseline``'s keys."""
    return {baseline_key(key, baseline): value for key, value in numbers.items()}


def is_baseline_key(key: str) -> bool:
    """Whether the summary key ``key`` is a baseline's read-out."""
    return key.startswith(tuple(f"{baseline}_" for baseline in BASELINES))


def beats_baselines(numbers: Mapping[str, Any], key: str = PROBE_ACCURACY) -> Optional[bool]:
    """Whether the pretrained encoder's read-out ``key`` is above every baseline's; ``None`` when
    ``numbers`` lack it or a baseline's (a run without baselines, or without labels)."""
    values = [numbers.get(baseline_key(key, baseline)) for baseline in ENCODERS]
    if any(value is None for value in values):
        return None
    return bool(all(values[0] > value for value in values[1:]))


#: What a verdict calls each encoder of :data:`ENCODERS`.
ENCODER_NAMES: Dict[Optional[str], str] = {None: "the pretrained encoder", RANDOM_INIT: "the random-init encoder",
                                           RAW_PIXEL: "the raw pixels"}


def table_number(value: Any) -> str:
    """A summary value as the results table prints it: floats to 3 decimals, ``-`` for none."""
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _shown(value: float, other: float) -> str:
    """``value`` at a table's 3 digits, or with more where those would make it equal ``other``."""
    return f"{value:.6g}" if value != other and table_number(value) == table_number(other) else table_number(value)


def verdict_line(summary: Mapping[str, Any], key: str, title: str) -> Optional[Tuple[str, bool]]:
    """Which baselines the pretrained encoder beats on the read-out ``key`` (higher is better, a
    tie is no win), from the summary's numbers, as the results table and the run's report say it:
    ``(line, beats every baseline)``, or ``None`` when there is no pretrained number or no
    baseline's. ``title`` names the read-out (the line starts with it)."""
    own = summary.get(key)
    compared = [(ENCODER_NAMES[baseline], summary[baseline_key(key, baseline)]) for baseline in BASELINES
                if summary.get(baseline_key(key, baseline)) is not None]
    if own is None or not compared:
        return None
    beaten = [f"{name} ({_shown(value, own)})" for name, value in compared if own > value]
    unbeaten = [f"{name} ({_shown(value, own)})" for name, value in compared if not own > value]
    shown = max((_shown(own, value) for _, value in compared), key=len)
    if not unbeaten:
        judged = "beats " + " and ".join(beaten)
    elif beaten:
        judged = "beats " + " and ".join(beaten) + " but not " + " nor ".join(unbeaten)
    elif len(unbeaten) == 1:
        judged = "does not beat " + unbeaten[0]
    else:
        judged = "beats neither " + " nor ".join(unbeaten)
    return f"{title}: the pretrained encoder ({shown}) {judged}", not unbeaten


def _refuse(source: str, what: str, version: Any) -> ValueError:
    return ValueError(f"{source}: {what} of format version {version!r}, which this contrastkit does not know "
                      f"(it reads version {FORMAT_VERSION}); read it with the contrastkit that wrote it")


def _check_version(data: Mapping[str, Any], source: str, what: str, current_shape: bool) -> None:
    if VERSION_KEY not in data:
        if not current_shape:  # neither versioned nor of the current form
            raise ValueError(f"{source}: {what} without a format version and not of the current format; "
                             "it was not written by this contrastkit")
        return
    version = data[VERSION_KEY]
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise _refuse(source, what, version)


def summary_to_dict(summary: Mapping[str, Any]) -> Dict[str, Any]:
    """``summary.json``'s content: the final numbers with the format version."""
    return {**{key: value for key, value in summary.items() if key != VERSION_KEY}, VERSION_KEY: FORMAT_VERSION}


def summary_from_dict(data: Any, source: str = "summary.json") -> Dict[str, Any]:
    """The final numbers of ``summary.json``'s content ``data`` (without the format version); a
    ``ValueError`` naming ``source`` for data that is no summary or of an unknown version."""
    if not isinstance(data, dict):
        raise ValueError(f"{source} must hold a JSON object")
    _check_version(data, source, "a summary", all(key in data for key in SUMMARY_REQUIRED))
    return {key: value for key, value in data.items() if key != VERSION_KEY}


def read_summary(path: str, *, hint: str = "") -> Dict[str, Any]:
    """The final numbers of the ``summary.json`` at ``path`` (:func:`summary_from_dict`);
    ``hint`` ends the message of a file that is not JSON (what to do about it)."""
    from contrastkit._io import read_json

    return summary_from_dict(read_json(path, hint=hint), str(path))


# -- metrics.jsonl --------------------------------------------------------------------------

#: A logged optimizer step (``epoch``, ``step``, ``loss``, ``tau``, ``lr``, ``images_per_second``, batch numbers).
STEP = "step"
#: An epoch's end (``epoch``, ``step``, ``loss``, ``tau``, ``lr``, ``train_seconds``, the val numbers).
EPOCH = "epoch"
#: The temperature of a step whose tau varies (``step``, ``tau``).
TAU = "tau"
#: A step that kept no update (``epoch``, ``step``, and ``loss`` or ``reason``).
SKIPPED = "skipped"
#: The epoch's distribution of the per-anchor temperatures (``epoch``, ``edges``, ``counts``, ...).
TAU_HISTOGRAM = "tau_histogram"
#: Every kind of ``metrics.jsonl`` record.
METRICS_KINDS = (STEP, EPOCH, TAU, SKIPPED, TAU_HISTOGRAM)


def metrics_record(kind: str, **fields: Any) -> Dict[str, Any]:
    """A ``metrics.jsonl`` record of ``kind`` (one of :data:`METRICS_KINDS`) with ``fields``."""
    if kind not in METRICS_KINDS:
        raise ValueError(f"unknown metrics record kind {kind!r}: expected one of {', '.join(METRICS_KINDS)}")
    return {"kind": kind, **fields}


def metrics_line(record: Mapping[str, Any]) -> str:
    """The ``metrics.jsonl`` line (with its newline) of ``record``, with the format version."""
    import json

    return json.dumps({**record, VERSION_KEY: FORMAT_VERSION}) + "\n"


def metrics_record_from_dict(data: Mapping[str, Any], source: str = "metrics.jsonl") -> Dict[str, Any]:
    """The record of a ``metrics.jsonl`` line read as ``data`` (without the format version); a
    ``ValueError`` naming ``source`` for one of an unknown version."""
    _check_version(data, source, "a metrics record", data.get("kind") in METRICS_KINDS)
    return {key: value for key, value in data.items() if key != VERSION_KEY}


def of_kind(records: Iterable[Mapping[str, Any]], *kinds: str) -> list:
    """The records of ``kinds``, in order."""
    return [record for record in records if record.get("kind") in kinds]
