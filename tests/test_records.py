"""The run records (``contrastkit.records``): summary.json and metrics.jsonl records round-trip
through their dict form with the format version, and a record of an unknown version, or an
unversioned one not of the current form, is refused in one line naming the file."""

from __future__ import annotations

import json

import pytest

from contrastkit import records

SUMMARY = {"probe_accuracy": 0.61, "knn_accuracy": 0.55, "random_init_probe_accuracy": 0.31,
           "raw_pixel_probe_accuracy": 0.42, "epochs": 2, "steps": 8, "method": "simclr", "data": "glyphlab",
           "beats_baselines": True}


def test_a_summary_round_trips_with_its_version():
    written = records.summary_to_dict(SUMMARY)
    assert written[records.VERSION_KEY] == records.FORMAT_VERSION
    assert records.summary_from_dict(json.loads(json.dumps(written)), "x/summary.json") == SUMMARY


def test_a_metrics_record_round_trips_with_its_version():
    record = records.metrics_record(records.STEP, epoch=1, step=3, loss=1.25, tau=0.1)
    line = records.metrics_line(record)
    assert line.endswith("\n") and json.loads(line)[records.VERSION_KEY] == records.FORMAT_VERSION
    assert records.metrics_record_from_dict(json.loads(line), "m.jsonl") == record


def test_an_unknown_kind_is_refused_when_written():
    with pytest.raises(ValueError, match="unknown metrics record kind 'bogus'"):
        records.metrics_record("bogus", step=1)


@pytest.mark.parametrize("version", [records.FORMAT_VERSION + 1, "1", True, None])
def test_an_unknown_version_is_refused_in_one_line_naming_the_file(version):
    for read, data, what in ((records.summary_from_dict, dict(SUMMARY), "a summary"),
                             (records.metrics_record_from_dict, {"kind": "step", "step": 1}, "a metrics record")):
        data[records.VERSION_KEY] = version
        with pytest.raises(ValueError) as err:
            read(data, "run/some.file")
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"run/some.file: {what} of format version {version!r}")


def test_an_unversioned_record_is_read_only_in_the_current_form():
    assert records.summary_from_dict(dict(SUMMARY), "s") == SUMMARY
    assert records.metrics_record_from_dict({"kind": "epoch", "step": 2}, "m") == {"kind": "epoch", "step": 2}
    with pytest.raises(ValueError, match="^s: a summary without a format version and not of the current format"):
        records.summary_from_dict({"accuracy": 0.5}, "s")
    with pytest.raises(ValueError, match="^m: a metrics record without a format version"):
        records.metrics_record_from_dict({"type": "step", "step": 2}, "m")


def test_beats_baselines_judges_the_read_out_against_every_baseline():
    assert records.beats_baselines(SUMMARY) is True
    assert records.beats_baselines({**SUMMARY, "raw_pixel_probe_accuracy": 0.7}) is False
    assert records.beats_baselines({**SUMMARY, "random_init_probe_accuracy": 0.61}) is False  # a tie does not beat
    assert records.beats_baselines({"probe_accuracy": 0.6}) is None  # no baselines
    assert records.beats_baselines(SUMMARY, records.VIEW_RETRIEVAL_TOP1) is None  # labelled: no retrieval


def test_baseline_keys_are_named_by_the_baselines():
    assert [records.baseline_key(records.PROBE_ACCURACY, b) for b in records.ENCODERS] == \
        ["probe_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy"]
    assert records.baseline_numbers(records.RAW_PIXEL, {"knn_accuracy": 0.3}) == {"raw_pixel_knn_accuracy": 0.3}
    assert records.is_baseline_key("random_init_knn_accuracy") and not records.is_baseline_key("knn_accuracy")
    with pytest.raises(ValueError, match="unknown baseline 'imagenet'"):
        records.baseline_key("probe_accuracy", "imagenet")
