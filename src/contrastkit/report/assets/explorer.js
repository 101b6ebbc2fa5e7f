"use strict";
// contrastkit temperature explorer. The math in explainRow() is the single-row case of
// contrastkit.analysis.explain (same formulas, same order of operations, float64).
(function () {
  const MIN_CANDIDATES = 2;
  const MAX_CANDIDATES = 12;  // what a user builds by hand; a run's real row may have more
  const CHART_LINES = 12;     // probability curves drawn: the first candidates (a real row: the positive, the hardest)
  const LOG_TAU_MIN = -2;
  const LOG_TAU_MAX = 1;
  const COLORS = ["#1a8a4a", "#2457c5", "#d9480f", "#7b3fc4", "#c2255c", "#0b7285",
                  "#a66a00", "#5c940d", "#364fc7", "#862e9c", "#e8590c", "#495057"];

  // ------------------------------------------------------------------ math

  function logSumExp(values) {
    let top = -Infinity;
    for (const v of values) if (v > top) top = v;
    if (!Number.isFinite(top)) return top;
    let total = 0;
    for (const v of values) total += Math.exp(v - top);
    return top + Math.log(total);
  }

  // One query row: similarities (K,), index of the positive, temperature tau.
  // Field names follow contrastkit.analysis.Explanation.
  function explainRow(similarities, positive, tau) {
    const s = Array.from(similarities, Number);
    const k = s.length;
    if (k < MIN_CANDIDATES) throw new RangeError("need at least 2 candidates (a positive and a negative)");
    s.forEach(function (v, j) {
      if (!Number.isFinite(v)) throw new RangeError("similarity of candidate " + (j + 1) + " must be a finite number");
    });
    if (!Number.isInteger(positive) || positive < 0 || positive >= k) {
      throw new RangeError("positive must be a candidate index in [0, " + (k - 1) + "], got " + positive);
    }
    if (!(typeof tau === "number" && Number.isFinite(tau) && tau > 0)) {
      throw new RangeError("temperature must be a finite number > 0, got " + tau);
    }
    const logits = s.map(function (v) { return v / tau; });
    if (!logits.every(Number.isFinite)) {
      throw new RangeError("temperature " + tau + " is too small for these similarities: s / tau overflows");
    }
    const logZ = logSumExp(logits);
    const loss = logZ - logits[positive];
    if (!Number.isFinite(loss)) {
      throw new RangeError("temperature " + tau + " is too small for these similarities: the loss overflows");
    }
    const probabilities = logits.map(function (l) { return Math.exp(l - logZ); });
    probabilities[positive] = Math.exp(-loss);
    const negatives = [];
    for (let j = 0; j < k; j++) if (j !== positive) negatives.push(j);
    // 1 - p_+ as the sum of the negatives' probabilities, each accurate to a few ulps
    // (1 - exp(-L) would lose digits when p_+ is near 1).
    const gradients = probabilities.map(function (p) { return p / tau; });
    let rest = 0;
    for (const j of negatives) rest += probabilities[j];
    gradients[positive] = -rest / tau;
    let hardest = negatives[0];
    for (const j of negatives) if (s[j] > s[hardest]) hardest = j;   // first on ties
    const logZNeg = logSumExp(negatives.map(function (j) { return logits[j]; }));
    const penalty = new Array(k).fill(0);
    let entropy = 0;
    for (const j of negatives) {
      const logShare = logits[j] - logZNeg;
      const share = Math.exp(logShare);
      penalty[j] = share;
      if (share > 0) entropy -= share * logShare;
    }
    entropy = Math.max(entropy, 0);  // rounding can leave -1e-17 when one negative dominates

    // Reference: every negative at the mean negative similarity.
    let negativeSum = 0;
    for (const j of negatives) negativeSum += s[j];
    const meanNegative = negativeSum / negatives.length;
    const flat = [s[positive] / tau];
    for (let j = 0; j < negatives.length; j++) flat.push(meanNegative / tau);
    const lossUniform = logSumExp(flat) - flat[0];

    // The temperature lemma (textbook, section 30.2): A = max over the denominator, B = the positive, m = #ties at A.
    let top = -Infinity;
    for (const v of s) if (v > top) top = v;
    let ties = 0;
    for (const v of s) if (v === top) ties += 1;
    const positiveScore = s[positive];
    return {
      temperature: tau,
      similarities: s,
      positive: positive,
      logits: logits,
      probabilities: probabilities,
      loss: loss,
      gradients: gradients,
      penalty: penalty,
      penalty_entropy: entropy,
      effective_negatives: Math.exp(entropy),
      hardest_negative: hardest,
      hardest_margin: positiveScore - s[hardest],
      log_n: Math.log(k),
      loss_uniform_negatives: lossUniform,
      limit_zero: top > positiveScore ? Infinity : Math.log(ties),
      limit_zero_rate: top - positiveScore,
      limit_infinity: Math.log(k),
      ties: ties,
    };
  }

  // sigmoid(x) and log sigmoid(x) without overflow.
  function sigmoid(x) {
    if (x >= 0) return 1 / (1 + Math.exp(-x));
    const e = Math.exp(x);
    return e / (1 + e);
  }

  function logSigmoid(x) {
    return -(Math.max(-x, 0) + Math.log1p(Math.exp(-Math.abs(x))));
  }

  // The sigmoid (SigLIP) loss of one row: the single-row case of
  // contrastkit.analysis.explain_sigmoid (same formulas, float64), its field names.
  function explainSigmoidRow(similarities, positive, tau, bias) {
    const softmax = explainRow(similarities, positive, tau);
    if (!(typeof bias === "number" && Number.isFinite(bias))) {
      throw new RangeError("bias must be a finite number, got " + bias);
    }
    const s = softmax.similarities;
    const logits = s.map(function (v) { return v / tau + bias; });
    if (!logits.every(Number.isFinite)) {
      throw new RangeError("temperature " + tau + " is too small for these similarities: s / tau overflows");
    }
    const labels = s.map(function (_, j) { return j === positive ? 1 : -1; });
    const match = logits.map(sigmoid);
    const probabilities = logits.map(function (l, j) { return sigmoid(labels[j] * l); });
    const terms = logits.map(function (l, j) { return -logSigmoid(labels[j] * l); });
    // q - y: for the positive -sigmoid(-l), not sigmoid(l) - 1, which would cancel near q = 1.
    const residual = logits.map(function (l, j) { return j === positive ? -sigmoid(-l) : match[j]; });
    let loss = 0, scaleGradient = 0, biasGradient = 0, gradientSum = 0;
    const gradients = residual.map(function (r) { return r / tau; });
    const scaleGradients = residual.map(function (r, j) { return r * s[j]; });
    for (let j = 0; j < s.length; j++) {
      loss += terms[j];
      scaleGradient += scaleGradients[j];
      biasGradient += residual[j];
      gradientSum += gradients[j];
    }
    const scale = 1 / tau;
    let softmaxGradientSum = 0;
    for (const g of softmax.gradients) softmaxGradientSum += g;
    return {
      temperature: tau, bias: bias, scale: scale, similarities: s, positive: positive, labels: labels,
      logits: logits, match_probabilities: match, probabilities: probabilities, loss_terms: terms,
      gradients: gradients, scale_gradients: scaleGradients, bias_gradients: residual, loss: loss,
      scale_gradient: scaleGradient, bias_gradient: biasGradient, log_scale_gradient: scale * scaleGradient,
      gradient_sum: gradientSum, threshold: -bias * tau, softmax: softmax,
      softmax_gradient_sum: softmaxGradientSum,
    };
  }

  // ------------------------------------------------------------------ temperature methods
  // The single-row case of contrastkit.analysis.explain_methods (same formulas, float64), with
  // each method's defaults and name as its record in contrastkit.temperature_methods holds them
  // (embedded by the page's writer).

  const EMBEDDED_METHODS = JSON.parse(document.getElementById("ck-methods").textContent);
  const METHOD_SETTINGS = {};
  const METHOD_NAMES = { fixed: "fixed τ" };
  for (const name of Object.keys(EMBEDDED_METHODS)) {
    METHOD_SETTINGS[name] = EMBEDDED_METHODS[name].settings;
    METHOD_NAMES[name] = EMBEDDED_METHODS[name].label;
  }

  // KL(q || uniform) of the softmax over the negatives at tau.
  function klToUniform(s, positive, tau) {
    const logits = [];
    for (let j = 0; j < s.length; j++) if (j !== positive) logits.push(s[j] / tau);
    const logZ = logSumExp(logits);
    let kl = Math.log(logits.length);
    for (const l of logits) {
      const logQ = l - logZ;
      const q = Math.exp(logQ);
      if (q > 0) kl += q * logQ;
    }
    return kl;
  }

  // The temperature that minimises iSogCLR's robust objective for the row: KL = rho, clipped.
  function robustTau(s, positive, rho, tauMin, tauMax) {
    let low = Math.log(tauMin), high = Math.log(tauMax);
    const atMax = klToUniform(s, positive, tauMax) >= rho;
    const atMin = klToUniform(s, positive, tauMin) <= rho;
    for (let i = 0; i < 200; i++) {
      const middle = 0.5 * (low + high);
      if (klToUniform(s, positive, Math.exp(middle)) > rho) low = middle; else high = middle;
    }
    if (atMax) return tauMax;
    if (atMin) return tauMin;
    return Math.exp(0.5 * (low + high));
  }

  function methodView(method, s, positive, tau, weightOf) {
    const result = explainRow(s, positive, tau);
    let negativeMass = 0;
    for (let j = 0; j < s.length; j++) if (j !== positive) negativeMass += result.probabilities[j];
    let weight, gradients;
    if (method === "individual" || method === "network") {
      weight = tau;
      gradients = result.penalty.slice();
      gradients[positive] = -1;
    } else {
      weight = weightOf(negativeMass);
      gradients = result.gradients.map(function (g) { return weight * g; });
    }
    return { method: method, temperature: tau, weight: weight, result: result, gradients: gradients,
             positive_pull: -gradients[positive] };
  }

  function explainMethodsRow(similarities, positive, tau) {
    const fixed = explainRow(similarities, positive, tau);
    const s = fixed.similarities;
    const views = { fixed: methodView("fixed", s, positive, tau, function () { return 1; }) };
    const m = METHOD_SETTINGS.macl;
    const tauA = m.temperature * (1 + m.alpha * (s[positive] - m.threshold));
    views.macl = methodView("macl", s, positive, tauA, function (mass) { return 1 / mass; });
    const d = METHOD_SETTINGS.dual;
    const inter = explainRow(s, positive, d.inter_temperature);
    let interMass = 0;
    for (let j = 0; j < s.length; j++) if (j !== positive) interMass += inter.probabilities[j];
    views.dual = methodView("dual", s, positive, d.intra_temperature, function (mass) { return interMass / mass; });
    for (const name of ["individual", "network"]) {
      const r = METHOD_SETTINGS[name];
      views[name] = methodView(name, s, positive, robustTau(s, positive, r.rho, r.tau_min, r.tau_max));
    }
    return views;
  }

  // ------------------------------------------------------------------ formatting

  function fmt(value, decimals) {
    if (value === Infinity) return "+∞";
    if (value === -Infinity) return "−∞";
    if (Number.isNaN(value)) return "—";
    // Too small for the fixed decimals but not zero: 3 significant digits ("2.06e-9").
    if (value !== 0 && Math.abs(value) < 0.5 * Math.pow(10, -decimals)) return value.toExponential(2);
    let text = value.toFixed(decimals);
    if (/^-0\.?0*$/.test(text)) text = text.slice(1);  // no "-0.000"
    return text;
  }

  // Significant digits, used for tau (the number the computation uses is the number shown).
  function roundTau(tau) {
    return Number(tau.toPrecision(3));
  }

  // A similarity box as wide as its value (a user's model gives 0.8372415304183960), so that
  // no digit is hidden; never narrower than the CSS width.
  function fitToValue(input) {
    input.style.width = "calc(" + Math.max(5, input.value.length + 1) + "ch + 1.9rem)";
  }

  function setOut(element, value, decimals, text) {
    element.textContent = text !== undefined ? text : fmt(value, decimals);
    element.dataset.value = String(value);
  }

  // ------------------------------------------------------------------ state

  const presets = JSON.parse(document.getElementById("ck-presets").textContent);
  const state = { labels: [], s: [], images: [], positive: 0, tau: 0.5, preset: null, sigmoid: false, bias: -10,
                  methods: false, method: "macl" };
  let lastResult = null;
  let lastSigmoid = null;
  let lastMethods = null;

  const $ = function (id) { return document.getElementById(id); };
  const rowsBody = $("candidate-rows");
  const tauRange = $("tau-range");
  const tauNumber = $("tau-number");
  const status = $("status");

  function clamp(x, lo, hi) { return Math.min(hi, Math.max(lo, x)); }

  function nextLabel() {
    const used = new Set(state.labels);
    for (let n = 1; ; n++) {
      const label = "c" + n;
      if (!used.has(label)) return label;
    }
  }

  // ------------------------------------------------------------------ building the table

  function buildRows() {
    rowsBody.textContent = "";
    state.s.forEach(function (value, j) {
      const label = state.labels[j];
      const tr = document.createElement("tr");
      tr.id = "row-" + j;
      tr.innerHTML =
        '<th scope="row"><span class="swatch" aria-hidden="true"></span><span class="name"></span></th>' +
        '<td class="radio-cell"><input type="radio" name="positive" id="pos-' + j + '">' +
        '<label class="sr-only" for="pos-' + j + '"></label></td>' +
        '<td><div class="sim">' +
        '<label class="sr-only" for="sim-range-' + j + '"></label>' +
        '<input type="range" id="sim-range-' + j + '" min="-1" max="1" step="0.01">' +
        '<label class="sr-only" for="sim-' + j + '"></label>' +
        '<input type="number" id="sim-' + j + '" step="any"></div></td>' +
        '<td class="num" id="logit-' + j + '"></td>' +
        '<td class="num cell-bar"><div class="bar" id="prob-bar-' + j + '"></div><span id="prob-' + j + '"></span></td>' +
        '<td class="num" id="grad-' + j + '"></td>' +
        '<td class="num cell-bar"><div class="bar" id="pen-bar-' + j + '"></div><span id="pen-' + j + '"></span></td>' +
        '<td><button type="button" class="remove" id="remove-' + j + '">×</button></td>';
      tr.querySelector(".swatch").style.background = COLORS[j % COLORS.length];
      tr.querySelector(".name").textContent = label;
      const picture = state.images[j];
      if (picture) {
        const img = document.createElement("img");
        img.className = "cand-img";
        img.src = picture;
        img.alt = label;
        tr.querySelector("th").insertBefore(img, tr.querySelector(".name"));
      }
      const labels = tr.querySelectorAll("label");
      labels[0].textContent = label + " is the positive";
      labels[1].textContent = "Similarity of " + label + " (slider)";
      labels[2].textContent = "Similarity of " + label;
      const remove = tr.querySelector(".remove");
      remove.setAttribute("aria-label", "Remove " + label);
      remove.disabled = state.s.length <= MIN_CANDIDATES;
      rowsBody.appendChild(tr);

      const radio = $("pos-" + j);
      const range = $("sim-range-" + j);
      const number = $("sim-" + j);
      radio.checked = j === state.positive;
      range.value = String(clamp(value, -1, 1));
      number.value = String(value);
      fitToValue(number);
      radio.addEventListener("change", function () {
        if (radio.checked) { state.positive = j; clearPreset(); update(); }
      });
      range.addEventListener("input", function () {
        state.s[j] = Number(range.value);
        number.value = range.value;
        fitToValue(number);
        number.removeAttribute("aria-invalid");
        clearPreset();
        update();
      });
      number.addEventListener("input", function () {
        fitToValue(number);
        const v = Number(number.value);
        if (number.value.trim() === "" || !Number.isFinite(v)) {
          number.setAttribute("aria-invalid", "true");
          showError("Similarity of " + label + " must be a number.");
          return;
        }
        number.removeAttribute("aria-invalid");
        state.s[j] = v;
        range.value = String(clamp(v, -1, 1));
        clearPreset();
        update();
      });
      remove.addEventListener("click", function () { removeCandidate(j); });
    });
    $("add-candidate").disabled = state.s.length >= MAX_CANDIDATES;
  }

  function removeCandidate(j) {
    if (state.s.length <= MIN_CANDIDATES) return;
    state.s.splice(j, 1);
    state.labels.splice(j, 1);
    state.images.splice(j, 1);
    if (state.positive === j) state.positive = 0;
    else if (state.positive > j) state.positive -= 1;
    clearPreset();
    buildRows();
    update();
    const focusTarget = $("remove-" + Math.min(j, state.s.length - 1));
    if (focusTarget && !focusTarget.disabled) focusTarget.focus(); else $("add-candidate").focus();
  }

  function addCandidate() {
    if (state.s.length >= MAX_CANDIDATES) return;
    state.s.push(0);
    state.labels.push(nextLabel());
    state.images.push(null);
    clearPreset();
    buildRows();
    update();
    const field = $("sim-" + (state.s.length - 1));
    field.focus();
    field.select();  // typing replaces the 0
  }

  // ------------------------------------------------------------------ temperature

  function setTau(tau, fromRange) {
    state.tau = tau;
    if (!fromRange) tauRange.value = String(clamp(Math.log10(tau), LOG_TAU_MIN, LOG_TAU_MAX));
    tauNumber.value = String(tau);
    tauNumber.removeAttribute("aria-invalid");
    tauRange.setAttribute("aria-valuetext", "τ = " + tau);
  }

  tauRange.addEventListener("input", function () {
    setTau(roundTau(Math.pow(10, Number(tauRange.value))), true);
    clearPreset();
    update();
  });
  tauNumber.addEventListener("input", function () {
    const v = Number(tauNumber.value);
    if (tauNumber.value.trim() === "" || !Number.isFinite(v) || v <= 0) {
      tauNumber.setAttribute("aria-invalid", "true");
      showError("Temperature τ must be a number > 0.");
      return;
    }
    state.tau = v;
    tauNumber.removeAttribute("aria-invalid");
    tauRange.value = String(clamp(Math.log10(v), LOG_TAU_MIN, LOG_TAU_MAX));
    tauRange.setAttribute("aria-valuetext", "τ = " + v);
    clearPreset();
    update();
  });

  // ------------------------------------------------------------------ presets

  function buildPresets() {
    const box = $("presets");
    const groups = {};
    presets.forEach(function (preset) {
      if (!groups[preset.group]) {
        const div = document.createElement("div");
        div.className = "preset-group";
        div.setAttribute("role", "group");
        div.setAttribute("aria-label", preset.group);
        const span = document.createElement("span");
        span.textContent = preset.group;
        span.setAttribute("aria-hidden", "true");
        div.appendChild(span);
        box.appendChild(div);
        groups[preset.group] = div;
      }
      const button = document.createElement("button");
      button.type = "button";
      button.id = "preset-" + preset.id;
      button.textContent = preset.title;
      button.title = preset.note;
      button.setAttribute("aria-pressed", "false");
      button.addEventListener("click", function () { loadPreset(preset.id); });
      groups[preset.group].appendChild(button);
    });
  }

  function loadPreset(id) {
    const preset = presets.find(function (p) { return p.id === id; });
    if (!preset) return false;
    state.s = preset.similarities.slice();
    state.labels = preset.labels.slice();
    state.images = (preset.images || []).slice();
    state.positive = preset.positive;
    setTau(preset.temperature, false);
    buildRows();
    markPreset(preset);
    update();
    return true;
  }

  function markPreset(preset) {
    state.preset = preset ? preset.id : null;
    presets.forEach(function (p) {
      $("preset-" + p.id).setAttribute("aria-pressed", String(preset !== null && p.id === preset.id));
    });
    $("preset-note").textContent = preset ? preset.note : "";
    const query = $("preset-query");
    query.textContent = "";
    if (preset && preset.query_image) {
      const img = document.createElement("img");
      img.src = preset.query_image;
      img.alt = "the query (anchor) of this row";
      img.className = "cand-img query";
      query.appendChild(img);
      query.appendChild(document.createTextNode(preset.query_label || "query"));
    }
  }

  function clearPreset() {
    if (state.preset !== null) markPreset(null);
  }

  // ------------------------------------------------------------------ output

  function showError(message) {
    status.textContent = message;
    $("summary").classList.add("stale");
    rowsBody.classList.add("stale");
    $("sigmoid-view").classList.add("stale");
    $("methods-view").classList.add("stale");
  }

  function update() {
    let result;
    try {
      result = explainRow(state.s, state.positive, state.tau);
    } catch (err) {
      showError(err.message);
      return;
    }
    status.textContent = "";
    $("summary").classList.remove("stale");
    rowsBody.classList.remove("stale");
    $("sigmoid-view").classList.remove("stale");
    $("methods-view").classList.remove("stale");
    lastResult = result;
    const k = state.s.length;
    for (let j = 0; j < k; j++) {
      const isPositive = j === state.positive;
      $("row-" + j).classList.toggle("is-positive", isPositive);
      setOut($("logit-" + j), result.logits[j], 4);
      setOut($("prob-" + j), result.probabilities[j], 6);
      $("prob-bar-" + j).style.width = (100 * result.probabilities[j]).toFixed(2) + "%";
      setOut($("grad-" + j), result.gradients[j], 4);
      if (isPositive) {
        setOut($("pen-" + j), 0, 4, "—");
        $("pen-bar-" + j).style.width = "0";
      } else {
        setOut($("pen-" + j), result.penalty[j], 4);
        $("pen-bar-" + j).style.width = (100 * result.penalty[j]).toFixed(2) + "%";
      }
    }
    const label = function (j) { return state.labels[j]; };
    setOut($("out-loss"), result.loss, 6);
    setOut($("out-p-positive"), result.probabilities[state.positive], 6);
    setOut($("out-tau-loss"), state.tau * result.loss, 6);
    setOut($("out-log-n"), result.log_n, 6);
    setOut($("out-loss-uniform"), result.loss_uniform_negatives, 6);
    setOut($("out-limit-zero"), result.limit_zero, 6);
    let why;
    if (result.limit_zero === Infinity) {
      why = "A negative is more similar than the positive (A > B): the loss grows like (A − B)/τ.";
    } else if (result.ties > 1) {
      why = "The positive ties with " + (result.ties - 1) + " negative(s) at the top: L → log " + result.ties + ".";
    } else {
      why = "The positive is the unique most similar candidate: L → 0.";
    }
    $("out-limit-zero-why").textContent = why;
    setOut($("out-limit-zero-rate"), result.limit_zero_rate, 6);
    setOut($("out-limit-inf"), result.limit_infinity, 6);
    setOut($("out-entropy"), result.penalty_entropy, 6);
    setOut($("out-effective"), result.effective_negatives, 4);
    $("out-effective-why").textContent = k === 2
      ? "A single negative carries the whole penalty at every τ (H = 0)."
      : "out of " + (k - 1) + " negatives: near 1 only the hardest matters (small τ); near " + (k - 1) +
        " all weigh the same (large τ), max entropy log " + (k - 1) + " = " + fmt(Math.log(k - 1), 4) + ".";
    setOut($("out-hardest"), result.hardest_negative, 0, label(result.hardest_negative));
    setOut($("out-margin"), result.hardest_margin, 6);
    let negativeGradient = 0;
    for (let j = 0; j < k; j++) if (j !== state.positive) negativeGradient += result.gradients[j];
    $("out-grad-balance").textContent = fmt(-result.gradients[state.positive], 4) + " = " + fmt(negativeGradient, 4);
    updateSigmoid();
    updateMethods();
    drawCharts(result);
    writeHash();
  }

  // ------------------------------------------------------------------ the sigmoid view

  const sigmoidToggle = $("sigmoid-toggle");
  const biasRange = $("bias-range");
  const biasNumber = $("bias-number");

  function setBias(bias, fromRange) {
    state.bias = bias;
    if (!fromRange) biasRange.value = String(clamp(bias, -15, 5));
    biasNumber.value = String(bias);
    biasNumber.removeAttribute("aria-invalid");
    biasRange.setAttribute("aria-valuetext", "b = " + bias);
  }

  function setSigmoid(on) {
    state.sigmoid = on;
    sigmoidToggle.checked = on;
    $("sigmoid-view").hidden = !on;
  }

  function updateSigmoid() {
    if (!state.sigmoid) { lastSigmoid = null; return; }
    let r;
    try {
      r = explainSigmoidRow(state.s, state.positive, state.tau, state.bias);
    } catch (err) {
      showError(err.message);
      return;
    }
    lastSigmoid = r;
    const body = $("sigmoid-rows");
    body.textContent = "";
    for (let j = 0; j < state.s.length; j++) {
      const tr = document.createElement("tr");
      tr.classList.toggle("is-positive", j === state.positive);
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = state.labels[j] + (j === state.positive ? " (positive)" : "");
      tr.appendChild(th);
      const cells = [["sig-logit-", r.logits[j], 4], ["sig-match-", r.match_probabilities[j], 6],
                     ["sig-prob-", r.probabilities[j], 6], ["sig-term-", r.loss_terms[j], 6],
                     ["sig-grad-", r.gradients[j], 4], ["sig-tgrad-", r.scale_gradients[j], 4],
                     ["sig-bgrad-", r.bias_gradients[j], 4], ["sig-softgrad-", r.softmax.gradients[j], 4]];
      for (const [prefix, value, decimals] of cells) {
        const td = document.createElement("td");
        td.className = "num";
        td.id = prefix + j;
        setOut(td, value, decimals);
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    setOut($("sig-loss"), r.loss, 6);
    setOut($("sig-softmax-loss"), r.softmax.loss, 6);
    setOut($("sig-grad-sum"), r.gradient_sum, 6);
    setOut($("sig-softmax-grad-sum"), r.softmax_gradient_sum, 6);
    setOut($("sig-scale-grad"), r.scale_gradient, 6);
    setOut($("sig-log-scale-grad"), r.log_scale_gradient, 6);
    setOut($("sig-bias-grad"), r.bias_gradient, 6);
    setOut($("sig-threshold"), r.threshold, 4);
  }

  sigmoidToggle.addEventListener("change", function () {
    setSigmoid(sigmoidToggle.checked);
    update();
  });
  biasRange.addEventListener("input", function () {
    setBias(Number(Number(biasRange.value).toFixed(1)), true);
    update();
  });
  biasNumber.addEventListener("input", function () {
    const v = Number(biasNumber.value);
    if (biasNumber.value.trim() === "" || !Number.isFinite(v)) {
      biasNumber.setAttribute("aria-invalid", "true");
      showError("Bias b must be a finite number.");
      return;
    }
    state.bias = v;
    biasNumber.removeAttribute("aria-invalid");
    biasRange.value = String(clamp(v, -15, 5));
    biasRange.setAttribute("aria-valuetext", "b = " + v);
    update();
  });

  // ------------------------------------------------------------------ the temperature methods

  const methodsToggle = $("methods-toggle");
  const methodChoice = $("method-choice");

  function setMethods(on) {
    state.methods = on;
    methodsToggle.checked = on;
    $("methods-view").hidden = !on;
  }

  function updateMethods() {
    if (!state.methods) { lastMethods = null; return; }
    let views;
    try {
      views = explainMethodsRow(state.s, state.positive, state.tau);
    } catch (err) {
      showError(err.message);
      return;
    }
    lastMethods = views;
    for (const name of Object.keys(METHOD_NAMES)) {
      const v = views[name];
      setOut($("m-tau-" + name), v.temperature, 4);
      setOut($("m-weight-" + name), v.weight, 4);
      setOut($("m-p-" + name), v.result.probabilities[state.positive], 6);
      setOut($("m-pull-" + name), v.positive_pull, 4);
      setOut($("m-eff-" + name), v.result.effective_negatives, 4);
    }
    const chosen = views[state.method];
    const fixed = views.fixed;
    $("method-chosen").textContent = METHOD_NAMES[state.method];
    const body = $("method-rows");
    body.textContent = "";
    for (let j = 0; j < state.s.length; j++) {
      const isPositive = j === state.positive;
      const tr = document.createElement("tr");
      tr.classList.toggle("is-positive", isPositive);
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = state.labels[j] + (isPositive ? " (positive)" : "");
      tr.appendChild(th);
      const cells = [["mt-prob-fixed-", fixed.result.probabilities[j], 6], ["mt-prob-", chosen.result.probabilities[j], 6],
                     ["mt-grad-fixed-", fixed.gradients[j], 4], ["mt-grad-", chosen.gradients[j], 4],
                     ["mt-pen-fixed-", isPositive ? NaN : fixed.result.penalty[j], 4],
                     ["mt-pen-", isPositive ? NaN : chosen.result.penalty[j], 4]];
      for (const [prefix, value, decimals] of cells) {
        const td = document.createElement("td");
        td.className = "num";
        td.id = prefix + j;
        setOut(td, value, decimals);
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
  }

  methodsToggle.addEventListener("change", function () {
    setMethods(methodsToggle.checked);
    update();
  });
  methodChoice.addEventListener("change", function () {
    state.method = methodChoice.value;
    update();
  });

  // ------------------------------------------------------------------ charts (inline SVG)

  const SVG_NS = "http://www.w3.org/2000/svg";
  const PLOT = { left: 46, right: 12, top: 12, bottom: 34, width: 520, height: 260 };

  function svgEl(name, attrs, parent) {
    const el = document.createElementNS(SVG_NS, name);
    for (const key in attrs) el.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(el);
    return el;
  }

  function xOf(logTau) {
    return PLOT.left + (logTau - LOG_TAU_MIN) / (LOG_TAU_MAX - LOG_TAU_MIN) * (PLOT.width - PLOT.left - PLOT.right);
  }

  function frame(svg, yMax, yTicks, yLabel) {
    svg.textContent = "";
    const innerH = PLOT.height - PLOT.top - PLOT.bottom;
    const yOf = function (v) { return PLOT.top + innerH * (1 - v / yMax); };
    const clipId = svg.id + "-clip";
    const defs = svgEl("defs", {}, svg);
    const clip = svgEl("clipPath", { id: clipId }, defs);
    svgEl("rect", { x: PLOT.left, y: PLOT.top, width: PLOT.width - PLOT.left - PLOT.right, height: innerH }, clip);
    for (const t of yTicks) {
      const y = yOf(t);
      svgEl("line", { x1: PLOT.left, x2: PLOT.width - PLOT.right, y1: y, y2: y, class: "gridline" }, svg);
      const text = svgEl("text", { x: PLOT.left - 6, y: y + 4, "text-anchor": "end" }, svg);
      text.textContent = String(Number(t.toPrecision(3)));
    }
    for (let e = LOG_TAU_MIN; e <= LOG_TAU_MAX; e++) {
      const x = xOf(e);
      svgEl("line", { x1: x, x2: x, y1: PLOT.top, y2: PLOT.height - PLOT.bottom, class: "gridline" }, svg);
      const text = svgEl("text", { x: x, y: PLOT.height - PLOT.bottom + 15, "text-anchor": "middle" }, svg);
      text.textContent = String(Math.pow(10, e));
    }
    svgEl("line", { x1: PLOT.left, x2: PLOT.width - PLOT.right, y1: PLOT.height - PLOT.bottom,
                    y2: PLOT.height - PLOT.bottom, class: "axis" }, svg);
    svgEl("line", { x1: PLOT.left, x2: PLOT.left, y1: PLOT.top, y2: PLOT.height - PLOT.bottom, class: "axis" }, svg);
    const xl = svgEl("text", { x: (PLOT.left + PLOT.width - PLOT.right) / 2, y: PLOT.height - 4, "text-anchor": "middle" }, svg);
    xl.textContent = "temperature τ (log scale)";
    const yl = svgEl("text", { x: 12, y: PLOT.top + innerH / 2, "text-anchor": "middle",
                               transform: "rotate(-90 12 " + (PLOT.top + innerH / 2) + ")" }, svg);
    yl.textContent = yLabel;
    const group = svgEl("g", { "clip-path": "url(#" + clipId + ")" }, svg);
    return { yOf: yOf, group: group };
  }

  function pathOf(points, yOf) {
    let d = "";
    let pen = false;
    for (const [logTau, v] of points) {
      if (!Number.isFinite(v)) { pen = false; continue; }
      // Points far outside the frame are clipped; clamp them so the path stays finite.
      d += (pen ? "L" : "M") + xOf(logTau).toFixed(1) + "," + clamp(yOf(v), -1e4, 1e4).toFixed(1);
      pen = true;
    }
    return d;
  }

  function niceTicks(yMax) {
    const raw = yMax / 4;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map(function (m) { return m * power; }).find(function (s) { return s >= raw; });
    const ticks = [];
    const count = Math.ceil(yMax / step - 1e-9);
    for (let i = 0; i <= count; i++) ticks.push(i * step);
    return ticks;
  }

  function drawCharts(current) {
    const k = state.s.length;
    const grid = [];
    for (let i = 0; i <= 150; i++) {
      const logTau = LOG_TAU_MIN + (LOG_TAU_MAX - LOG_TAU_MIN) * i / 150;
      let r = null;
      try { r = explainRow(state.s, state.positive, Math.pow(10, logTau)); } catch (err) { r = null; }
      grid.push([logTau, r]);
    }
    const logNow = Math.log10(state.tau);
    const nowVisible = logNow >= LOG_TAU_MIN && logNow <= LOG_TAU_MAX;

    // Probabilities.
    const svgP = $("chart-probability");
    const fp = frame(svgP, 1, [0, 0.25, 0.5, 0.75, 1], "probability");
    const lines = Math.min(k, CHART_LINES);
    for (let j = 0; j < lines; j++) {
      const pts = grid.map(function (g) { return [g[0], g[1] ? g[1].probabilities[j] : NaN]; });
      svgEl("path", { d: pathOf(pts, fp.yOf), fill: "none", stroke: COLORS[j % COLORS.length],
                      "stroke-width": j === state.positive ? 3 : 1.8 }, fp.group);
    }
    if (nowVisible) {
      svgEl("line", { x1: xOf(logNow), x2: xOf(logNow), y1: PLOT.top, y2: PLOT.height - PLOT.bottom, class: "now" }, fp.group);
      for (let j = 0; j < lines; j++) {
        svgEl("circle", { cx: xOf(logNow), cy: fp.yOf(current.probabilities[j]), r: 3.5,
                          fill: COLORS[j % COLORS.length] }, fp.group);
      }
    }
    const legend = $("legend-probability");
    legend.textContent = "";
    if (k > lines) legend.appendChild(document.createTextNode("the first " + lines + " of " + k + " candidates: "));
    for (let j = 0; j < lines; j++) {
      const item = document.createElement("span");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = COLORS[j % COLORS.length];
      item.appendChild(sw);
      item.appendChild(document.createTextNode(state.labels[j] + (j === state.positive ? " (positive)" : "")));
      legend.appendChild(item);
    }

    // Loss with its references.
    const logN = current.log_n;
    let gridMax = 0;
    for (const g of grid) if (g[1] && Number.isFinite(g[1].loss)) gridMax = Math.max(gridMax, g[1].loss);
    const yMax = Math.max(1.3 * logN, Math.min(gridMax * 1.05, 4 * logN + 1), 0.1);
    const ticks = niceTicks(yMax);
    const svgL = $("chart-loss");
    const fl = frame(svgL, ticks[ticks.length - 1], ticks, "loss");
    const x0 = PLOT.left;
    const x1 = PLOT.width - PLOT.right;
    svgEl("line", { x1: x0, x2: x1, y1: fl.yOf(logN), y2: fl.yOf(logN), class: "ref", stroke: "#5b6472" }, fl.group);
    const tN = svgEl("text", { x: x1 - 4, y: fl.yOf(logN) - 5, "text-anchor": "end" }, fl.group);
    tN.textContent = "log N = " + fmt(logN, 4);
    if (Number.isFinite(current.limit_zero)) {
      svgEl("line", { x1: x0, x2: x1, y1: fl.yOf(current.limit_zero), y2: fl.yOf(current.limit_zero), class: "ref",
                      stroke: "#1a8a4a", "stroke-dasharray": "2 3" }, fl.group);
      const y0 = fl.yOf(current.limit_zero);
      const t0 = svgEl("text", { x: x0 + 4, y: y0 > PLOT.height - PLOT.bottom - 14 ? y0 - 5 : y0 + 13,
                                 "text-anchor": "start" }, fl.group);
      t0.textContent = "τ → 0 limit = " + fmt(current.limit_zero, 4);
    }
    const pts = grid.map(function (g) { return [g[0], g[1] ? g[1].loss : NaN]; });
    svgEl("path", { d: pathOf(pts, fl.yOf), fill: "none", stroke: "#2457c5", "stroke-width": 2.6 }, fl.group);
    if (nowVisible) {
      svgEl("line", { x1: xOf(logNow), x2: xOf(logNow), y1: PLOT.top, y2: PLOT.height - PLOT.bottom, class: "now" }, fl.group);
      svgEl("circle", { cx: xOf(logNow), cy: fl.yOf(current.loss), r: 4, fill: "#2457c5" }, fl.group);
    }
  }

  // ------------------------------------------------------------------ shareable state in the URL hash

  function writeHash() {
    let hash = "#s=" + state.s.join(",") + "&p=" + state.positive + "&t=" + state.tau;
    if (state.sigmoid) hash += "&b=" + state.bias;
    if (state.methods) hash += "&m=" + state.method;
    try { history.replaceState(null, "", hash); } catch (err) { /* file:// in some browsers */ }
  }

  function readHash() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (!params.has("s") || !params.has("t")) return false;
    const s = params.get("s").split(",").map(Number);
    const positive = Number(params.get("p") || "0");
    const tau = Number(params.get("t"));
    try { explainRow(s, positive, tau); } catch (err) { return false; }
    if (s.length > MAX_CANDIDATES) return false;
    state.s = s;
    state.labels = s.map(function (_, j) { return "c" + (j + 1); });
    state.images = s.map(function () { return null; });
    state.positive = positive;
    setTau(tau, false);
    const bias = params.has("b") ? Number(params.get("b")) : NaN;
    if (Number.isFinite(bias)) { setBias(bias, false); setSigmoid(true); }
    const method = params.get("m");
    if (method && Object.prototype.hasOwnProperty.call(METHOD_NAMES, method)) {
      state.method = method;
      methodChoice.value = method;
      setMethods(true);
    }
    buildRows();
    markPreset(null);
    update();
    return true;
  }

  // ------------------------------------------------------------------ start

  $("add-candidate").addEventListener("click", addCandidate);
  buildPresets();
  if (!readHash()) loadPreset(presets[0].id);

  // For scripted checks (the test suite compares these numbers with the Python library).
  window.contrastkitExplorer = {
    explainRow: explainRow,
    explainSigmoidRow: explainSigmoidRow,
    sigmoidResult: function () { return lastSigmoid; },
    explainMethodsRow: explainMethodsRow,
    methodsResult: function () { return lastMethods; },
    loadPreset: loadPreset,
    state: function () { return JSON.parse(JSON.stringify(state)); },
    result: function () { return lastResult; },
  };
})();
