"""``contrastkit sweep``: what the temperature does on real training runs (Wang & Liu, CVPR 2021).

One pretraining run per ``(tau, seed)`` with NT-Xent, plus the two columns of Wang & Liu's
Table 1 (unless ``--no-variants``): the "simple" loss (no temperature: one run per seed) and
NT-Xent with explicit hard-negative mining (per ``(tau, seed)``). Every run is judged by the
same frozen-encoder linear probe; the representation metrics of its held-out test embeddings
(``h`` and ``z``) come from ``summary.json``.

Writes ``OUT/sweep.csv`` (one row per run), ``OUT/verdicts.json``, plots
(``accuracy_vs_tau.png``, ``uniformity_vs_tau.png``, ``tolerance_vs_tau.png``,
``uniformity_tolerance.png``, ``similarity_profile.png``), ``OUT/sweep.json`` (settings) and
``OUT/runs/<run>/`` (each a ``contrastkit pretrain`` output folder), and prints a table and one
verdict per claim, computed from the results.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Dict, List, Optional, Sequence

from contrastkit import layout
from contrastkit._io import write_csv, write_json
from contrastkit.commands._study import (
    FAILS,
    HOLDS,
    UNDECIDED,
    RunSpec,
    Verdict,
    add_common_arguments,
    format_verdicts,
    gap_verdict,
    mean_std,
    parse_data_options,
    prepare_out,
    run_grid,
    spearman,
)

__all__ = ["add_arguments", "run", "run_sweep", "sweep_rows", "sweep_verdicts", "plot_sweep", "LOSSES"]

DEFAULT_TEMPERATURES = (0.05, 0.1, 0.2, 0.5, 1.0)
# 33 runs (5 tau x 3 seeds x 2 losses + 3 simple) in <= 30 minutes on 2 CPU cores on glyphlab:
# about 40 s per run (300 steps of ~0.11 s, one thread, plus evaluation; docs/temperature-study.md).
DEFAULT_EPOCHS = 100
DEFAULT_BATCH = 40
LOSSES = {"nt_xent": "simclr", "hard_negative": "hard_negative", "simple": "simple"}
PLOTS = layout.SWEEP_PLOTS
OWNED = (layout.RUNS, layout.SWEEP_TABLE, layout.SWEEP_SETTINGS, layout.VERDICTS) + PLOTS
METRIC_KEYS = ("alignment", "uniformity", "tolerance", "positive_similarity", "penalty_entropy",
               "penalty_entropy_max", "effective_rank")
TOP_K = 10


def add_arguments(parser: Any) -> None:
    parser.add_argument("--data", default="glyphlab", help="glyphlab, digits or a path (default glyphlab)")
    parser.add_argument("--temperatures", default=",".join(f"{t:g}" for t in DEFAULT_TEMPERATURES),
                        help="comma-separated tau values (default %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="runs per setting, seeds 0..N-1 (default 3)")
    parser.add_argument("--out", default=os.path.join(layout.DEFAULT_ROOT, "sweep"), help="output folder (default runs/sweep)")
    parser.add_argument("--views", default="augment", choices=("augment", "A", "B"),
                        help="positive pairs (A/B need glyphlab; default augment)")
    parser.add_argument("--no-variants", action="store_true",
                        help="NT-Xent only: skip the simple-loss and hard-negative columns")
    add_common_arguments(parser, epochs_default=DEFAULT_EPOCHS, batch_default=DEFAULT_BATCH)


def _temperatures(text: str) -> List[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError("--temperatures is empty")
    from contrastkit.losses import MIN_TEMPERATURE  # imports torch: only when a sweep runs

    bad = [v for v in values if not math.isfinite(v) or v < MIN_TEMPERATURE]
    if bad:
        raise ValueError(f"--temperatures must be finite and >= {MIN_TEMPERATURE}, got {bad}")
    if len(set(values)) != len(values):
        raise ValueError(f"--temperatures has repeated values: {text!r}")
    return sorted(values)


def _positive(value: int, name: str) -> int:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    base = dict(data=settings["data"], data_options=settings["data_options"], views=settings["views"],
                epochs=settings["epochs"], batch_size=settings["batch_size"], device=settings["device"],
                threads=settings["threads"])
    losses = ["nt_xent"] + ([] if settings["no_variants"] else ["hard_negative"])
    specs = []
    for seed in range(settings["seeds"]):  # seed-major: an interrupted sweep still has whole curves
        for loss in losses:
            for tau in settings["temperatures"]:
                specs.append(RunSpec(f"{loss}-tau{tau:g}-seed{seed}", loss, f"tau {tau:g}",
                                     {**base, "method": LOSSES[loss], "temperature": tau, "seed": seed},
                                     baselines=(loss == "nt_xent" and tau == settings["temperatures"][0])))
        if not settings["no_variants"]:
            specs.append(RunSpec(f"simple-seed{seed}", "simple", "no tau",
                                 {**base, "method": "simple", "seed": seed}))
    return specs


def sweep_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One flat row per finished run: settings, accuracies and the test-set metrics of
    ``z`` and ``h`` (``z_top_negative_1..10`` is the profile)."""
    rows = []
    for spec in specs:
        s = spec.summary or {}
        row: Dict[str, Any] = {
            "loss": spec.row, "method": spec.config["method"],
            "tau": spec.config.get("temperature", "") if spec.row != "simple" else "",
            "seed": spec.config["seed"], "probe_accuracy": s.get("probe_accuracy"),
            "knn_accuracy": s.get("knn_accuracy"), "final_loss": s.get("final_loss"),
            "random_init_probe_accuracy": s.get("random_init_probe_accuracy", ""),
            "raw_pixel_probe_accuracy": s.get("raw_pixel_probe_accuracy", ""),
            "train_seconds": s.get("train_seconds"), "run": spec.name,
        }
        geometry = s.get("representation", {})
        for space in ("z", "h"):
            metrics = geometry.get(space, {})
            for key in METRIC_KEYS:
                row[f"{space}_{key}"] = metrics.get(key, "")
            profile = metrics.get("top_negative_similarity", [])
            for k in range(TOP_K):
                row[f"{space}_top_negative_{k + 1}"] = profile[k] if k < len(profile) else ""
        rows.append(row)
    return rows


