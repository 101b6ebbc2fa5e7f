"""A sweep on an unlabeled image collection judges the label-free claims and says of the others
that they need labels, never a crash."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from contrastkit.cli import main
from contrastkit.studies.verdicts import NEEDS_LABELS


def test_a_sweep_on_unlabeled_images_reports_what_needs_labels(tmp_path, capsys):
    rng = np.random.default_rng(0)
    (tmp_path / "photos").mkdir()
    for i in range(36):
        array = (rng.random((24, 24, 3)) * 255).astype(np.uint8)
        Image.fromarray(array).save(tmp_path / "photos" / f"{i}.png")
    code = main(["sweep", "--data", str(tmp_path / "photos"), "--temperatures", "0.1,0.5", "--seeds", "1",
                 "--epochs", "1", "--batch-size", "8", "--out", str(tmp_path / "sweep"), "--no-progress",
                 "--jobs", "1", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    verdicts = json.loads((tmp_path / "sweep" / "verdicts.json").read_text())
    entries = verdicts if isinstance(verdicts, list) else verdicts.get("verdicts", verdicts)
    statuses = {v["claim"]: v["status"] for v in entries}
    assert statuses["Probe accuracy is reverse-U shaped in tau (the best tau is interior)"] == NEEDS_LABELS
    assert statuses["Smaller tau makes the embedding more uniform (uniformity rises with tau)"] != NEEDS_LABELS
    assert "needs labels" in capsys.readouterr().out
