"""Verdict rules and statistics of the study commands, on synthetic result rows (no training).

Each case builds rows whose answer is known by construction, so the verdict logic is checked
independently of any training run.
"""

import math

import pytest

from contrastkit.commands.common import parse_data_options
from contrastkit.studies import FAILS, HOLDS, UNDECIDED, mean_std, spearman
from contrastkit.studies.positive_pairs import positive_pairs_verdicts
from contrastkit.studies.sweep import sweep_verdicts


def sweep_rows(accuracy, uniformity=None, tolerance=None, hard=None, simple=None):
    """``accuracy``: {tau: [acc per seed]}; the other curves likewise."""
    rows = []
    for tau, values in accuracy.items():
        for seed, acc in enumerate(values):
            rows.append({"loss": "nt_xent", "tau": tau, "seed": seed, "probe_accuracy": acc,
                         "z_uniformity": (uniformity or {}).get(tau, [""] * len(values))[seed],
                         "z_tolerance": (tolerance or {}).get(tau, [""] * len(values))[seed]})
    for tau, values in (hard or {}).items():
        for seed, acc in enumerate(values):
            rows.append({"loss": "hard_negative", "tau": tau, "seed": seed, "probe_accuracy": acc})
    for seed, acc in enumerate(simple or []):
        rows.append({"loss": "simple", "tau": "", "seed": seed, "probe_accuracy": acc})
    return rows


def by_claim(verdicts):
    return {v.claim.split(" (")[0]: v for v in verdicts}


TAUS = (0.05, 0.1, 0.2, 0.5, 1.0)


