"""The finished runs of a budget a study has not finished yet: each run's selected-epoch read-out
and its z geometry, as the sweep's table would show them, read from the runs' summary.json
(the study prints its own table and verdicts once every run of the budget is in).

    python experiments/cifar10/runs_so_far.py STUDY_FOLDER/budget-45000x20
"""
import json
import os
import sys

folder = os.path.join(sys.argv[1], "runs")
print(f"{'run':<24} {'probe':>7} {'kNN':>7} {'uniformity(z)':>14} {'tolerance(z)':>13} {'train s':>8}")
for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name, "summary.json")
    if not os.path.isfile(path):
        continue
    with open(path, encoding="utf-8") as handle:
        summary = json.load(handle)
    selected = summary.get("selected") or summary
    z = selected.get("representation", {}).get("z", {})
    print(f"{name:<24} {selected['probe_accuracy']:>7.4f} {selected['knn_accuracy']:>7.4f} "
          f"{z.get('uniformity', float('nan')):>14.3f} {z.get('tolerance', float('nan')):>13.3f} "
          f"{summary['train_seconds']:>8.0f}")
