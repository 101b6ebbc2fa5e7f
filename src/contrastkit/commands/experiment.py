"""``contrastkit experiment NAME``: the experiments of the source texts, run end to end.

``positive-pairs`` (SPEC §2, exercise F5) on GlyphLab's three-class orientation task: the
same network, loss and temperature pretrained with positive-pair definition ``A`` (two noise
realisations of the same scene) and ``B`` (the second realisation rotated by 90 degrees),
judged by the same frozen-encoder linear probe (C chosen on val, accuracy on test), next to
the same network at random initialisation (and raw pixels). Labels never form pairs; splits
are by scene. Mean +/- std over seeds, a table, a bar plot and verdicts computed from the
numbers.

Writes ``OUT/results.csv`` (one row per run), ``OUT/verdicts.json``,
``OUT/positive_pairs.png``, ``OUT/experiment.json`` (settings) and ``OUT/runs/<run>/``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Sequence

from contrastkit import layout
from contrastkit.commands._convirt_ablation import ABLATION_DEFAULTS
from contrastkit._io import write_csv, write_json
from contrastkit.commands._study import (
    RunSpec,
    Verdict,
    add_common_arguments,
    format_verdicts,
    gap_verdict,
    mean_std,
    parse_data_options,
    prepare_out,
    run_grid,
)

__all__ = ["add_arguments", "run", "EXPERIMENTS", "run_positive_pairs", "positive_pairs_verdicts",
           "plot_positive_pairs"]

# 6 runs (2 pair definitions x 3 seeds) of 150 epochs x 3 steps at batch 40: about 1 minute
# per run on 2 CPU cores (docs/temperature-study.md).
DEFAULT_EPOCHS = 150
DEFAULT_BATCH = 40
PAIRS = {"A": "A: two noise realisations", "B": "B: second view rotated 90 deg"}
OWNED = (layout.RUNS, layout.EXPERIMENT_TABLE, layout.EXPERIMENT_SETTINGS, layout.VERDICTS, layout.POSITIVE_PAIRS_PLOT)


def add_arguments(parser: Any) -> None:
    parser.add_argument("name", choices=sorted(EXPERIMENTS), help="which experiment to run")
    parser.add_argument("--seeds", type=int, default=None,
                        help="runs per setting, seeds 0..N-1 (default 3; convirt-ablation 1)")
    parser.add_argument("--out", default=None, help="output folder (default runs/experiment-NAME)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="tau of the NT-Xent loss (default: contrastkit pretrain's simclr default)")
    add_common_arguments(parser, epochs_default=DEFAULT_EPOCHS, batch_default=DEFAULT_BATCH)
    # None: the experiment's own default (EXPERIMENT_DEFAULTS), e.g. convirt-ablation's.
    parser.set_defaults(epochs=None, batch_size=None)
    parser.add_argument("--weights", default=None,
                        help="convirt-ablation: lambdas, comma-separated (default 0,0.25,0.5,0.75,1)")
    parser.add_argument("--temperatures", default=None,
                        help="convirt-ablation: taus, comma-separated (default 0.01,0.1,1)")
    parser.add_argument("--text-encoder", choices=("transformer", "mean"), default=None,
                        help="convirt-ablation: text encoder (default mean)")


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    specs = []
    for seed in range(settings["seeds"]):
        for pairs in PAIRS:
            config = dict(data="glyphlab", data_options=settings["data_options"], method="simclr", views=pairs,
                          temperature=settings["temperature"], epochs=settings["epochs"],
                          batch_size=settings["batch_size"], device=settings["device"],
                          threads=settings["threads"], seed=seed)
            # A and B share the random initialisation of their seed: one baseline per seed.
            specs.append(RunSpec(f"pairs{pairs}-seed{seed}", PAIRS[pairs], f"seed {seed}", config,
                                 baselines=(pairs == "A")))
    return specs


def results_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One row per run, plus one ``random init`` and one ``raw pixels`` row per seed."""
    rows = []
    for spec in specs:
        s = spec.summary or {}
        seed = spec.config["seed"]
        rows.append({"setting": f"pairs {spec.config['views']}", "seed": seed,
                     "probe_accuracy": s.get("probe_accuracy"), "knn_accuracy": s.get("knn_accuracy"),
                     "final_loss": s.get("final_loss"), "run": spec.name})
        if "random_init_probe_accuracy" in s:
            for prefix, setting in (("random_init_", "random init"), ("raw_pixel_", "raw pixels")):
                rows.append({"setting": setting, "seed": seed, "probe_accuracy": s[f"{prefix}probe_accuracy"],
                             "knn_accuracy": s[f"{prefix}knn_accuracy"], "final_loss": "", "run": spec.name})
    return rows


def _accuracies(rows: Sequence[Dict[str, Any]], setting: str, key: str = "probe_accuracy") -> List[float]:
    return [float(r[key]) for r in rows if r["setting"] == setting]


def positive_pairs_verdicts(rows: Sequence[Dict[str, Any]]) -> List[Verdict]:
    """SPEC §2 F5's expectation and the sanity check it rests on, judged from the rows."""
    a, b, base = (_accuracies(rows, s) for s in ("pairs A", "pairs B", "random init"))
    verdicts = [gap_verdict("Pair definition B (90-degree rotation) gives a weaker orientation probe than A",
                            a, b, "A", "B")]
    if base:
        verdicts.append(gap_verdict("Pretraining with pairs A beats the same network at random init",
                                    a, base, "A", "random init"))
        verdicts.append(gap_verdict("Pretraining with pairs B beats the same network at random init",
                                    b, base, "B", "random init"))
    return verdicts


