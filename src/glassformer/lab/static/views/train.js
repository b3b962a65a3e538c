// glassformer lab, view 8 "train" (#train): a small encoder–decoder trained from random weights in front of the
// student (engine/train.js in the page's worker: the tab stays usable). While it trains: the loss curve, the
// teacher-forced batch (every target position at once from the right-shifted input), the cross-attention of a
// held-out example forming, its greedy output step by step beside the teacher-forced prediction, held-out
// accuracy. The whole set-up lives in the URL hash (#train?task=reverse&seed=3&...&hide=lr,seed): a teacher links
// a configuration, and `hide` removes controls. A trained toy opens in the other views like the translator.
"use strict";
(function () {
  const { S, t, el, fmt, matrix, showError, register, LabError } = window.LAB;

  // the controls, in the order shown; each is an option of engine/train.js (checkTrainOptions names its limits)
  const CONTROLS = ["task", "d_model", "encoder_layers", "decoder_layers", "heads", "d_ff", "norm_placement", "positions",
    "lr", "warmup", "label_smoothing", "batch", "symbols", "min_length", "max_length", "seed"];
  const CHOICES = { norm_placement: ["post", "pre"], positions: ["sinusoidal", "learned", "relative", "rope", "none"] };
  const SHOWN_ROWS = 4;                              // batch sequences drawn
  const NUMBER = /^\s*-?\d+(\.\d+)?([eE][-+]?\d+)?\s*$/;

  const T = (S.train = {
    options: null, hide: [], client: null, running: false, step: 0, losses: [], accuracies: [], accuracy: null,
    batch: null, example: null, finished: false, built: false, draws: 0,
  });

  const training = () => window.LAB_LIVE.training;

  // ---------------------------------------------------------------- the URL hash
  /** #train?key=value&...&hide=a,b -> {options (complete), hide}; a bad value is one line naming the field. */
  function parseQuery(query) {
    const given = {};
    let hide = [];
    for (const [key, value] of new URLSearchParams(query)) {
      if (key === "hide") { hide = value.split(",").map((h) => h.trim()).filter(Boolean); continue; }
      if (!CONTROLS.includes(key)) throw new LabError(`#train: '${key}' is not a setting (${CONTROLS.join(", ")}, hide)`, key);
      given[key] = NUMBER.test(value) ? Number(value) : value;
    }
    for (const h of hide) {
      if (!CONTROLS.includes(h)) throw new LabError(`hide: '${h}' is not a control (${CONTROLS.join(", ")})`, "hide");
    }
    return { options: training().check(given), hide };
  }

  function hashOf(options, hide) {
    const parts = CONTROLS.map((k) => `${k}=${encodeURIComponent(String(options[k]))}`);
    if (hide.length) parts.push(`hide=${hide.join(",")}`);
    return "#train?" + parts.join("&");
  }

  function writeHash() {
    const hash = hashOf(T.options, T.hide);
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  // ---------------------------------------------------------------- the trainer (in its worker)
  function client() {
    if (!T.client) {
      T.client = training().trainer();
      T.client.onUpdate(apply);
    }
    return T.client;
  }

  async function restart(options) {
    T.options = options;
    Object.assign(T, { running: false, step: 0, losses: [], accuracies: [], accuracy: null, batch: null, example: null,
      finished: false });
    writeHash();
    build();
    try {
      apply(await client().start(options));
      showError(null);
    } catch (err) { showError(err); }
  }

  function apply(u) {
    if (!u) return;
    if (u.error) { T.running = false; showError(new LabError(u.error.message, u.error.field)); }
    if (u.losses) T.losses.push(...u.losses);
    if (u.step !== undefined) T.step = u.step;
    if (u.batch) T.batch = u.batch;
    if (u.accuracy !== undefined) { T.accuracy = u.accuracy; T.accuracies.push([T.step, u.accuracy]); }
    if (u.example) T.example = u.example;
    if (u.running === false) T.running = false;
    if (u.finished) T.finished = true;
    draw();
  }

  async function startPause() {
    try {
      if (T.running) { T.running = false; apply(await client().pause()); } else {
        T.running = true; T.finished = false; draw(); await client().run();
      }
    } catch (err) { T.running = false; showError(err); draw(); }
  }

  async function oneStep() {
    T.running = false;
    try { apply(await client().step()); } catch (err) { showError(err); }
  }

  /** The toy in every other view (live.js swaps it in for the translator), then the Sentence view. */
  async function openToy() {
    if (!T.example) return;
    try {
      const weights = await client().weights();
      const vars = { task: t("train.task." + T.options.task), step: weights.step, acc: fmt(100 * (T.accuracy || 0), 1) };
      const label = { zh: t("toy.label", vars, "zh"), en: t("toy.label", vars, "en") };
      await window.LAB_LIVE.useToy(weights, { task: T.options.task, accuracy: T.accuracy || 0, label,
        example: { source: T.example.source, target: T.example.target } });
      location.hash = "#sentence";
    } catch (err) { showError(err); }
  }

  // ---------------------------------------------------------------- drawing
  function control(key) {
    const o = T.options;
    const change = (value) => {
      let options;
      try { options = training().check(Object.assign({}, o, { [key]: value })); } catch (err) { showError(err); return; }
      showError(null);
      restart(options);
    };
    let input;
    const choices = key === "task" ? Object.keys(training().tasks) : CHOICES[key];
    if (choices) {
      input = el("select", { id: "train-" + key, onchange: (e) => change(e.target.value) },
        choices.map((c) => el("option", { value: c, selected: String(o[key]) === c }, key === "task" ? t("train.task." + c) : c)));
    } else {
      input = el("input", { type: "text", id: "train-" + key, value: String(o[key]), size: "6",
        onchange: (e) => change(NUMBER.test(e.target.value) ? Number(e.target.value) : e.target.value) });
    }
    return el("label", { class: "group", data: { control: key }, hidden: T.hide.includes(key) },
      el("span", { class: "label", title: t("train.help." + key) }, t("train.control." + key)), input);
  }

  function build() {                               // the controls and the empty panels (drawn again on a change)
    const root = document.getElementById("view-train");
    root.replaceChildren(el("h2", {}, t("train.heading")), el("p", { class: "intro" }, t("train.intro")));
    if (!T.options) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    root.append(el("div", { class: "controls", id: "train-controls" }, CONTROLS.map(control)),
      el("div", { class: "controls" },
        el("button", { type: "button", id: "train-start", onclick: startPause }, ""),
        el("button", { type: "button", id: "train-step", onclick: oneStep }, t("train.step")),
        el("button", { type: "button", id: "train-reset", onclick: () => restart(T.options) }, t("train.reset")),
        el("button", { type: "button", id: "train-open", onclick: openToy }, t("train.open")),
        el("span", { class: "note", id: "train-status" }, "")),
      el("p", { class: "note" }, t("train.task.note." + T.options.task)),
      el("div", { class: "train-grid" },
        panel("train-loss-panel", "train.loss.heading", "train.loss.caption",
          el("canvas", { id: "train-loss", width: "640", height: "220" })),
        panel("train-cross-panel", "train.cross.heading", "train.cross.caption", el("div", { id: "train-cross" })),
        panel("train-batch-panel", "train.batch.heading", "train.batch.caption", el("div", { id: "train-forced-batch" })),
        panel("train-generate-panel", "train.generate.heading", "train.generate.caption", el("div", { id: "train-generate" }))));
    T.built = true;
    draw();
  }

  function panel(id, heading, caption, body) {
    return el("div", { class: "panel", id }, el("h3", {}, t(heading)), body, el("p", { class: "caption" }, t(caption)));
  }

  function draw() {
    if (!T.built || !document.getElementById("train-status")) return;
    const start = document.getElementById("train-start");
    start.textContent = T.running ? t("train.pause") : t("train.start");
    start.classList.toggle("on", T.running);
    const last = T.losses.length ? T.losses[T.losses.length - 1] : null;
    const status = document.getElementById("train-status");
    status.textContent = t("train.status", { step: T.step, loss: last === null ? "—" : fmt(last, 4),
      acc: T.accuracy === null ? "—" : fmt(100 * T.accuracy, 1) }) + (T.finished ? " " + t("train.finished") : "");
    Object.assign(status.dataset, { step: String(T.step), accuracy: T.accuracy === null ? "" : String(T.accuracy) });
    drawLoss();
    drawBatch();
    drawCross();
    drawGenerate();
    T.draws += 1;
    document.body.dataset.trainStep = String(T.step);
  }

  function drawLoss() {
    const canvas = document.getElementById("train-loss");
    const g = canvas.getContext("2d");
    const w = canvas.width; const h = canvas.height; const left = 44; const right = 40; const top = 12; const bottom = h - 26;
    g.clearRect(0, 0, w, h);
    g.font = "11px sans-serif";
    g.strokeStyle = "#5b6570"; g.fillStyle = "#5b6570";
    g.beginPath(); g.moveTo(left, top); g.lineTo(left, bottom); g.lineTo(w - right, bottom); g.lineTo(w - right, top); g.stroke();
    const n = T.losses.length;
    const peak = Math.max(1e-9, ...T.losses.slice(0, 50), ...(n ? [T.losses[n - 1]] : []));
    const steps = Math.max(n, 10);
    const x = (i) => left + ((w - left - right) * i) / steps;
    const y = (v) => bottom - ((bottom - top) * Math.min(v, peak)) / peak;
    g.fillText(fmt(peak, 2), 4, top + 8); g.fillText("0", 30, bottom); g.fillText(String(steps), w - right - 18, h - 8);
    g.fillText(t("train.loss.axis"), left + 6, h - 8);
    g.fillStyle = "#2f67c7"; g.fillText("100 %", w - right + 4, top + 8); g.fillText("0 %", w - right + 4, bottom);
    if (n) {                                       // the loss of every step, thinned to about one point per pixel
      const every = Math.max(1, Math.floor(n / (w - left - right)));
      g.strokeStyle = "#d6452e"; g.lineWidth = 1.5; g.beginPath();
      for (let i = 0; i < n; i += every) { if (i === 0) g.moveTo(x(i + 1), y(T.losses[i])); else g.lineTo(x(i + 1), y(T.losses[i])); }
      g.lineTo(x(n), y(T.losses[n - 1])); g.stroke(); g.lineWidth = 1;
    }
    g.fillStyle = "#2f67c7";                       // held-out accuracy, on the right axis
    for (const [step, acc] of T.accuracies) { g.beginPath(); g.arc(x(step), bottom - (bottom - top) * acc, 2.5, 0, 2 * Math.PI); g.fill(); }
  }

  const PAD = "<pad>";
  const EOS = "</s>";
  function tokenRow(label, tokens, judge, cls) {
    return el("tr", { class: cls || null }, el("th", {}, label), tokens.map((tok, j) => {
      const verdict = judge ? judge(tok, j) : null;
      return el("td", { class: "tok" + (tok === PAD ? " pad" : "") + (verdict === null ? "" : verdict ? " right" : " wrong") }, tok === PAD ? "·" : tok);
    }));
  }

  function drawBatch() {
    const box = document.getElementById("train-forced-batch");
    const b = T.batch;
    if (!b) { box.replaceChildren(el("p", { class: "note" }, t("train.batch.none"))); return; }
    const shown = Math.min(SHOWN_ROWS, b.source.length);
    let right = 0; let total = 0;
    b.targetOut.forEach((row, i) => row.forEach((tok, j) => { if (tok !== PAD) { total++; if (b.predicted[i][j] === tok) right++; } }));
    box.replaceChildren(el("p", { class: "note", id: "train-batch-count" }, t("train.batch.count",
      { n: b.source.length, right, total, shown })),
    ...Array.from({ length: shown }, (_, i) => el("table", { class: "tokens", data: { probe: "train.batch" } }, el("tbody", {},
      tokenRow(t("train.row.source"), b.source[i]),
      tokenRow(t("train.row.input"), b.targetIn[i]),
      tokenRow(t("train.row.predicted"), b.predicted[i], (tok, j) => (b.targetOut[i][j] === PAD ? null : tok === b.targetOut[i][j]), "predicted"),
      tokenRow(t("train.row.target"), b.targetOut[i])))));
  }

  // rows whose largest weight sits on the position the task aligns (copy: the same, reverse: the mirrored one)
  function aligned(ex) {
    const task = T.options.task;
    if (task !== "copy" && task !== "reverse") return null;
    const S_ = ex.source.length;
    let hit = 0; let rows = 0;
    ex.cross_attention.forEach((row, i) => {
      if (i >= S_) return;                           // the EOS row has no aligned source position
      rows++;
      const best = row.indexOf(Math.max(...row));
      if (best === (task === "copy" ? i : S_ - 1 - i)) hit++;
    });
    return { hit, rows };
  }

  function drawCross() {
    const box = document.getElementById("train-cross");
    const ex = T.example;
    if (!ex) { box.replaceChildren(); return; }
    const a = aligned(ex);
    box.replaceChildren(matrix(ex.cross_attention, { probe: "train.cross", rowLabels: ex.target, colLabels: ex.source, digits: 2,
      positive: true, compact: true, title: (i, j, v) => `${ex.target[i]} → ${ex.source[j]}: ${fmt(v)}` }),
    a ? el("p", { class: "note", id: "train-aligned", data: { hit: String(a.hit), rows: String(a.rows) } },
      t("train.cross.aligned." + T.options.task, { k: a.hit, n: a.rows })) : null);
  }

  function drawGenerate() {
    const box = document.getElementById("train-generate");
    const ex = T.example;
    if (!ex) { box.replaceChildren(); return; }
    const steps = ex.greedy.map((tok, k) => el("tr", {}, el("th", {}, t("train.generate.step", { k: k + 1 })),
      ex.greedy.slice(0, k).map((prev) => el("td", { class: "tok fed" }, prev)),
      el("td", { class: "tok new " + (ex.target[k] === tok ? "right" : "wrong") }, tok)));
    const words = (tokens) => tokens.filter((tok) => tok !== EOS && tok !== PAD).join(" ");
    const matches = words(ex.greedy) === words(ex.target);
    box.replaceChildren(
      el("p", {}, el("strong", {}, t("train.generate.source")), " ", ex.source.join(" ")),
      el("table", { class: "tokens", data: { probe: "train.forced" } }, el("tbody", {},
        tokenRow(t("train.row.forced"), ex.teacherForced, (tok, j) => tok === ex.target[j], "predicted"),
        tokenRow(t("train.row.target"), ex.target))),
      el("h4", {}, t("train.generate.greedy")),
      el("table", { class: "tokens stairs", data: { probe: "train.greedy" } }, el("tbody", {}, steps)),
      el("p", { class: "note", id: "train-greedy-verdict" }, matches ? t("train.generate.same") : t("train.generate.differs")));
  }

  // ---------------------------------------------------------------- the view
  // The hash's settings start a new run when they differ from the current one; a bare #train keeps the run going.
  // Bad settings: one line naming the field (the current run, or the defaults, stay).
  async function show() {
    if (!window.LAB_LIVE) throw new LabError(t("live.broken"), "file");
    let parsed = null; let error = null;
    if (S.query) { try { parsed = parseQuery(S.query); } catch (err) { error = err; } }
    if (!parsed && T.options) {
      build();
      if (error) showError(error); else writeHash();
      return;
    }
    if (!parsed) parsed = { options: training().check({}), hide: [] };
    T.hide = parsed.hide;
    if (T.options && hashOf(parsed.options, []) === hashOf(T.options, [])) { build(); writeHash(); }
    else await restart(parsed.options);
    if (error) showError(error);
  }

  register("train", {
    show,
    render: () => { if (T.options) build(); },
  });
})();
