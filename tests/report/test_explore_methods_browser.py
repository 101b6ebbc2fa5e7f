"""The explorer's temperature-methods view in a real headless Chromium: its numbers equal
:func:`contrastkit.analysis.explain_methods` with the papers' defaults (shown digits, and
``data-value`` to 1e-12), its formulas match on random rows, and the view survives in the link."""

import random

import numpy as np
import pytest

from contrastkit.analysis import explain_methods
from test_explore_browser import assert_shown, browser, page, page_file, read_inputs, read_outputs, tab  # noqa: F401

METHODS = ["fixed", "macl", "dual", "individual", "network"]


def check_methods_view(tab, chosen):  # noqa: F811
    shown = read_inputs(tab)
    positive = shown["positive"][0]
    comparison = explain_methods(shown["s"], temperature=shown["tau"], positive=positive)
    views = {v.method: v for v in comparison}
    out = read_outputs(tab)
    for name in METHODS:
        v = views[name]
        for prefix, expected, decimals in (("m-tau", v.temperatures[0], 4), ("m-weight", v.weights[0], 4),
                                           ("m-p", v.explanation.positive_probability[0], 6),
                                           ("m-pull", v.positive_pull[0], 4),
                                           ("m-eff", v.explanation.effective_negatives[0], 4)):
            cell = out[f"{prefix}-{name}"]
            assert_shown(cell["text"], cell["value"], float(expected), decimals, f"{prefix} {name}")
    for j in range(len(shown["s"])):
        for prefix, view in (("mt-prob-fixed", views["fixed"]), ("mt-prob", views[chosen])):
            cell = out[f"{prefix}-{j}"]
            assert_shown(cell["text"], cell["value"], float(view.explanation.probabilities[0, j]), 6, f"{prefix}[{j}]")
        for prefix, view in (("mt-grad-fixed", views["fixed"]), ("mt-grad", views[chosen])):
            cell = out[f"{prefix}-{j}"]
            assert_shown(cell["text"], cell["value"], float(view.gradients[0, j]), 4, f"{prefix}[{j}]")
        if j != positive:
            cell = out[f"mt-pen-{j}"]
            assert_shown(cell["text"], cell["value"], float(views[chosen].explanation.penalty[0, j]), 4, f"pen[{j}]")
    return views


def test_toggle_shows_every_method_with_the_numbers_of_explain_methods(page):  # noqa: F811
    assert page.is_hidden("#methods-view")
    page.click("#preset-s1-block-tau05")
    page.check("#methods-toggle")
    assert page.is_visible("#methods-view")
    check_methods_view(page, "macl")
    for chosen in ("dual", "individual", "network"):
        page.select_option("#method-choice", chosen)
        check_methods_view(page, chosen)
    page.fill("#tau-number", "0.37")
    check_methods_view(page, "network")
    page.uncheck("#methods-toggle")
    assert page.is_hidden("#methods-view")


def test_javascript_method_formulas_equal_explain_methods_on_random_rows(page):  # noqa: F811
    rng = random.Random(27)
    cases = []
    for _ in range(40):
        k = rng.randint(3, 12)
        s = [round(rng.uniform(-1, 1), rng.choice([1, 2, 3])) for _ in range(k)]
        cases.append((s, rng.randrange(k), 10 ** rng.uniform(-1.5, 0.5)))
    results = page.evaluate(
        "cases => cases.map(([s, p, t]) => window.contrastkitExplorer.explainMethodsRow(s, p, t))", cases)
    for (s, positive, tau), js in zip(cases, results):
        try:
            comparison = explain_methods(s, temperature=tau, positive=positive)
        except ValueError:
            continue  # MACL's tau_A would not be positive: the page reports it as an error too
        for view in comparison:
            got = js[view.method]
            assert got["temperature"] == pytest.approx(float(view.temperatures[0]), rel=1e-12), view.method
            assert got["weight"] == pytest.approx(float(view.weights[0]), rel=1e-11), view.method
            np.testing.assert_allclose(got["gradients"], view.gradients[0], rtol=1e-10, atol=1e-12, err_msg=view.method)
            np.testing.assert_allclose(got["result"]["penalty"], view.explanation.penalty[0], rtol=1e-10, atol=1e-12)


def test_methods_view_survives_in_the_link(page, page_file):  # noqa: F811
    page.click("#preset-s1-example")
    page.check("#methods-toggle")
    page.select_option("#method-choice", "dual")
    link = page.evaluate("location.href")
    assert link.endswith("&m=dual")
    page.goto(link)
    page.reload()
    assert page.is_checked("#methods-toggle") and page.input_value("#method-choice") == "dual"
    check_methods_view(page, "dual")
