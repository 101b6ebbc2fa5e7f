"""Temperature methods as claims: each against the best fixed tau of a sweep, same budget and read-out.

Four methods that let the temperature differ per batch, per term or per sample
(:mod:`contrastkit.losses.adaptive`), each in the paper's words a better representation than
a fixed tau:

* MACL (Huang et al., ICML 2023): ``macl``;
* dual temperature (Zhang et al., CVPR 2022): ``dual``;
* iSogCLR's individual temperatures (Qiu et al., ICML 2023): ``individual``;
* TempNet (Qiu et al., ICML 2024): ``network``.

Each seed trains SimCLR's NT-Xent at every fixed tau of a sweep (``temperatures``) and once with
each method (``--temperature-method FORM``), all with the same data, epochs, batch, seed and
read-out (the textbook, section 30.2, exercise F5: with ``eval_every`` the val probe picks the
epoch, the test probe of that epoch is compared). The best fixed tau is the one with the
highest mean *val* probe accuracy over the seeds (its test accuracy when no run read the val
probe: then the baseline's choice has seen the test split, which favours it). A method is
compared with that tau *within* each seed; the rule is the schedules study's
(:func:`~contrastkit.studies.verdicts.paired_seed_verdict`).

The folder: ``results.csv`` (one row per run), ``verdicts.json``, ``temperature_methods.png``,
``experiment.json`` (settings) and ``runs/<run>/``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from contrastkit import layout
from contrastkit.losses import MIN_TEMPERATURE
from contrastkit.records import KNN_ACCURACY, PROBE_ACCURACY, VIEW_RETRIEVAL_TOP1

from .grid import RunSpec
from .plots import plot_temperature_methods
from .rows import baselines_line, headline, schedule_columns, values
from .stats import finite, mean_std
from .study import RUN_DEFAULTS, Study, check_counts, check_numbers, run_config
from .sweep import DEFAULT_TEMPERATURES
from .verdicts import PAIRED_SEED_RULE, UNDECIDED, Verdict, needs_labels_verdict, paired_seed_verdict

__all__ = ["TEMPERATURE_METHODS", "default_methods", "methods_rows", "methods_verdicts", "methods_table",
           "best_fixed_temperature"]

def default_methods() -> List[str]:
    """Every registered temperature method, with its defaults (``--temperature-method``
    forms; :mod:`contrastkit.temperature_methods`)."""
    from contrastkit.temperature_methods import temperature_method_names

    return list(temperature_method_names())


#: The row of the fixed-tau runs.
FIXED = "fixed"

DEFAULTS: Dict[str, Any] = {"data": "glyphlab", "data_options": {}, "seeds": 3,
                            "temperatures": list(DEFAULT_TEMPERATURES), "methods": None,
                            "epochs": 100, "batch_size": 40, "device": "auto", "threads": None, **RUN_DEFAULTS}



def _check(settings: Dict[str, Any]) -> Dict[str, Any]:
    from contrastkit.temperature_methods import parse_temperature_method

    check_counts(settings)
    if settings["methods"] is None:  # every registered method, as registered when the study runs
        settings["methods"] = default_methods()
    settings["temperatures"] = check_numbers(settings["temperatures"], "temperatures", MIN_TEMPERATURE)
    methods = settings["methods"]
    if isinstance(methods, str) or not isinstance(methods, (list, tuple)) or not methods:
        raise ValueError(f"--method must give at least one temperature method, got {methods!r}")
    kinds = []
    for text in methods:
        try:
            kinds.append(parse_temperature_method(str(text)).kind)
        except (TypeError, ValueError) as err:
            raise ValueError(f"--method {text!r} is not a temperature method: {err}") from None
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"--method names a method twice: {list(methods)}")
    settings["methods"] = [str(text) for text in methods]
    return settings


def _kind(form: str) -> str:
    return form.partition(":")[0].strip().lower()


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    specs = []
    for seed in range(settings["seeds"]):
        for k, tau in enumerate(settings["temperatures"]):
            config = run_config(settings, data=settings["data"], method="simclr", temperature=tau, seed=seed)
            specs.append(RunSpec(f"fixed-tau{tau:g}-seed{seed}", FIXED, f"tau {tau:g}, seed {seed}", config,
                                 baselines=k == 0))
        for form in settings["methods"]:
            config = run_config(settings, data=settings["data"], method="simclr", temperature_method=form,
                                seed=seed)
            specs.append(RunSpec(f"{_kind(form)}-seed{seed}", _kind(form), f"seed {seed}", config))
    return specs


def _val_accuracy(summary: Dict[str, Any]) -> Optional[float]:
    """The val probe accuracy of the selected epoch (the best score of the run's selection), or
    without a selection (``--eval-every 0``) the last epoch's (``probe_val_accuracy``)."""
    selection = summary.get("selection")
    if isinstance(selection, dict) and selection.get("scores"):
        return max(float(s) for s in selection["scores"])
    return finite(summary.get("probe_val_accuracy"))


def methods_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One row per run: ``fixed`` (with its tau) or the method, its form, the seed, the read-out of
    the selected and the last epoch, the selected epoch's val probe, the tau it ended at."""
    rows = []
    for spec in specs:
        s = spec.summary or {}
        tau = (f"{spec.config['temperature']:g}" if spec.row == FIXED else spec.config["temperature_method"])
        columns = schedule_columns(s, spec.name)
        rows.append({"method": spec.row, "tau": tau, "seed": spec.config["seed"],
                     **{key: columns.pop(key) for key in (PROBE_ACCURACY, KNN_ACCURACY, "epoch",
                                                          "last_probe_accuracy")},
                     "val_probe_accuracy": _val_accuracy(s), **columns})
    return rows


def best_fixed_temperature(rows: Sequence[Dict[str, Any]]) -> Tuple[Optional[str], str]:
    """The fixed tau with the highest mean val probe accuracy over seeds (test accuracy when a
    fixed run has no val score), and which of the two chose it (``"val"`` or ``"test"``)."""
    # Runs without a read-out (failed, unfinished) have no say in the choice.
    fixed = [row for row in rows if row["method"] == FIXED and finite(row.get(PROBE_ACCURACY)) is not None]
    by_val = all(finite(row.get("val_probe_accuracy")) is not None for row in fixed)
    key = "val_probe_accuracy" if by_val else PROBE_ACCURACY
    means = {}
    for tau in dict.fromkeys(row["tau"] for row in fixed):
        scores = values(fixed, key, tau=tau)
        if scores:
            means[tau] = mean_std(scores)[0]
    if not means:
        return None, "val" if by_val else "test"
    return max(means, key=lambda tau: (means[tau], -float(tau))), "val" if by_val else "test"


def _by_seed(rows: Sequence[Dict[str, Any]], **match: Any) -> Dict[int, float]:
    return {int(row["seed"]): value for row in rows if all(row.get(k) == v for k, v in match.items())
            for value in values([row], PROBE_ACCURACY)}


def methods_verdicts(rows: Sequence[Dict[str, Any]]) -> List[Verdict]:
    """Each method against the best fixed tau of the sweep, per seed."""
    best, chosen_by = best_fixed_temperature(rows)
    verdicts = []
    for method in [m for m in dict.fromkeys(row["method"] for row in rows) if m != FIXED]:
        claim = _claim(method)
        form = next(str(row["tau"]) for row in rows if row["method"] == method)
        if not values(rows, PROBE_ACCURACY):
            verdicts.append(_needs_labels(rows, claim, method))
            continue
        rule = (PAIRED_SEED_RULE.format(other="method", baseline="the best fixed tau")
                + f"; the best fixed tau is the one with the highest mean {chosen_by} probe accuracy over seeds"
                + (" (no val probe was read: chosen on the test split, which favours the fixed tau)"
                   if chosen_by == "test" else ""))
        if best is None:
            verdicts.append(Verdict(claim, UNDECIDED, "no fixed-tau run has a probe accuracy", rule))
            continue
        verdicts.append(paired_seed_verdict(
            claim, _by_seed(rows, method=FIXED, tau=best), _by_seed(rows, method=method),
            compared=f"{form} minus the best fixed tau {best} (chosen on {chosen_by}), probe accuracy of the "
                     "selected epoch", rule=rule))
    return verdicts


def _claim(method: str) -> str:
    """The method's claim, from its record (a method no longer registered: a plain one)."""
    from contrastkit.temperature_methods import TEMPERATURE_METHOD_REGISTRY

    spec = TEMPERATURE_METHOD_REGISTRY.get(method)
    return spec.claim if spec is not None else f"{method} beats the best fixed tau"


def _needs_labels(rows: Sequence[Dict[str, Any]], claim: str, method: str) -> Verdict:
    """On data without labels the claim (probe accuracy) is not judged."""
    return needs_labels_verdict(claim, {name: values(rows, VIEW_RETRIEVAL_TOP1, method=name)
                                        for name in (FIXED, method)}, "methods")


def _label_free_table(rows: Sequence[Dict[str, Any]]) -> str:
    header = f"{'run':<12} {'tau':<26} {'runs':>4} {'view retrieval top-1 (held out)':>32}"
    lines = [header, "-" * len(header)]
    for method, tau in dict.fromkeys((row["method"], row["tau"]) for row in rows):
        mean, std = mean_std(values(rows, VIEW_RETRIEVAL_TOP1, method=method, tau=tau))
        lines.append(f"{method:<12} {str(tau):<26} {len(values(rows, 'seed', method=method, tau=tau)):>4} "
                     f"{mean:>23.4f} +/- {std:.4f}")
    lines.append("no labels: probe accuracy and the verdicts need labelled data")
    return "\n".join(lines)


def methods_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Mean +/- std over seeds of the selected and last epochs' probe accuracy for each fixed tau
    and each method, the best fixed tau marked."""
    if not values(rows, PROBE_ACCURACY):
        return _label_free_table(rows)
    best, chosen_by = best_fixed_temperature(rows)
    header = (f"{'run':<12} {'tau':<26} {'runs':>4} {'probe acc (selected)':>22} {'probe acc (last)':>18} "
              f"{'val':>7} {'epoch':>6}")
    lines = [header, "-" * len(header)]
    groups = list(dict.fromkeys((row["method"], row["tau"]) for row in rows))
    for method, tau in groups:
        group = [row for row in rows if row["method"] == method and row["tau"] == tau]
        selected, last = mean_std(values(group, PROBE_ACCURACY)), mean_std(values(group, "last_probe_accuracy"))
        val = values(group, "val_probe_accuracy")
        mark = " *" if method == FIXED and tau == best else ""
        lines.append(f"{method + mark:<12} {str(tau):<26} {len(group):>4} {selected[0]:>13.4f} +/- "
                     f"{selected[1]:.4f} {last[0]:>9.4f} +/- {last[1]:.4f} "
                     f"{(mean_std(val)[0] if val else float('nan')):>7.4f} {mean_std(values(group, 'epoch'))[0]:>6.1f}")
    if best is not None:
        lines.append(f"* the best fixed tau ({best}, by the mean {chosen_by} probe accuracy): the methods' baseline")
    return "\n".join(lines + baselines_line(rows))


#: Each temperature method against the best fixed tau (``contrastkit experiment temperature-methods``).
TEMPERATURE_METHODS = Study(
    name="temperature-methods",
    description="each registered temperature method (MACL, dual temperature, iSogCLR, TempNet, ...) against the "
                "best fixed tau of a sweep, same budget and read-out",
    label="temperature-methods experiment", title="temperature methods", folder="experiment-temperature-methods",
    settings_file=layout.EXPERIMENT_SETTINGS, table_file=layout.EXPERIMENT_TABLE,
    plot_files=(layout.TEMPERATURE_METHODS_PLOT,), defaults=DEFAULTS, check=_check, specs=_specs,
    rows=methods_rows, verdicts=methods_verdicts, table=methods_table, plot=plot_temperature_methods,
    cell=lambda s: headline(s.get("selected", s)),
)
