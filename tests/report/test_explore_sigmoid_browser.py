"""The explorer's sigmoid (SigLIP) view in a real headless Chromium: its numbers equal
:func:`contrastkit.analysis.explain_sigmoid` (shown digits, and ``data-value`` to 1e-12), the
bias slider and the toggle work from the keyboard, and the view survives in the link."""

import random

import numpy as np
import pytest

from contrastkit.analysis import explain_sigmoid
from test_explore_browser import assert_shown, browser, page, page_file, read_inputs, read_outputs, tab  # noqa: F401

PAIR_FIELDS = {"sig-logit": ("logits", 4), "sig-match": ("match_probabilities", 6), "sig-prob": ("probabilities", 6),
               "sig-term": ("loss_terms", 6), "sig-grad": ("gradients", 4), "sig-tgrad": ("scale_gradients", 4),
               "sig-bgrad": ("bias_gradients", 4)}


def shown_bias(tab) -> float:
    return float(tab.evaluate("Number(document.getElementById('bias-number').value)"))


def check_sigmoid_view(tab):
    shown = read_inputs(tab)
    bias = shown_bias(tab)
    positive = shown["positive"][0]
    e = explain_sigmoid(shown["s"], temperature=shown["tau"], bias=bias, positive=positive)
    out = read_outputs(tab)
    for j in range(len(shown["s"])):
        for prefix, (field, decimals) in PAIR_FIELDS.items():
            cell = out[f"{prefix}-{j}"]
            assert_shown(cell["text"], cell["value"], float(getattr(e, field)[0, j]), decimals, f"{field}[{j}]")
        cell = out[f"sig-softgrad-{j}"]
        assert_shown(cell["text"], cell["value"], float(e.softmax.gradients[0, j]), 4, f"softmax gradient[{j}]")
    for element, expected, decimals in (
            ("sig-loss", e.loss, 6), ("sig-softmax-loss", e.softmax.loss, 6), ("sig-grad-sum", e.gradient_sum[0], 6),
            ("sig-scale-grad", e.scale_gradient[0], 6), ("sig-log-scale-grad", e.log_scale_gradient[0], 6),
            ("sig-bias-grad", e.bias_gradient[0], 6), ("sig-threshold", e.threshold, 4)):
        assert_shown(out[element]["text"], out[element]["value"], float(expected), decimals, element)
    # The softmax's gradients sum to zero up to rounding.
    assert abs(float(out["sig-softmax-grad-sum"]["value"])) < 1e-12
    return e


def test_toggle_shows_the_sigmoid_view_with_the_numbers_of_explain_sigmoid(page):
    assert page.is_hidden("#sigmoid-view")
    page.click("#preset-s3-row3")
    page.check("#sigmoid-toggle")
    assert page.is_visible("#sigmoid-view")
    e = check_sigmoid_view(page)
    assert e.bias == -10.0 and e.temperature == 0.1
    page.fill("#bias-number", "-2.5")
    assert shown_bias(page) == -2.5
    check_sigmoid_view(page)
    page.fill("#tau-number", "0.37")
    check_sigmoid_view(page)
    page.uncheck("#sigmoid-toggle")
    assert page.is_hidden("#sigmoid-view")


def test_keyboard_operates_the_toggle_and_the_bias_slider(page):
    page.click("#preset-s1-example")
    page.focus("#sigmoid-toggle")
    page.keyboard.press("Space")
    assert page.is_checked("#sigmoid-toggle") and page.is_visible("#sigmoid-view")
    page.focus("#bias-range")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    assert shown_bias(page) == pytest.approx(-9.7)
    check_sigmoid_view(page)
    page.keyboard.press("PageUp")
    assert shown_bias(page) == pytest.approx(-7.7)  # Page Up: a tenth of the range, 2
    check_sigmoid_view(page)
    page.keyboard.press("End")
    assert shown_bias(page) == 5.0
    check_sigmoid_view(page)
    page.fill("#bias-number", "")  # an empty field is no number
    assert page.get_attribute("#bias-number", "aria-invalid") == "true"
    assert "Bias b must be a finite number" in page.text_content("#status")
    page.fill("#bias-number", "1")
    assert page.get_attribute("#bias-number", "aria-invalid") is None and page.text_content("#status") == ""
    check_sigmoid_view(page)


def test_javascript_sigmoid_formulas_equal_explain_sigmoid_on_random_rows(page):
    rng = random.Random(14)
    cases = []
    for _ in range(60):
        k = rng.randint(2, 12)
        s = [round(rng.uniform(-1, 1), rng.choice([1, 2, 3])) for _ in range(k)]
        cases.append((s, rng.randrange(k), 10 ** rng.uniform(-2.5, 1.5), rng.uniform(-15, 5)))
    results = page.evaluate(
        "cases => cases.map(([s, p, t, b]) => window.contrastkitExplorer.explainSigmoidRow(s, p, t, b))", cases)
    for (s, positive, tau, bias), js in zip(cases, results):
        e = explain_sigmoid(s, temperature=tau, bias=bias, positive=positive)
        for field in ("logits", "match_probabilities", "probabilities", "loss_terms", "gradients", "scale_gradients",
                      "bias_gradients"):
            np.testing.assert_allclose(js[field], getattr(e, field)[0], rtol=1e-11, atol=1e-13, err_msg=field)
        for field in ("scale_gradient", "bias_gradient", "log_scale_gradient", "gradient_sum"):
            assert js[field] == pytest.approx(float(getattr(e, field)[0]), rel=1e-11, abs=1e-13), field
        assert js["loss"] == pytest.approx(e.loss, rel=1e-11, abs=1e-13)
        assert js["threshold"] == pytest.approx(e.threshold, rel=1e-15)


def test_sigmoid_view_survives_in_the_link(page, page_file):  # noqa: F811
    page.click("#preset-s1-example")
    page.check("#sigmoid-toggle")
    page.fill("#bias-number", "-1.5")
    link = page.evaluate("location.href")
    assert link.endswith("&b=-1.5")
    page.goto(link)
    page.reload()
    assert page.is_checked("#sigmoid-toggle") and shown_bias(page) == -1.5
    check_sigmoid_view(page)
