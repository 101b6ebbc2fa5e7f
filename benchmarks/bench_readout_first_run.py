"""The first run's read-out against the run's own training epoch, as a user meets it.

One whole ``contrastkit pretrain`` run (the command line, its default settings, a baseline
cache that starts empty, so both baselines are computed), timed from inside the process:

* the epoch: the run's own training epochs (``train_seconds`` of its summary, and the
  process's CPU seconds over the same epochs);
* the read-out: everything between the last epoch and ``summary.json`` (``eval_seconds``:
  features, probe and kNN of the trained encoder, the random-init encoder and the raw pixels,
  the geometry of the test split, the cache keys), wall and CPU, and by stage;
* every linear-probe fit: its C, evaluations of the objective, seconds and (where the probe
  says) why it stopped.

    PYTHONPATH=src python benchmarks/bench_readout_first_run.py DATA --label after \\
        --json RESULT.json [--epochs 1] [-- EXTRA PRETRAIN OPTIONS]
    python benchmarks/bench_readout_first_run.py --table RESULT.json ... > TABLE.md

The ``contrastkit`` imported is the one on ``PYTHONPATH``: run it once from a checkout of the
code before a change and once after, with the same data, to compare. The ratio is against the
run's own epoch, so a slower or faster machine (or a busier one) moves both sides; ``uptime``
is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any, Dict, List

STAGES = ("extract_features", "pixel_features", "linear_probe", "knn_accuracy", "geometry", "data_digest", "encoder_digest")


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def _instrumented_run(timings_path: str, argv: List[str]) -> int:
    """Run ``contrastkit <argv>`` in this process with timers around its stages; write them to
    ``timings_path``."""
    import torch

    from contrastkit.cli import main
    from contrastkit.methods import two_view
    from contrastkit.metrics import probe as probe_module
    from contrastkit.metrics import readout as readout_module
    from contrastkit.train import baselines as baselines_module
    from contrastkit.train import loop

    record: Dict[str, Any] = {"stages": defaultdict(float), "fits": [], "epochs": [],
                              "threads": torch.get_num_threads()}
    inside_readout = [False]

    def timed(module: Any, name: str, key: str) -> None:
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if key == "train_epoch":
                    record["epochs"].append({"wall": wall, "cpu": cpu})
                elif inside_readout[0]:
                    record["stages"][key] += wall
                    record["stages"][key + "_cpu"] += cpu
        setattr(module, name, wrapper)

    timed(loop, "_train_epoch", "train_epoch")
    for name in ("extract_features", "pixel_features", "linear_probe", "knn_accuracy"):
        timed(readout_module, name, name)
    timed(two_view, "geometry", "geometry")
    for name in ("data_digest", "encoder_digest"):
        timed(baselines_module, name, name)

    summarise = loop._summarise

    def readout(*args: Any, **kwargs: Any) -> Any:
        inside_readout[0] = True
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return summarise(*args, **kwargs)
        finally:
            record["readout"] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
            inside_readout[0] = False
    loop._summarise = readout

    saved = os.environ.get("BENCH_SAVE_FEATURES")
    if saved:  # the read-out's feature sets, for the converged reference (--reference)
        import numpy as np

        probe_call, pixel_call = readout_module.linear_probe, readout_module.pixel_features
        pixel_sets: List[Any] = []  # the raw-pixel baseline's feature arrays, to name its probe

        def recording_pixels(*args: Any, **kwargs: Any) -> Any:
            pixel_sets.append(pixel_call(*args, **kwargs))
            return pixel_sets[-1]

        def saving_probe(*arrays: Any, **kwargs: Any) -> Any:
            result = probe_call(*arrays, **kwargs)
            index = len([name for name in os.listdir(saved) if name.endswith(".npz")])
            np.savez(os.path.join(saved, f"features{index}.npz"),
                     *[a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a) for a in arrays],
                     bounded_test=result.test_accuracy, bounded_c=result.best_c,
                     raw_pixels=any(arrays[0] is pixels for pixels in pixel_sets))
            return result
        readout_module.linear_probe = saving_probe
        readout_module.pixel_features = recording_pixels

    fit = probe_module._MultinomialProbe.fit

    def timed_fit(self: Any, c: float, *args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fit(self, c, *args, **kwargs)
        finally:
            rows = getattr(self, "data", None)  # the rows' shape (older code kept them as self.x)
            n, d = (rows.n, rows.d) if rows is not None else self.x.shape
            record["fits"].append({"n": int(n), "d": int(d), "c": c,
                                   "evaluations": int(getattr(self, "evaluations", -1)),
                                   "stop": getattr(self, "stop", None), "wall": time.perf_counter() - wall,
                                   "cpu": time.process_time() - cpu, "in_readout": inside_readout[0]})
    probe_module._MultinomialProbe.fit = timed_fit

    code = main(argv)
    with open(timings_path, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
    return code


def converged_reference(folder: str) -> List[Dict[str, Any]]:
    """Each saved feature set's probe fitted to convergence: every C of the grid, no evaluation
    cap that binds (20,000), no objective-change stop, the gradient tolerance only; its test
    accuracy next to the bounded read-out's."""
    import numpy as np

    from contrastkit.metrics import probe

    probe.PROBE_RELATIVE_CHANGE = 0.0  # only the gradient tolerance stops a fit
    out = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".npz")):
        with np.load(os.path.join(folder, name)) as saved:
            arrays = [saved[f"arr_{i}"] for i in range(6)]
            bounded, bounded_c = float(saved["bounded_test"]), float(saved["bounded_c"])
            raw_pixels = bool(saved["raw_pixels"]) if "raw_pixels" in saved.files else None
        # 8-bit pixels as the float32 k / 255 the models see: the reference is the float path's
        arrays = [a.astype(np.float32) / 255 if a.dtype == np.uint8 else a for a in arrays]
        wall, cpu = time.perf_counter(), time.process_time()
        result = probe.linear_probe(*arrays, max_evaluations=20000, patience=None)
        out.append({"d": int(arrays[0].shape[1]), "n": int(arrays[0].shape[0]), "raw_pixels": raw_pixels,
                    "bounded_test": bounded,
                    "bounded_c": bounded_c, "converged_test": result.test_accuracy, "converged_c": result.best_c,
                    "difference": bounded - result.test_accuracy, "converged_wall": time.perf_counter() - wall,
                    "converged_cpu": time.process_time() - cpu, "converged_capped": result.capped_c,
                    "converged_evaluations": {str(c): e for c, e in result.evaluations_by_c.items()}})
    return out