def test_spearman_hand_cases():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ranks (0,1,2) vs (0,2,1): d^2 = 0 + 1 + 1 -> 1 - 6*2/(3*8) = 0.5
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    # ties share ranks: y ranks (0.5, 0.5, 2): Pearson of (0,1,2) and (0.5,0.5,2) = sqrt(3)/2
    assert spearman([1, 2, 3], [5, 5, 7]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(spearman([1, 2, 3], [4, 4, 4]))


def test_mean_std_sample_deviation():
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert mean_std([0.5]) == (0.5, 0.0)


def test_parse_data_options():
    assert parse_data_options(["train_scenes=24", "noise=0.3", "clutter=[2,5]", "name=x"]) == {
        "train_scenes": 24, "noise": 0.3, "clutter": [2, 5], "name": "x"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_data_options(["train_scenes"])


def test_sweep_verdicts_hold_on_textbook_results():
    accuracy = {0.05: [0.80, 0.81, 0.79], 0.1: [0.88, 0.87, 0.89], 0.2: [0.93, 0.92, 0.94],
                0.5: [0.90, 0.91, 0.89], 1.0: [0.84, 0.85, 0.83]}
    uniformity = {t: [-3.5 + 2 * t] * 3 for t in TAUS}        # rises with tau
    tolerance = {t: [0.2 + 0.5 * t] * 3 for t in TAUS}        # rises with tau
    hard = {t: [0.91, 0.92, 0.90] if t != 1.0 else [0.89, 0.90, 0.88] for t in TAUS}
    verdicts = by_claim(sweep_verdicts(sweep_rows(accuracy, uniformity, tolerance, hard, [0.6, 0.62, 0.58])))
    assert {k: v.status for k, v in verdicts.items()} == {
        "Probe accuracy is reverse-U shaped in tau": HOLDS,
        "Smaller tau makes the embedding more uniform": HOLDS,
        "Larger tau makes the embedding more tolerant": HOLDS,
        "Uniformity and tolerance trade off": HOLDS,
        "The simple loss trains worse than the best NT-Xent": HOLDS,
        "Hard-negative mining makes accuracy less sensitive to tau": HOLDS,
    }
    assert "best tau 0.2" in verdicts["Probe accuracy is reverse-U shaped in tau"].evidence


def test_sweep_verdicts_fail_on_contrary_results():
    accuracy = {t: [0.9 - 0.1 * t, 0.9 - 0.1 * t + 0.001] for t in TAUS}   # best at the smallest tau
    uniformity = {t: [-1.0 - t] * 2 for t in TAUS}                          # falls with tau
    tolerance = {t: [0.5 - 0.1 * t] * 2 for t in TAUS}                      # falls with tau
    hard = {t: [0.5 + 0.3 * t] * 2 for t in TAUS}                           # spread 0.285 > 0.095
    verdicts = by_claim(sweep_verdicts(sweep_rows(accuracy, uniformity, tolerance, hard, [0.95, 0.96])))
    # (both fall with tau, so they still trade off against each other)
    assert verdicts.pop("Uniformity and tolerance trade off").status == HOLDS
    assert all(v.status == FAILS for v in verdicts.values()), {k: v.status for k, v in verdicts.items()}


def test_dilemma_fails_when_uniform_embeddings_are_also_tolerant():
    accuracy = {t: [0.9, 0.9] for t in TAUS}
    uniformity = {t: [-1.0 - t] * 2 for t in TAUS}   # more uniform as tau grows
    tolerance = {t: [0.2 + 0.5 * t] * 2 for t in TAUS}  # and more tolerant
    verdicts = by_claim(sweep_verdicts(sweep_rows(accuracy, uniformity, tolerance)))
    assert verdicts["Uniformity and tolerance trade off"].status == FAILS
    assert "rho(uniformity, tolerance) over 10 runs" in verdicts["Uniformity and tolerance trade off"].evidence


def test_sweep_verdicts_inconclusive_within_noise_or_one_seed():
    # interior best, but the ends are within one standard deviation of it
    accuracy = {0.1: [0.80, 0.90], 0.2: [0.86, 0.87], 0.5: [0.82, 0.88]}
    verdicts = by_claim(sweep_verdicts(sweep_rows(accuracy, simple=[0.85, 0.80])))
    assert verdicts["Probe accuracy is reverse-U shaped in tau"].status == UNDECIDED
    # simple: gap 0.04 < std 0.035? gap = 0.865 - 0.825 = 0.04 > 0.0354 -> holds
    assert verdicts["The simple loss trains worse than the best NT-Xent"].status == HOLDS
    one_seed = {0.1: [0.8], 0.2: [0.9], 0.5: [0.7]}
    verdicts = by_claim(sweep_verdicts(sweep_rows(one_seed, simple=[0.5])))
    assert verdicts["Probe accuracy is reverse-U shaped in tau"].status == UNDECIDED
    assert verdicts["The simple loss trains worse than the best NT-Xent"].status == UNDECIDED


def test_sweep_verdicts_need_three_temperatures():
    verdicts = by_claim(sweep_verdicts(sweep_rows({0.1: [0.8, 0.81], 0.2: [0.9, 0.91]},
                                                  uniformity={0.1: [-2, -2], 0.2: [-1, -1]})))
    assert verdicts["Probe accuracy is reverse-U shaped in tau"].status == UNDECIDED
    assert verdicts["Smaller tau makes the embedding more uniform"].status == UNDECIDED


def positive_pair_rows(a, b, base):
    rows = [{"setting": "pairs A", "probe_accuracy": v} for v in a]
    rows += [{"setting": "pairs B", "probe_accuracy": v} for v in b]
    rows += [{"setting": "random init", "probe_accuracy": v} for v in base]
    return rows


def test_positive_pairs_verdicts():
    verdicts = positive_pairs_verdicts(positive_pair_rows([0.95, 0.96, 0.94], [0.70, 0.75, 0.72], [0.8, 0.8, 0.8]))
    assert [v.status for v in verdicts] == [HOLDS, HOLDS, FAILS]
    assert "A 0.9500 +/- 0.0100 vs B 0.7233" in verdicts[0].evidence
    verdicts = positive_pairs_verdicts(positive_pair_rows([0.9, 0.82], [0.85, 0.86], [0.5, 0.5]))
    assert verdicts[0].status == UNDECIDED  # gap 0.86 - 0.855 = 0.005 < std 0.0566
    verdicts = positive_pairs_verdicts(positive_pair_rows([0.8, 0.8], [0.9, 0.9], []))
    assert [v.status for v in verdicts] == [FAILS]