def plot_positive_pairs(rows: Sequence[Dict[str, Any]], path: str) -> str:
    """Bar plot of the mean probe accuracy per setting (error bar: std; dots: seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s for s in ("pairs A", "pairs B", "random init", "raw pixels") if _accuracies(rows, s)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, setting in enumerate(settings):
        values = _accuracies(rows, setting)
        mean, std = mean_std(values)
        ax.bar(i, mean, yerr=std, capsize=5, color=f"C{i}", alpha=0.8)
        ax.scatter([i] * len(values), values, color="black", s=12, zorder=3)
        ax.text(i, mean + std + 0.01, f"{mean:.3f}", ha="center", fontsize=9)
    ax.set_xticks(range(len(settings)))
    ax.set_xticklabels(settings)
    ax.set_ylabel("linear-probe test accuracy (3 orientation classes)")
    ax.set_ylim(0, 1.08)
    ax.axhline(1 / 3, color="grey", linestyle=":", label="chance (1/3)")
    ax.set_title("GlyphLab (SPEC F5): pairs A vs B, mean +/- std over seeds", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _table(rows: Sequence[Dict[str, Any]]) -> str:
    header = f"{'setting':<12} {'runs':>4} {'probe accuracy':>17} {'kNN accuracy':>17}  per seed (probe)"
    lines = [header, "-" * len(header)]
    for setting in [s for s in ("pairs A", "pairs B", "random init", "raw pixels") if _accuracies(rows, s)]:
        probe = _accuracies(rows, setting)
        knn = _accuracies(rows, setting, "knn_accuracy")
        (pm, ps), (km, ks) = mean_std(probe), mean_std(knn)
        lines.append(f"{setting:<12} {len(probe):>4} {pm:>8.4f} +/- {ps:.4f} {km:>8.4f} +/- {ks:.4f}  "
                     + " ".join(f"{v:.3f}" for v in probe))
    return "\n".join(lines)


def run_positive_pairs(settings: Dict[str, Any], out: str, *, resume: bool = False, force: bool = False,
                       progress: bool = True) -> Dict[str, Any]:
    """Run SPEC §2 F5 into ``out``; returns ``{"rows", "verdicts", "plot"}``."""
    prepare_out(out, resume=resume, force=force, owned=OWNED, settings=settings, settings_file=layout.EXPERIMENT_SETTINGS,
                command="positive-pairs experiment")
    specs = run_grid(_specs(settings), os.path.join(out, layout.RUNS), title="positive pairs (SPEC F5)",
                     progress=progress, cell=lambda s: f"{s.get('probe_accuracy', float('nan')):.3f}")
    rows = results_rows(specs)
    write_csv(os.path.join(out, layout.EXPERIMENT_TABLE), rows)
    verdicts = positive_pairs_verdicts(rows)
    write_json(os.path.join(out, layout.VERDICTS), [v.to_dict() for v in verdicts])
    plot = plot_positive_pairs(rows, os.path.join(out, layout.POSITIVE_PAIRS_PLOT))
    return {"rows": rows, "verdicts": verdicts, "plot": plot}


def _positive_pairs(args: Any) -> int:
    if args.seeds < 1 or args.epochs < 1 or args.batch_size < 2:
        raise ValueError(f"--seeds and --epochs must be >= 1 and --batch-size >= 2, got {args.seeds}, "
                         f"{args.epochs}, {args.batch_size}")
    from contrastkit.losses import MIN_TEMPERATURE  # imports torch: only when the experiment runs

    if args.temperature is not None and not args.temperature >= MIN_TEMPERATURE:
        raise ValueError(f"--temperature must be >= {MIN_TEMPERATURE}, got {args.temperature}")
    from contrastkit.train import DEFAULT_TEMPERATURE

    settings = {"data_options": parse_data_options(args.data_option), "seeds": args.seeds,
                "temperature": DEFAULT_TEMPERATURE["simclr"] if args.temperature is None else args.temperature,
                "epochs": args.epochs, "batch_size": args.batch_size, "device": args.device, "threads": args.threads}
    out = args.out or os.path.join(layout.DEFAULT_ROOT, f"experiment-{args.name}")
    result = run_positive_pairs(settings, out, resume=args.resume, force=args.force,
                                progress=not args.no_progress)
    print(_table(result["rows"]))
    print()
    print(format_verdicts(result["verdicts"]))
    print()
    print(f"wrote {os.path.join(out, 'results.csv')}, {os.path.join(out, 'verdicts.json')} and {result['plot']}")
    return 0


def _convirt_ablation(args: Any) -> int:
    from contrastkit.commands._convirt_ablation import run_from_args

    return run_from_args(args)


#: name -> (runner, one-line description); new experiments register here.
EXPERIMENTS: Dict[str, tuple] = {
    "positive-pairs": (_positive_pairs, "SPEC §2 F5: pair definition A vs B vs random init on GlyphLab"),
    "convirt-ablation": (_convirt_ablation, "SPEC §3: ConVIRT lambda x tau on glyphlab-text, judged by retrieval"),
}

#: Per-experiment defaults of the shared options (``None`` on the command line).
EXPERIMENT_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "positive-pairs": {"epochs": DEFAULT_EPOCHS, "batch_size": DEFAULT_BATCH, "seeds": 3},
    "convirt-ablation": ABLATION_DEFAULTS,
}


def run(args: Any) -> int:
    for key, value in EXPERIMENT_DEFAULTS.get(args.name, {}).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    runner: Callable[[Any], int] = EXPERIMENTS[args.name][0]
    return runner(args)