def _number(value: Any) -> Optional[float]:
    if value is None or value == "":
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _by_tau(rows: Sequence[Dict[str, Any]], loss: str, key: str) -> Dict[float, List[float]]:
    """``{tau: [value per seed]}`` for one loss (values that are missing are left out)."""
    out: Dict[float, List[float]] = {}
    for row in rows:
        if row["loss"] == loss and _number(row.get(key)) is not None:
            out.setdefault(float(row["tau"]), []).append(float(row[key]))
    return dict(sorted(out.items()))


def _fmt_curve(curve: Dict[float, List[float]]) -> str:
    return ", ".join(f"tau {t:g}: {mean_std(v)[0]:.4f}" for t, v in curve.items())


def _trend_verdict(claim: str, curve: Dict[float, List[float]], what: str, expected_sign: int) -> Verdict:
    taus = list(curve)
    means = [mean_std(v)[0] for v in curve.values()]
    rho = spearman(taus, means) if len(taus) >= 3 else math.nan
    rule = ("holds if Spearman's rank correlation between tau and the mean "
            f"{what} over seeds is {'>= +0.8' if expected_sign > 0 else '<= -0.8'}; does not hold if it has the "
            "other sign or is 0; inconclusive otherwise (needs >= 3 temperatures)")
    if math.isnan(rho):
        status = UNDECIDED
    elif rho * expected_sign >= 0.8:
        status = HOLDS
    elif rho * expected_sign <= 0:
        status = FAILS
    else:
        status = UNDECIDED
    return Verdict(claim, status, f"{what}: {_fmt_curve(curve)}; Spearman rho = {rho:+.2f}", rule)


def _dilemma_verdict(rows: Sequence[Dict[str, Any]]) -> Verdict:
    """Across all runs, a more uniform ``z`` goes with a less tolerant one."""
    points = [(float(r["z_uniformity"]), float(r["z_tolerance"])) for r in rows
              if _number(r.get("z_uniformity")) is not None and _number(r.get("z_tolerance")) is not None]
    rho = spearman([u for u, _ in points], [t for _, t in points]) if len(points) >= 3 else math.nan
    if math.isnan(rho):
        status = UNDECIDED
    elif rho >= 0.8:
        status = HOLDS
    elif rho <= 0:
        status = FAILS
    else:
        status = UNDECIDED
    return Verdict("Uniformity and tolerance trade off (a more uniform z is a less tolerant one)", status,
                   f"Spearman rho(uniformity, tolerance) over {len(points)} runs of every loss = {rho:+.2f}",
                   "holds if rho >= +0.8 (uniformity falls, i.e. improves, together with tolerance); does not "
                   "hold if rho <= 0; inconclusive otherwise (needs >= 3 runs)")