def measure(data: str, label: str, epochs: int, extra: List[str], keep: str | None,
            reference: bool = False) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-first-run-") as folder:
        root = keep or folder
        run_dir, cache, timings = (os.path.join(root, name) for name in ("run", "cache", "timings.json"))
        argv = ["pretrain", "--data", data, "--epochs", str(epochs), "--out", run_dir, "--force", "--json",
                "--no-report", "--quiet", *extra]
        env = {**os.environ, "CONTRASTKIT_CACHE": cache}  # an empty cache: the first run on the data
        features = os.path.join(root, "features")
        if reference:
            os.makedirs(features, exist_ok=True)
            env["BENCH_SAVE_FEATURES"] = features
        load_before = _uptime()
        started = time.perf_counter()
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--instrumented", timings, "--", *argv],
                              env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
        load_after = _uptime()
        if done.returncode != 0:
            raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr[-4000:]}")
        with open(timings, encoding="utf-8") as handle:
            record = json.load(handle)
        with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
            summary = json.load(handle)
        converged = converged_reference(features) if reference else []
    epoch_wall = summary["train_seconds"] / summary["epochs"]
    epoch_cpu = sum(e["cpu"] for e in record["epochs"]) / len(record["epochs"])
    numbers = {key: value for key, value in summary.items()
               if key.endswith(("probe_accuracy", "probe_c", "probe_val_accuracy", "knn_accuracy", "probe_capped_c"))}
    return {"label": label, "data": data, "argv": argv, "epochs": summary["epochs"], "steps": summary["steps"],
            "threads": record["threads"], "epoch_wall": epoch_wall, "epoch_cpu": epoch_cpu,
            "readout_wall": record["readout"]["wall"], "readout_cpu": record["readout"]["cpu"],
            "eval_seconds": summary["eval_seconds"], "ratio_wall": record["readout"]["wall"] / epoch_wall,
            "ratio_cpu": record["readout"]["cpu"] / epoch_cpu, "stages": record["stages"], "fits": record["fits"],
            "numbers": numbers, "process_seconds": elapsed, "uptime_before": load_before, "uptime_after": load_after,
            "stderr_tail": done.stderr[-2000:], "converged": converged}


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| data | code | epoch s (wall / CPU) | read-out s (wall / CPU) | read-out / epoch (wall / CPU) "
             "| features | probe | kNN | geometry | cache keys | probe fits (evaluations) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        s = r["stages"]

        def stage(*names: str) -> str:
            return f"{sum(s.get(n, 0) for n in names):.1f} / {sum(s.get(n + '_cpu', 0) for n in names):.1f}"
        fits = [f for f in r["fits"] if f["in_readout"]]
        by_set: Dict[int, List[str]] = defaultdict(list)
        for f in fits:
            by_set[f["d"]].append(f"{f['c']:g}:{f['evaluations']}")
        fit_text = "; ".join(f"d={d} " + " ".join(v) for d, v in by_set.items())
        lines.append(f"| {os.path.basename(r['data'].rstrip('/'))} | {r['label']} | {r['epoch_wall']:.1f} / "
                     f"{r['epoch_cpu']:.1f} | {r['readout_wall']:.1f} / {r['readout_cpu']:.1f} | "
                     f"**{r['ratio_wall']:.2f}** / {r['ratio_cpu']:.2f} | {stage('extract_features', 'pixel_features')} | "
                     f"{stage('linear_probe')} | {stage('knn_accuracy')} | {stage('geometry')} | "
                     f"{s.get('data_digest', 0) + s.get('encoder_digest', 0):.1f} | {fit_text} |")
    checked = [(r, c) for r in results for c in r.get("converged", [])]
    if checked:
        lines += ["", "| data | code | features (n x d) | bounded: test acc (C) | converged: test acc (C) | difference "
                  "| converged fit s (wall) |", "|---|---|---|---:|---:|---:|---:|"]
        for r, c in checked:
            # the trained encoder is read out before the random-init one; which set is the raw
            # pixels is recorded (a record from before that: the widest set, as for the small CNN)
            sets = r["converged"]
            pixels = [i for i, found in enumerate(sets) if found.get("raw_pixels")]
            if all(found.get("raw_pixels") is None for found in sets):
                pixels = [max(range(len(sets)), key=lambda i: sets[i]["d"])]
            encoders = [i for i in range(len(sets)) if i not in pixels]
            index = sets.index(c)
            name = "raw pixels" if index in pixels else ("trained encoder", "random-init encoder")[encoders.index(index)]
            lines.append(f"| {os.path.basename(r['data'].rstrip('/'))} | {r['label']} | {name} ({c['n']} x {c['d']}) | "
                         f"{c['bounded_test']:.4f} ({c['bounded_c']:g}) | {c['converged_test']:.4f} "
                         f"({c['converged_c']:g}) | {c['difference']:+.4f} | {c['converged_wall']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--instrumented":
        raise SystemExit(_instrumented_run(sys.argv[2], sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?", help="--data of the run (a folder, .npz, ...)")
    parser.add_argument("--label", default="", help="a name for the code measured (e.g. before / after)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--json", help="write the measurement to this file")
    parser.add_argument("--keep", help="keep the run folder and cache in this folder")
    parser.add_argument("--reference", action="store_true",
                        help="also fit each read-out feature set's probe to convergence (whole grid, no binding "
                             "cap) and report the test accuracies' differences")
    parser.add_argument("--table", nargs="+", metavar="RESULT", help="print the Markdown table of these results")
    parser.add_argument("extra", nargs="*", help="more pretrain options, after --")
    args = parser.parse_args()
    if args.table:
        results = []
        for path in args.table:
            with open(path, encoding="utf-8") as handle:
                results.append(json.load(handle))
        print(table(results))
        return
    if not args.data:
        parser.error("give DATA (or --table)")
    result = measure(args.data, args.label, args.epochs, args.extra, args.keep, args.reference)
    print(table([result]))
    print("numbers:", json.dumps(result["numbers"], sort_keys=True))
    for r in result["converged"]:
        print(f"converged reference d={r['d']}: test {r['converged_test']:.4f} (C {r['converged_c']:g}) vs bounded "
              f"{r['bounded_test']:.4f} (C {r['bounded_c']:g}): difference {r['difference']:+.4f}; "
              f"{r['converged_wall']:.0f} s")
    print("load:", result["uptime_before"], "->", result["uptime_after"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
