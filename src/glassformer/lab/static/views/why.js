// glassformer lab, view 6 "why" (#why): attribution map target × (source | target prefix) with each row's source share,
// the contrast box, the logit lens.
"use strict";
(function () {
  const { S, t, el, api, info, live, busy, fmt, heat, showError, register } = window.LAB;
  const METHODS = ["integrated-gradients", "input-x-gradient", "saliency", "attention", "alti"];
  const SVG = "http://www.w3.org/2000/svg";
  const W = (S.why = {
    source: null, target: null, method: "integrated-gradients", contrast: "her", steps: "auto", tolerance: "0.01",
    result: null, runs: 0, origin: null, progress: null,
  });

  async function show() {
    if (W.source !== null) { render(); return; }
    const lab = await info();
    W.source = lab.default_source; W.target = lab.default_target;
    if (lab.toy) W.contrast = "";                       // a toy's symbols: no lesson contrast word
    await run();
  }

  // "64" → 64, "0.01" → 0.01; anything else ("auto", a typo) goes as typed and the engine or server names the field
  const asNumber = (v) => (/^\s*\d+(\.\d+)?([eE]-?\d+)?\s*$/.test(String(v)) ? Number(v) : String(v).trim());

  // Computed in the page (the engine in a worker: gradients by its backward pass), or by the server for a model
  // the page cannot run. attention and alti do not depend on the predicted word: the contrast is dropped for them.
  async function run() {
    render();
    const contrast = W.contrast.trim() && W.method !== "attention" && W.method !== "alti" ? W.contrast.trim() : null;
    const body = { source: W.source, target: W.target.trim() ? W.target : null, method: W.method, contrast,
      steps: asNumber(W.steps), tolerance: asNumber(W.tolerance) };
    busy(+1);
    try {
      const L = await live();
      if (L) {
        W.progress = { done: 0, total: 0 };
        renderProgress();
        W.result = await L.attribute(body, (p) => { W.progress = p; renderProgress(); });
        W.origin = "live";
      } else {
        W.result = await api("POST", "/api/attribute", body);
        W.origin = "server";
      }
      showError(null);
    } catch (err) { showError(err); return; } finally { W.progress = null; renderProgress(); busy(-1); }
    render();
    W.runs += 1;
    document.body.dataset.whyRuns = String(W.runs);
  }

  function renderProgress() {                    // forward–backward passes so far (the worker computes; the tab stays usable)
    const node = document.getElementById("why-progress");
    if (!node) return;
    const p = W.progress;
    node.hidden = !p;
    node.textContent = p ? t("why.progress", { d: p.done, n: p.total || "…" }) : "";
  }

  function controls() {
    const text = (id, key, size) => el("input", { type: "text", id, value: W[key], size, onchange: (e) => { W[key] = e.target.value; } });
    const method = el("select", { id: "why-method", onchange: (e) => { W.method = e.target.value; run(); } },
      METHODS.map((m) => el("option", { value: m, selected: W.method === m }, t("why.method." + m))));
    const fields = [["why.source", text("why-source", "source", "30")], ["why.target", text("why-target", "target", "30")],
      ["why.method", method], ["why.contrast", text("why-contrast", "contrast", "8")], ["why.steps", text("why-steps", "steps", "5")],
      ["why.tolerance", text("why-tolerance", "tolerance", "5")]];
    return el("div", { class: "controls" },
      fields.map(([key, node]) => el("label", { class: "group" }, el("span", { class: "label" }, t(key)), node)),
      el("button", { type: "button", id: "why-run", onclick: () => {
        ["source", "target", "contrast", "steps", "tolerance"].forEach((k) => { W[k] = document.getElementById("why-" + k).value; });
        run();
      } }, t("why.run")));
  }

  // the map: one row per target word; source units, a gap, then the target inputs that row can see
  function attributionMap(r) {
    const prefixNames = r.rows.reduce((a, row) => (row.prefix.length > a.length ? row.prefix.map((p) => p[0]) : a), []);
    let maxAbs = 0;
    r.rows.forEach((row) => [...row.source, ...row.prefix].forEach(([, v]) => { maxAbs = Math.max(maxAbs, Math.abs(v)); }));
    const positive = r.method === "saliency" || r.method === "attention" || r.method === "alti";
    const cell = (v) => el("td", { class: "num", style: heat(v, maxAbs, positive), title: String(v) }, fmt(v, 2));
    return el("table", { class: "heat compact", data: { probe: "why.map" } },
      el("thead", {}, el("tr", {}, el("th", {}), r.details.units.map((u) => el("th", { class: "src", text: u })),
        el("th", { class: "gap" }, "│"), prefixNames.map((p) => el("th", { class: "pre", text: p })),
        el("th", { class: "gap" }, "│"), el("th", { class: "share", title: t("why.share.note") }, t("why.share")))),
      el("tbody", {}, r.rows.map((row) => el("tr", { data: { token: row.token, position: String(row.position) } },
        el("th", { text: row.token }), row.source.map(([, v]) => cell(v)), el("td", { class: "gap" }, "│"),
        prefixNames.map((_, k) => (k < row.prefix.length ? cell(row.prefix[k][1]) : el("td", { class: "masked" }))),
        el("td", { class: "gap" }, "│"), shareBar(row.source_share)))));
  }

  // the row's source share: a bar of the cell's width (source on the left, the target prefix the rest); null: none
  function shareBar(share) {
    if (share === null || share === undefined) return el("td", { class: "share none", title: t("why.share.none") }, "—");
    const pct = Math.round(1000 * share) / 10;
    return el("td", { class: "share", data: { share: String(share) }, title: t("why.share.row", { p: fmt(100 * share, 1) }) },
      el("span", { style: "display:inline-block;width:5rem;height:0.7rem;background:#e4e7eb;border-radius:0.2rem;"
        + "vertical-align:middle;margin-right:0.3rem;overflow:hidden" },
        el("span", { class: "share-bar", style: `display:block;height:100%;width:${pct}%;background:#d6452e` })),
      fmt(share, 2));
  }

  function contrastBox(r) {
    const lens = r.details.lens;
    const row = r.rows.find((w) => w.position === lens.row) || null;
    const quantity = r.method === "alti" ? t("why.quantity.alti")
      : r.contrast ? t("why.quantity.contrast", { w: lens.token, c: r.contrast }) : t("why.quantity.plain");
    const lines = [el("p", {}, quantity)];
    if (row && r.method !== "attention") {
      const top = row.source.reduce((a, b) => (Math.abs(b[1]) > Math.abs(a[1]) ? b : a));
      lines.push(el("p", { id: "why-top" }, t("why.top", { i: lens.row, w: row.token, u: top[0], v: fmt(top[1], 3) })));
      if (row.delta !== null) {
        lines.push(el("p", { class: "note", id: "why-complete" }, t("why.complete",
          { s: fmt(row.sum, 4), d: fmt(row.delta, 4), e: fmt(100 * row.error, 2), n: row.steps })));
      }
    }
    const spec = r.integration;
    if (spec && spec.unconverged.length) {                 // rows whose scores do not add up to their change of f
      const over = r.rows.filter((w) => w.error > spec.tolerance)
        .map((w) => t("why.over.row", { w: w.token, e: fmt(100 * w.error, 2), n: w.steps })).join(", ");
      lines.push(el("p", { class: "error", id: "why-unconverged" }, t("why.over", { t: fmt(100 * spec.tolerance, 2), rows: over })));
    }
    lines.push(el("p", { id: "why-probs" }, r.contrast
      ? t("why.probs.contrast", { w: lens.token, c: r.contrast, p: fmt(lens.p_model, 4), q: fmt(lens.p_contrast_model, 4) })
      : t("why.probs.plain", { w: lens.token, p: fmt(lens.p_model, 4) })));
    return el("div", { class: "panel", id: "why-contrast-box" }, el("h3", {}, t("why.contrast.heading")), ...lines);
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    Object.entries(attrs).forEach(([k, v]) => node.setAttribute(k, String(v)));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function lensCurve(r) {
    const lens = r.details.lens;
    const steps = lens.steps;
    const gap = 100, w = 90 + gap * steps.length, h = 230, top = 34, bottom = 170, left = 50;
    const peak = Math.max(1e-9, ...steps.map((s) => s.p), ...steps.map((s) => s.p_contrast || 0));
    const x = (i) => left + 45 + gap * i;
    const y = (p) => bottom - (bottom - top) * (p / peak);
    const chart = svg("svg", { id: "why-lens-chart", width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
    chart.append(svg("line", { x1: left, y1: bottom, x2: w - 10, y2: bottom, stroke: "#5b6570" }),
      svg("line", { x1: left, y1: top, x2: left, y2: bottom, stroke: "#5b6570" }),
      svg("text", { x: 4, y: top + 4, "font-size": 11 }, fmt(peak, 3)), svg("text", { x: 4, y: bottom, "font-size": 11 }, "0"));
    const series = [["p", "#d6452e", lens.token]];
    if (lens.contrast) series.push(["p_contrast", "#2f67c7", lens.contrast]);
    series.forEach(([key, colour, word], k) => {
      chart.append(svg("polyline", { fill: "none", stroke: colour, "stroke-width": 2,
        points: steps.map((s, i) => `${x(i)},${y(s[key])}`).join(" ") }));
      steps.forEach((s, i) => chart.append(svg("circle", { cx: x(i), cy: y(s[key]), r: 3, fill: colour })));
      chart.append(svg("text", { x: left + 10 + 90 * k, y: 14, fill: colour, "font-size": 12 }, `● p(${word})`));
    });
    steps.forEach((s, i) => chart.append(svg("text", { x: x(i), y: bottom + 18, "font-size": 10, "text-anchor": "middle" },
      `L${s.layer} ${t("why.sub." + s.sublayer)}`)));
    const table = el("table", { class: "heat", data: { probe: "why.lens" } },
      el("thead", {}, el("tr", {}, el("th", {}), steps.map((s) => el("th", { text: `L${s.layer} ${t("why.sub." + s.sublayer)}` })))),
      el("tbody", {}, series.map(([key, , word]) => el("tr", {}, el("th", { text: `p(${word})` }),
        steps.map((s) => el("td", { class: "num" }, fmt(s[key], 4)))))));
    const reading = r.model.config.norm_placement === "pre" ? t("why.reading.pre") : t("why.reading.post");
    return el("div", { class: "panel", id: "why-lens" }, el("h3", {}, t("why.lens.heading", { i: lens.row, seen: lens.sees.join(" ") })),
      el("p", { class: "note" }, reading), chart, table);
  }

  function render() {
    const root = document.getElementById("view-why");
    if (!root) return;
    root.replaceChildren(el("h2", {}, t("why.heading")), el("p", { class: "intro" }, t("why.intro")));
    if (W.source === null) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    root.append(controls());
    root.append(el("p", { class: "note", id: "why-progress", hidden: !W.progress },
      W.progress ? t("why.progress", { d: W.progress.done, n: W.progress.total || "…" }) : ""));
    const r = W.result;
    if (!r) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    root.append(el("p", { class: "badge " + (r.model.trained ? "trained" : "untrained") }, el("strong", {},
      `${t("sentence.model")}: ${r.model.trained ? t("trained") : t("untrained")}`), " — ", r.model.label[S.lang]));
    if (W.origin === "live") root.append(el("p", { class: "note", id: "why-live" }, t("why.live")));
    root.append(el("p", { class: "note", id: "why-method-note" }, t("why.note." + r.method,
      { n: r.details.steps, rule: r.integration ? t("why.rule." + r.integration.rule) : "" })));
    root.append(el("div", { class: "panel" }, el("h3", {}, t("why.map.heading")), el("p", { class: "note" }, t("why.map.note")),
      el("div", { style: "overflow-x:auto" }, attributionMap(r))));
    root.append(contrastBox(r), lensCurve(r));
  }

  register("why", {
    show,
    render: () => { if (W.source !== null) render(); },
    reset: () => { W.source = null; W.target = null; W.result = null; W.contrast = "her"; },
  });
})();