def sweep_verdicts(rows: Sequence[Dict[str, Any]]) -> List[Verdict]:
    """The claims of SPEC §4 (Wang & Liu), each judged from the sweep's rows by a stated rule.

    Uniformity and tolerance are read on ``z``, the embedding the loss acts on.
    """
    verdicts = []
    accuracy = _by_tau(rows, "nt_xent", "probe_accuracy")
    taus = list(accuracy)
    means = {t: mean_std(v)[0] for t, v in accuracy.items()}
    stds = {t: mean_std(v)[1] for t, v in accuracy.items()}
    rule = ("holds if the tau with the best mean probe accuracy is neither the smallest nor the largest "
            "tried and both ends are below it by more than the largest standard deviation over seeds (needs >= 2 "
            "seeds); does not hold "
            "if the best tau is at an end; inconclusive otherwise (needs >= 3 temperatures)")
    claim = "Probe accuracy is reverse-U shaped in tau (the best tau is interior)"
    if len(taus) < 3:
        verdicts.append(Verdict(claim, UNDECIDED, f"only {len(taus)} temperature(s)", rule))
    else:
        best = max(taus, key=lambda t: means[t])
        noise = max(stds.values())
        drops = (means[best] - means[taus[0]], means[best] - means[taus[-1]])
        seeds = min(len(v) for v in accuracy.values())
        if best in (taus[0], taus[-1]):
            status = FAILS
        elif seeds >= 2 and min(drops) > noise:
            status = HOLDS
        else:
            status = UNDECIDED
        evidence = (f"probe accuracy: {_fmt_curve(accuracy)}; best tau {best:g}; drop to the ends "
                    f"{drops[0]:+.4f} / {drops[1]:+.4f} vs largest std {noise:.4f}")
        verdicts.append(Verdict(claim, status, evidence, rule))
    verdicts.append(_trend_verdict("Smaller tau makes the embedding more uniform (uniformity rises with tau)",
                                   _by_tau(rows, "nt_xent", "z_uniformity"), "uniformity of z (lower = more uniform)",
                                   +1))
    verdicts.append(_trend_verdict("Larger tau makes the embedding more tolerant (tolerance rises with tau)",
                                   _by_tau(rows, "nt_xent", "z_tolerance"), "tolerance of z", +1))
    verdicts.append(_dilemma_verdict(rows))
    simple = [float(r["probe_accuracy"]) for r in rows if r["loss"] == "simple"]
    if simple and taus:
        best = max(taus, key=lambda t: means[t])
        verdicts.append(gap_verdict("The simple loss trains worse than the best NT-Xent",
                                    accuracy[best], simple, f"NT-Xent (tau {best:g})", "simple loss"))
    hard = _by_tau(rows, "hard_negative", "probe_accuracy")
    if hard and len(taus) >= 2:
        hard_means = [mean_std(v)[0] for v in hard.values()]
        spread_nt = max(means.values()) - min(means.values())
        spread_hn = max(hard_means) - min(hard_means)
        noise = statistics.fmean([mean_std(v)[1] for v in list(accuracy.values()) + list(hard.values())])
        difference = spread_nt - spread_hn
        seeds = min(len(v) for v in list(accuracy.values()) + list(hard.values()))
        if spread_hn >= spread_nt:
            status = FAILS
        elif seeds >= 2 and difference > noise:
            status = HOLDS
        else:
            status = UNDECIDED
        evidence = (f"spread of mean probe accuracy over tau: NT-Xent {spread_nt:.4f}, hard-negative "
                    f"{spread_hn:.4f} (difference {difference:+.4f} vs mean seed std {noise:.4f}); "
                    f"hard-negative {_fmt_curve(hard)}")
        rule = ("spread = max - min over tau of the mean accuracy; holds if the hard-negative spread is "
                "smaller by more than the mean standard deviation over seeds (needs >= 2 seeds); does not hold if "
                "it is not smaller; inconclusive otherwise")
        verdicts.append(Verdict("Hard-negative mining makes accuracy less sensitive to tau", status, evidence, rule))
    return verdicts


# ------------------------------------------------------------------------------ plots

def plot_sweep(rows: Sequence[Dict[str, Any]], out: str) -> List[str]:
    """The five figures of the sweep as PNGs in ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    styles = {"nt_xent": ("NT-Xent", "C0", "o"), "hard_negative": ("hard-negative NT-Xent", "C1", "s")}

    def curve_plot(filename: str, key_of, ylabel: str, title: str, spaces=("z",)) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for loss, (label, colour, marker) in styles.items():
            for space in spaces:
                curve = _by_tau(rows, loss, key_of(space))
                if not curve:
                    continue
                stats = [mean_std(v) for v in curve.values()]
                ax.errorbar(list(curve), [m for m, _ in stats], yerr=[s for _, s in stats], color=colour,
                            marker=marker, capsize=3, linestyle="-" if space == "z" else "--",
                            label=label + (f" ({space})" if len(spaces) > 1 else ""))
        if filename == PLOTS[0]:
            simple = [float(r["probe_accuracy"]) for r in rows if r["loss"] == "simple"]
            if simple:
                m, s = mean_std(simple)
                ax.axhline(m, color="C3", linestyle=":", label=f"simple loss ({m:.3f})")
                ax.axhspan(m - s, m + s, color="C3", alpha=0.1)
            baseline = [float(r["random_init_probe_accuracy"]) for r in rows
                        if _number(r.get("random_init_probe_accuracy")) is not None]
            if baseline:
                ax.axhline(mean_std(baseline)[0], color="grey", linestyle="-.", label="random init")
        ax.set_xscale("log")
        ax.set_xlabel("temperature tau (log scale)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, filename)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    curve_plot(PLOTS[0], lambda s: "probe_accuracy", "linear-probe test accuracy",
               "Probe accuracy vs tau (mean +/- std over seeds)")
    curve_plot(PLOTS[1], lambda s: f"{s}_uniformity", "uniformity (lower = more uniform)",
               "Uniformity vs tau (test set)", spaces=("z", "h"))
    curve_plot(PLOTS[2], lambda s: f"{s}_tolerance", "tolerance (mean same-class cosine)",
               "Tolerance vs tau (test set)", spaces=("z", "h"))

    fig, ax = plt.subplots(figsize=(6, 4.5))
    taus = sorted({float(r["tau"]) for r in rows if r["loss"] != "simple" and r["tau"] != ""})
    cmap = plt.get_cmap("viridis")
    for loss, (label, _, marker) in {**styles, "simple": ("simple loss", "C3", "^")}.items():
        pts = [r for r in rows if r["loss"] == loss and _number(r.get("z_uniformity")) is not None
               and _number(r.get("z_tolerance")) is not None]
        if not pts:
            continue
        colours = ["C3" if loss == "simple" else cmap(taus.index(float(r["tau"])) / max(1, len(taus) - 1))
                   for r in pts]
        ax.scatter([float(r["z_uniformity"]) for r in pts], [float(r["z_tolerance"]) for r in pts],
                   c=colours, marker=marker, label=label, edgecolors="black", linewidths=0.4)
    for i, t in enumerate(taus):
        ax.scatter([], [], color=cmap(i / max(1, len(taus) - 1)), label=f"tau {t:g}")
    ax.set_xlabel("uniformity of z (lower = more uniform)")
    ax.set_ylabel("tolerance of z")
    ax.set_title("Uniformity-tolerance dilemma (one point per run)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = os.path.join(out, PLOTS[3])
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(6, 4))
    ranks = list(range(1, TOP_K + 1))
    for i, t in enumerate(taus):
        group = [r for r in rows if r["loss"] == "nt_xent" and r["tau"] != "" and float(r["tau"]) == t]
        profiles = [[float(r[f"z_top_negative_{k}"]) for k in ranks] for r in group
                    if all(_number(r.get(f"z_top_negative_{k}")) is not None for k in ranks)]
        positives = [float(r["z_positive_similarity"]) for r in group
                     if _number(r.get("z_positive_similarity")) is not None]
        if not profiles or not positives:
            continue
        colour = cmap(i / max(1, len(taus) - 1))
        mean_profile = [sum(p[k] for p in profiles) / len(profiles) for k in range(TOP_K)]
        ax.plot(ranks, mean_profile, color=colour, marker="o", markersize=3, label=f"tau {t:g}")
        ax.scatter([0], [mean_std(positives)[0]], color=colour, marker="*", s=120, edgecolors="black",
                   linewidths=0.4)
    ax.set_xticks([0] + ranks)
    ax.set_xticklabels(["pos"] + [str(r) for r in ranks])
    ax.set_xlabel("positive (star) and k-th most similar negative")
    ax.set_ylabel("cosine similarity of z (test set)")
    ax.set_title("Positive vs the 10 nearest negatives, NT-Xent")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, PLOTS[4])
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written


# ------------------------------------------------------------------------------ command

def _table(rows: Sequence[Dict[str, Any]]) -> str:
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["loss"], row["tau"]), []).append(row)
    header = (f"{'loss':<14} {'tau':>5} {'runs':>4} {'probe acc':>17} {'kNN acc':>7} {'unif(z)':>8} "
              f"{'tol(z)':>7} {'pos(z)':>7} {'neg1(z)':>7} {'H_pen(z)':>8} {'erank(h)':>8}")
    lines = [header, "-" * len(header)]

    def m(group, key):
        values = [float(r[key]) for r in group if _number(r.get(key)) is not None]
        return mean_std(values)[0] if values else math.nan

    for (loss, tau), group in groups.items():
        acc_mean, acc_std = mean_std([float(r["probe_accuracy"]) for r in group])
        lines.append(f"{loss:<14} {str(tau if tau != '' else '-'):>5} {len(group):>4} "
                     f"{acc_mean:>8.4f} +/- {acc_std:.4f} {m(group, 'knn_accuracy'):>7.4f} "
                     f"{m(group, 'z_uniformity'):>8.4f} {m(group, 'z_tolerance'):>7.4f} "
                     f"{m(group, 'z_positive_similarity'):>7.4f} {m(group, 'z_top_negative_1'):>7.4f} "
                     f"{m(group, 'z_penalty_entropy'):>8.4f} {m(group, 'h_effective_rank'):>8.2f}")
    baseline = [float(r["random_init_probe_accuracy"]) for r in rows
                if _number(r.get("random_init_probe_accuracy")) is not None]
    pixels = [float(r["raw_pixel_probe_accuracy"]) for r in rows
              if _number(r.get("raw_pixel_probe_accuracy")) is not None]
    if baseline:
        lines.append(f"baselines: random-init encoder {mean_std(baseline)[0]:.4f} +/- {mean_std(baseline)[1]:.4f}, "
                     f"raw pixels {mean_std(pixels)[0]:.4f} +/- {mean_std(pixels)[1]:.4f}")
    return "\n".join(lines)


def run_sweep(settings: Dict[str, Any], out: str, *, resume: bool = False, force: bool = False,
              progress: bool = True) -> Dict[str, Any]:
    """Run the sweep described by ``settings`` into ``out`` (see :func:`add_arguments` for the
    keys: data, data_options, temperatures, seeds, views, epochs, batch_size, device,
    no_variants). Returns ``{"rows", "verdicts", "plots"}``."""
    prepare_out(out, resume=resume, force=force, owned=OWNED, settings=settings, settings_file=layout.SWEEP_SETTINGS,
                command="sweep")
    specs = run_grid(_specs(settings), os.path.join(out, layout.RUNS), title="temperature sweep", progress=progress,
                     cell=lambda s: f"{s.get('probe_accuracy', float('nan')):.3f}")
    rows = sweep_rows(specs)
    write_csv(os.path.join(out, layout.SWEEP_TABLE), rows)
    verdicts = sweep_verdicts(rows)
    write_json(os.path.join(out, layout.VERDICTS), [v.to_dict() for v in verdicts])
    plots = plot_sweep(rows, out)
    return {"rows": rows, "verdicts": verdicts, "plots": plots}


def run(args: Any) -> int:
    settings = {
        "data": args.data, "data_options": parse_data_options(args.data_option),
        "temperatures": _temperatures(args.temperatures), "seeds": _positive(args.seeds, "--seeds"),
        "views": args.views, "epochs": _positive(args.epochs, "--epochs"),
        "batch_size": _positive(args.batch_size, "--batch-size"), "device": args.device,
        "threads": args.threads,
        "no_variants": bool(args.no_variants),
    }
    result = run_sweep(settings, args.out, resume=args.resume, force=args.force, progress=not args.no_progress)
    print(_table(result["rows"]))
    print()
    print(format_verdicts(result["verdicts"]))
    print()
    print(f"wrote {os.path.join(args.out, 'sweep.csv')}, {os.path.join(args.out, 'verdicts.json')} and "
          f"{len(result['plots'])} plots in {args.out}")
    return 0
