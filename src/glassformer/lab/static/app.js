// glassformer lab: five views over the JSON API (or over the data embedded in an exported page).
// No framework, no build step: state in one object, each view re-rendered from it.
"use strict";
(function () {
  const I18N = window.LAB_I18N;
  const EMBED = window.LAB_EMBED || null;          // set only in the exported, offline page
  const LANG_KEY = "glassformer.lab.lang";
  const EXTRA = window.LAB_EXTRA_VIEWS || {};      // views kept in their own files (why.js): {show(L), render(L)}
  const VIEWS = ["block", "sentence", "masks", "claims", "patch", ...Object.keys(EXTRA)];
  const TOL = 1e-12;                                // a number "changed" when |Δ| exceeds this

  const S = {
    lang: pickLang(),
    view: "block",
    info: null,
    block: { base: null, tokens: null, which: "block", toggles: null, row: 0, current: null, prev: null,
             runs: 0, custom: "", presets: null, specOpen: false },
    sentence: { source: null, target: null, teacher: true, positions: true, swapped: false,
                results: null, row: null, sel: { enc: [0, 0], dec: [0, 0], cross: [0, 0] }, runs: 0 },
    masks: null,
    claims: null,
    patch: { clean: null, corrupt: null, target: null, predict: null, result: null, runs: 0 },
  };

  // ---------------------------------------------------------------- language
  function pickLang() {
    try {
      const stored = window.localStorage.getItem(LANG_KEY);
      if (stored === "zh" || stored === "en") return stored;
    } catch (e) { /* storage may be off (private mode, file://): fall through */ }
    const nav = (navigator.language || "zh").toLowerCase();
    return nav.startsWith("en") ? "en" : "zh";
  }

  function t(key, vars) {
    let s = I18N[S.lang][key];
    if (s === undefined) s = I18N.zh[key] !== undefined ? I18N.zh[key] : key;
    if (vars) for (const [k, v] of Object.entries(vars)) s = s.split("{" + k + "}").join(String(v));
    return s;
  }

  function setLang(lang) {
    S.lang = lang;
    try { window.localStorage.setItem(LANG_KEY, lang); } catch (e) { /* ignore */ }
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    applyStaticLabels();
    renderAll();
  }

  function applyStaticLabels() {
    document.querySelectorAll("[data-i18n]").forEach((node) => { node.textContent = t(node.dataset.i18n); });
    document.title = t("title");
  }

  // ---------------------------------------------------------------- small helpers
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k === "data") Object.entries(v).forEach(([dk, dv]) => { node.dataset[dk] = dv; });
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "style") node.setAttribute("style", v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined) return "−∞";
    let s = Number(v).toFixed(digits === undefined ? 6 : digits);
    if (/^-0\.0*$/.test(s)) s = s.slice(1);
    return s;
  }

  function fmtSmall(v) { return v === 0 ? "0" : (Math.abs(v) < 1e-3 ? v.toExponential(2) : fmt(v)); }

  function heat(v, maxAbs, positiveOnly) {
    if (v === null || v === undefined) return "background:#d9d9d9";
    const a = maxAbs > 0 ? Math.min(1, Math.abs(v) / maxAbs) * 0.72 : 0;
    const [r, g, b] = v >= 0 || positiveOnly ? [214, 69, 46] : [47, 103, 199];
    const mix = (c) => Math.round(255 * (1 - a) + c * a);
    return `background:rgb(${mix(r)},${mix(g)},${mix(b)})`;
  }

  function maxAbsOf(rows) {
    let m = 0;
    for (const row of rows) for (const v of row) if (v !== null && Math.abs(v) > m) m = Math.abs(v);
    return m;
  }

  const as2d = (a) => (Array.isArray(a[0]) ? a : [a]);

  function showError(err) {
    const box = document.getElementById("error");
    if (!err) { box.hidden = true; box.textContent = ""; return; }
    const field = err.field ? ` [${err.field}]` : "";
    box.textContent = `${t("error")}: ${err.message}${field}`;
    box.hidden = false;
  }

  class LabError extends Error {
    constructor(message, field) { super(message); this.field = field; }
  }

  let pending = 0;
  function busy(delta) {
    pending += delta;
    document.getElementById("busy").hidden = pending === 0;
  }

  async function api(method, path, body) {
    busy(+1);
    try { return await request(method, path, body); } finally { busy(-1); }
  }

  async function request(method, path, body) {
    const init = { method, headers: {} };
    if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    const response = await fetch(path, init);
    let data = null;
    try { data = await response.json(); } catch (e) { data = { error: response.statusText }; }
    if (!response.ok) throw new LabError(data.error || response.statusText, data.field);
    return data;
  }

  // ---------------------------------------------------------------- heat-map tables
  // data: 2-D rows (or one row); opts: probe, rowLabels, colLabels, hiRow, prev, digits, masked(i,j), title(i,j)
  function matrix(data, opts) {
    opts = opts || {};
    const rows = as2d(data);
    const prev = opts.prev ? as2d(opts.prev) : null;
    const sameShape = prev && prev.length === rows.length && prev.every((r, i) => r.length === rows[i].length);
    const maxAbs = maxAbsOf(rows);
    const table = el("table", { class: "heat" + (opts.compact ? " compact" : ""), data: opts.probe ? { probe: opts.probe } : {} });
    if (opts.colLabels) {
      table.append(el("thead", {}, el("tr", {}, opts.rowLabels ? el("th", {}) : null,
        opts.colLabels.map((c) => el("th", { text: c })))));
    }
    const body = el("tbody");
    rows.forEach((row, i) => {
      const tr = el("tr", { class: opts.hiRow === i ? "sel" : null, data: { row: String(i) } });
      if (opts.rowLabels) tr.append(el("th", { text: opts.rowLabels[i] }));
      row.forEach((v, j) => {
        const masked = opts.masked && opts.masked(i, j);
        let title = v === null ? "−∞" : String(v);
        let cls = masked ? "masked" : "";
        if (sameShape) {
          const p = prev[i][j];
          const changed = (p === null) !== (v === null) || (v !== null && Math.abs(v - p) > TOL);
          if (changed) {
            cls += " changed";
            const d = v === null || p === null ? "∞" : fmtSmall(v - p);
            title += "\n" + t("block.prevalue", { v: p === null ? "−∞" : String(p), d });
          }
        }
        if (opts.title) title = opts.title(i, j, v) + (title.includes("\n") ? title.slice(title.indexOf("\n")) : "");
        tr.append(el("td", { class: cls.trim() || null, title, style: masked ? null : heat(v, maxAbs, opts.positive) },
          masked ? "" : fmt(v, opts.digits)));
      });
      body.append(tr);
    });
    table.append(body);
    return table;
  }

  function card(n, title, ...content) {
    return el("div", { class: "card" }, el("h4", {}, n ? el("span", { class: "step" }, String(n)) : null, title),
      ...content);
  }

  // ---------------------------------------------------------------- view 1: the block walk
  function lessonToggles(spec) {
    const mask = Array.isArray(spec.mask) || spec.key_padding || spec.memory_padding ? "custom" : (spec.mask || "none");
    return { norm: spec.norm || "post", scale: spec.scale !== false, disabled: (spec.disabled_heads || []).slice(),
             mask };
  }

  function withToggles(base, tg) {
    const doc = JSON.parse(JSON.stringify(base));
    doc.scale = tg.scale;
    if (doc.kind !== "attention") {
      doc.norm = tg.norm;
      if (tg.disabled.length) doc.disabled_heads = tg.disabled.slice().sort((a, b) => a - b);
      else delete doc.disabled_heads;
    }
    const n = doc.kind === "attention" ? doc.k.length : doc.x.length;
    if (tg.mask === "none" || tg.mask === "causal") { doc.mask = tg.mask; delete doc.key_padding; }
    else if (tg.mask === "padding") { doc.mask = "none"; doc.key_padding = Array.from({ length: n }, (_, i) => i === n - 1); }
    return doc;
  }

  function variantKey(tg) {
    return `${tg.disabled.slice().sort((a, b) => a - b).join(",")}|${tg.norm}|${tg.scale ? 1 : 0}|${tg.mask}`;
  }

  function rowTimes(row, w, b) {                   // row · W (+ b), float64 like the server
    return w[0].map((_, j) => row.reduce((acc, x, r) => acc + x * w[r][j], b ? b[j] : 0));
  }

  // Every matrix the walk shows, by a stable key (so two results can be compared cell by cell).
  function blockValues(spec, res) {
    const vm = {};
    if (spec.kind === "attention") {
      vm["q"] = spec.q; vm["k"] = spec.k; vm["v"] = spec.v;
      for (const key of ["scores", "scaled_scores", "weights", "output"]) vm[key] = res[key];
      return vm;
    }
    vm["x"] = spec.x;
    (res.sublayers || []).forEach((sub, i) => {
      vm[`sub.${i}.input`] = sub.input; vm[`sub.${i}.residual`] = sub.residual; vm[`sub.${i}.normed`] = sub.normed;
      if (sub.name === "ffn") {
        const u = spec.norm === "pre" ? sub.normed : sub.input;
        vm["ffn.expand"] = u.map((row) => rowTimes(row, spec.ffn.w_1, spec.ffn.b_1));
        vm["ffn.hidden"] = res.ffn.hidden; vm["ffn.output"] = res.ffn.output;
      } else {
        const att = res[sub.name];
        att.heads.forEach((h, r) => {
          for (const key of ["q", "k", "v", "scores", "scaled_scores", "weights", "output"]) {
            vm[`${sub.name}.head.${r}.${key}`] = h[key];
          }
        });
        vm[`${sub.name}.concat`] = att.concat; vm[`${sub.name}.output`] = att.output;
      }
    });
    vm["output"] = res.output;
    return vm;
  }

  function countChanges(cur, prev) {
    if (!prev) return null;
    let n = 0; let d = 0; let m = 0;
    const keys = Object.keys(cur);
    if (keys.length !== Object.keys(prev).length) return null;
    for (const key of keys) {
      const a = as2d(cur[key]); const b = prev[key] ? as2d(prev[key]) : null;
      if (!b || a.length !== b.length) return null;
      for (let i = 0; i < a.length; i++) {
        if (a[i].length !== b[i].length) return null;
        for (let j = 0; j < a[i].length; j++) {
          const x = a[i][j]; const y = b[i][j];
          if ((x === null) !== (y === null)) { n++; m++; } else if (x !== null && Math.abs(x - y) > TOL) {
            n++; d = Math.max(d, Math.abs(x - y));
          }
        }
      }
    }
    return { n, d, m };
  }

  async function loadBlock() {
    if (S.block.base) return;
    if (!S.block.presets) S.block.presets = EMBED ? EMBED.block : await api("GET", "/api/block");
    usePreset("block");
    await runBlock();
  }

  function usePreset(which) {             // "block": the lesson's BLOCK; "exercise": its 2×3 attention example
    const b = S.block;
    b.which = which; b.base = which === "block" ? b.presets.spec : b.presets.exercise;
    b.tokens = which === "block" ? b.presets.tokens : null;
    b.toggles = lessonToggles(b.base); b.current = null; b.prev = null; b.row = 0;
  }

  async function runBlock() {
    const tg = S.block.toggles;
    const doc = withToggles(S.block.base, tg);
    let result;
    try {
      if (EMBED) {
        result = (EMBED.block_variants[S.block.which] || {})[variantKey(tg)];
        if (!result) throw new LabError("offline copy has no precomputed result for this combination", "toggles");
      } else {
        result = await api("POST", "/api/trace", doc);
      }
      showError(null);
    } catch (err) { showError(err); renderBlock(); return; }
    const values = blockValues(doc, result);
    S.block.prev = S.block.current;
    S.block.current = { spec: doc, result, values };
    renderBlock();
    S.block.runs += 1;
    document.body.dataset.blockRuns = String(S.block.runs);
  }

  function blockControls() {
    const b = S.block; const tg = b.toggles; const spec = b.base;
    const n = spec.kind === "attention" ? spec.q.length : spec.x.length;
    const heads = spec.kind === "attention" ? 0 : spec.self_attention.heads.length;
    const labels = rowLabelsOf(n);
    const rowButtons = Array.from({ length: n }, (_, i) => el("button", {
      type: "button", class: i === b.row ? "on" : null, data: { blockRow: String(i) },
      onclick: () => { b.row = i; renderBlock(); } }, labels[i]));
    const headButtons = Array.from({ length: heads }, (_, h) => {
      const off = tg.disabled.includes(h);
      return el("button", { type: "button", class: off ? "off" : "on", data: { head: String(h) }, "aria-pressed": String(!off),
        onclick: () => { tg.disabled = off ? tg.disabled.filter((x) => x !== h) : tg.disabled.concat([h]); runBlock(); } },
      `${t("block.headN", { n: h + 1 })}: ${off ? t("block.off") : t("block.on")}`);
    });
    const norm = el("select", { id: "norm", disabled: spec.kind === "attention", onchange: (e) => { tg.norm = e.target.value; runBlock(); } },
      ["post", "pre"].map((v) => el("option", { value: v, selected: tg.norm === v }, t("block." + v))));
    const scale = el("input", { type: "checkbox", id: "scale", checked: tg.scale, onchange: (e) => { tg.scale = e.target.checked; runBlock(); } });
    const maskChoices = ["none", "causal", "padding"].concat(tg.mask === "custom" ? ["custom"] : []);
    const mask = el("select", { id: "mask", onchange: (e) => { tg.mask = e.target.value; runBlock(); } },
      maskChoices.map((v) => el("option", { value: v, selected: tg.mask === v }, t("block.mask." + v))));
    return el("div", { class: "controls" },
      el("div", { class: "group" }, el("span", { class: "label" }, t("block.row")), rowButtons),
      heads ? el("div", { class: "group" }, el("span", { class: "label" }, t("block.heads")), headButtons) : null,
      el("label", { class: "group" }, el("span", { class: "label" }, t("block.norm")), norm),
      el("label", { class: "group" }, scale, t("block.scale")),
      el("label", { class: "group" }, el("span", { class: "label" }, t("block.mask")), mask));
  }

  function rowLabelsOf(n) {
    const tokens = S.block.which === "block" ? S.block.tokens || [] : [];
    return Array.from({ length: n }, (_, i) => t("block.rowN", { n: i + 1 }) + (tokens[i] ? ` ${tokens[i]}` : ""));
  }

  function specPanel() {
    const b = S.block;
    const area = el("textarea", { id: "spec-text", rows: "6", spellcheck: "false", readonly: !!EMBED,
      placeholder: '{"version": 1, "kind": "encoder_block", ...}' });
    area.value = b.custom;
    area.addEventListener("input", () => { b.custom = area.value; });
    const file = el("input", { type: "file", id: "spec-file", accept: ".json,application/json", disabled: !!EMBED,
      onchange: async (e) => {
        const f = e.target.files[0]; if (!f) return;
        b.custom = await f.text(); area.value = b.custom; runCustom();
      } });
    const details = el("details", { class: "spec", open: b.specOpen || b.which === "custom",
      ontoggle: (e) => { b.specOpen = e.target.open; } },
      el("summary", {}, `${t("block.source")}: ${t("block." + (b.which === "block" ? "lesson" : b.which))}`),
      el("p", {}, EMBED ? t("block.offline.custom") : t("block.paste")), area,
      el("div", { class: "row" },
        el("label", { class: "file" }, t("block.upload"), " ", file),
        el("button", { type: "button", id: "spec-run", disabled: !!EMBED, onclick: runCustom }, t("block.run")),
        el("button", { type: "button", id: "preset-block", disabled: b.which === "block",
          onclick: () => { usePreset("block"); runBlock(); } }, t("block.reset")),
        el("button", { type: "button", id: "preset-exercise", disabled: b.which === "exercise",
          onclick: () => { usePreset("exercise"); runBlock(); } }, t("block.exercise"))));
    return details;
  }

  async function runCustom() {
    let doc;
    try { doc = JSON.parse(S.block.custom); } catch (e) { showError(new LabError(`invalid JSON: ${e.message}`, "body")); return; }
    if (!doc || typeof doc !== "object" || Array.isArray(doc)) { showError(new LabError("a trace spec is a JSON object", "body")); return; }
    try { await api("POST", "/api/trace", doc); } catch (err) { showError(err); return; }   // validate first
    S.block.base = doc; S.block.which = "custom"; S.block.toggles = lessonToggles(doc);
    S.block.current = null; S.block.prev = null; S.block.row = 0;
    await runBlock();
  }

  function attentionCards(name, spec, values, prev, row, startStep, disabled, keyLabels) {
    const pv = (key) => (prev && prev[key] ? as2d(prev[key])[row] : undefined);
    const pm = (key) => (prev ? prev[key] : undefined);
    const att = spec[name]; const heads = att.heads.length; const scaled = spec.scale !== false;
    const dk = att.heads[0].w_q[0].length; const cross = name === "cross_attention";
    const cols = [];
    for (let h = 0; h < heads; h++) {
      const key = (k) => `${name}.head.${h}.${k}`;
      const w = values[key("weights")][row];
      const sum = w.reduce((a, x) => a + x, 0);
      const off = name === "self_attention" && disabled.includes(h);
      cols.push(el("div", { class: "head" + (off ? " disabled" : ""), data: { headCard: String(h) } },
        el("h5", {}, t("step.head", { n: h + 1 })),
        off ? el("p", { class: "note" }, t("block.headoff")) : null,
        el("div", { class: "sub" }, t("step.q")), matrix(values[key("q")][row], { probe: key("q"), prev: pv(key("q")) }),
        el("div", { class: "sub" }, t(cross ? "step.k.cross" : "step.k")), matrix(values[key("k")], { probe: key("k"), prev: pm(key("k")), rowLabels: keyLabels }),
        el("div", { class: "sub" }, t(cross ? "step.v.cross" : "step.v")), matrix(values[key("v")], { probe: key("v"), prev: pm(key("v")), rowLabels: keyLabels }),
        el("div", { class: "sub" }, t("step.scores")), matrix(values[key("scores")][row], { probe: key("scores"), prev: pv(key("scores")), colLabels: keyLabels }),
        el("div", { class: "sub" }, scaled ? `${t("step.scaled")} (√${dk} = ${fmt(Math.sqrt(dk))})` : t("step.unscaled")),
        matrix(values[key("scaled_scores")][row], { probe: key("scaled_scores"), prev: pv(key("scaled_scores")), colLabels: keyLabels }),
        el("div", { class: "sub" }, t("step.weights"), el("span", { class: "sum", data: { rowsum: String(h) } }, t("block.rowsum", { s: fmt(sum) }))),
        matrix(w, { probe: key("weights"), prev: pv(key("weights")), colLabels: keyLabels, positive: true }),
        el("div", { class: "sub" }, t("step.headout")), matrix(values[key("output")][row], { probe: key("output"), prev: pv(key("output")) })));
    }
    return [
      card(startStep, "Q, K, V → QKᵀ → ÷√d_k → softmax → ·V", el("div", { class: "heads" }, cols)),
      card(startStep + 1, t("step.concat"), matrix(values[`${name}.concat`][row], { probe: `${name}.concat`, prev: pv(`${name}.concat`) })),
      card(startStep + 2, t("step.wo"), matrix(values[`${name}.output`][row], { probe: `${name}.output`, prev: pv(`${name}.output`) })),
    ];
  }

  function renderBlock() {
    const root = document.getElementById("view-block");
    root.replaceChildren();
    root.append(el("h2", {}, t("block.heading")), el("p", { class: "intro" }, t("block.intro")));
    if (!S.block.base) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    root.append(specPanel(), blockControls());
    const cur = S.block.current;
    if (!cur) return;
    const prev = S.block.prev && S.block.prev.spec.kind === cur.spec.kind ? S.block.prev.values : null;
    const change = countChanges(cur.values, prev);
    root.append(el("p", { class: "changes", id: "changes" },
      change === null ? t("block.first") : change.n ? t("block.changes", { n: change.n, d: fmtSmall(change.d) }) +
        (change.m ? t("block.masked", { m: change.m }) : "") : t("block.nochange")),
    el("p", { class: "legend" }, t("block.legend")));
    const spec = cur.spec; const v = cur.values; const row = Math.min(S.block.row, as2d(v[spec.kind === "attention" ? "q" : "x"]).length - 1);
    const pv = (key) => (prev && prev[key] ? as2d(prev[key])[row] : undefined);
    const flow = el("div", { class: "flow" });
    let step = 1;
    if (spec.kind === "attention") {
      const labels = spec.k.map((_, j) => t("block.keyN", { n: j + 1 }));
      flow.append(card(step++, "Q, K, V", el("div", { class: "sub" }, "Q"), matrix(v.q, { probe: "q", hiRow: row, rowLabels: rowLabelsOf(v.q.length) }),
        el("div", { class: "sub" }, "K"), matrix(v.k, { probe: "k", rowLabels: labels }),
        el("div", { class: "sub" }, "V"), matrix(v.v, { probe: "v", rowLabels: labels })),
        card(step++, t("step.scores"), matrix(v.scores[row], { probe: "scores", prev: pv("scores"), colLabels: labels })),
        card(step++, spec.scale !== false ? t("step.scaled") : t("step.unscaled"), matrix(v.scaled_scores[row], { probe: "scaled_scores", prev: pv("scaled_scores"), colLabels: labels })),
        card(step++, t("step.weights"), matrix(v.weights[row], { probe: "weights", prev: pv("weights"), colLabels: labels, positive: true }),
          el("span", { class: "sum" }, t("block.rowsum", { s: fmt(v.weights[row].reduce((a, x) => a + x, 0)) }))),
        card(step++, t("step.headout"), matrix(v.output[row], { probe: "output", prev: pv("output") })));
      root.append(flow);
      return;
    }
    const n = spec.x.length;
    const selfLabels = rowLabelsOf(n);
    flow.append(card(step++, t("step.x"), el("p", { class: "note" }, t("step.x.note")),
      matrix(v.x, { probe: "x", hiRow: row, rowLabels: selfLabels })));
    const pre = spec.norm === "pre";
    cur.result.sublayers.forEach((sub, i) => {
      flow.append(el("h3", { class: "sublayer" }, t("step.sub." + sub.name)));
      if (pre) flow.append(card(step++, t("step.ln_before"), matrix(v[`sub.${i}.normed`][row], { probe: `sub.${i}.normed`, prev: pv(`sub.${i}.normed`) })));
      if (sub.name === "ffn") {
        flow.append(card(step++, t("step.expand"), el("p", { class: "note" }, t("step.expand.note")),
          matrix(v["ffn.expand"][row], { probe: "ffn.expand", prev: pv("ffn.expand") })),
        card(step++, t("step.relu"), matrix(v["ffn.hidden"][row], { probe: "ffn.hidden", prev: pv("ffn.hidden") })),
        card(step++, t("step.project"), matrix(v["ffn.output"][row], { probe: "ffn.output", prev: pv("ffn.output") })));
      } else {
        const keyLabels = sub.name === "cross_attention" ? spec.memory.map((_, j) => `H${j + 1}`) : selfLabels;
        flow.append(...attentionCards(sub.name, spec, v, prev, row, step, S.block.toggles.disabled, keyLabels));
        step += 3;
      }
      flow.append(card(step++, t("step.residual"), matrix(v[`sub.${i}.residual`][row], { probe: `sub.${i}.residual`, prev: pv(`sub.${i}.residual`) })));
      if (!pre) flow.append(card(step++, t("step.ln_after"), matrix(v[`sub.${i}.normed`][row], { probe: `sub.${i}.normed`, prev: pv(`sub.${i}.normed`) })));
    });
    flow.append(card(step++, t("step.output"), matrix(v.output[row], { probe: "output", prev: pv("output") })));
    root.append(flow);
  }

  // ---------------------------------------------------------------- view 2: a sentence
  function units(result) { return result.source; }

  function swapPair() { return S.info.swap; }              // the lesson's pair, from /api/info

  function swappedSource(result) {
    const [a, b] = swapPair(); const u = units(result);
    const i = u.indexOf(a); const j = u.indexOf(b);
    if (i < 0 || j < 0) return null;
    const w = u.slice(); w[i] = b; w[j] = a;
    return { text: w.join("／"), i, j };
  }

  async function loadSentence() {
    if (S.sentence.source !== null) return;
    if (!S.info) S.info = EMBED ? EMBED.info : await api("GET", "/api/info");
    S.sentence.source = S.info.default_source; S.sentence.target = S.info.default_target;
    await runSentence();
  }

  async function runSentence() {
    const st = S.sentence;
    const target = st.teacher ? st.target : null;
    let original; let swapped = null; let swap = null;
    try {
      if (EMBED) {
        original = EMBED.sentence[`${st.positions ? 1 : 0}|0`];
        swapped = EMBED.sentence[`${st.positions ? 1 : 0}|1`];
        swap = swappedSource(original);
      } else {
        const body = { source: st.source, positions: st.positions };
        if (target) body.target = target;
        original = await api("POST", "/api/sentence", body);
        swap = swappedSource(original);
        if (swap) swapped = await api("POST", "/api/sentence", Object.assign({}, body, { source: swap.text }));
      }
      showError(null);
    } catch (err) { showError(err); return; }
    st.results = { original, swapped, swap };
    if (st.row === null || st.row >= original.next_tokens.length) {
      const gave = original.target.indexOf("gave");
      st.row = gave >= 0 ? gave : 0;
    }
    renderSentence();
    st.runs += 1;
    document.body.dataset.sentenceRuns = String(st.runs);
  }

  function compareSwap(res) {
    const { original: o, swapped: s, swap } = res;
    if (!s || !swap) return null;
    const p = (x) => (x === swap.i ? swap.j : x === swap.j ? swap.i : x);
    let enc = 0;
    o.encoder_self_attention.forEach((layer, l) => layer.forEach((A, h) => {
      const B = s.encoder_self_attention[l][h];
      for (let a = 0; a < B.length; a++) for (let b = 0; b < B.length; b++) enc = Math.max(enc, Math.abs(B[a][b] - A[p(a)][p(b)]));
    }));
    let out = null;
    if (o.target_ids.join(",") === s.target_ids.join(",")) {
      out = 0;
      o.next_tokens.forEach((r, i) => { out = Math.max(out, Math.abs(r.next_prob - s.next_tokens[i].next_prob)); });
    }
    return { enc, out };
  }

  function pickers(which, n) {
    const st = S.sentence; const sel = st.sel[which];
    const layer = el("select", { data: { picker: which + "-layer" }, onchange: (e) => { sel[0] = +e.target.value; renderSentence(); } },
      Array.from({ length: n.layers }, (_, i) => el("option", { value: String(i), selected: sel[0] === i }, `${t("sentence.layer")} ${i + 1}`)));
    const head = el("select", { data: { picker: which + "-head" }, onchange: (e) => { sel[1] = +e.target.value; renderSentence(); } },
      Array.from({ length: n.heads }, (_, i) => el("option", { value: String(i), selected: sel[1] === i }, `${t("sentence.head")} ${i + 1}`)));
    return el("span", { class: "pickers" }, layer, head);
  }

  function renderSentence() {
    const st = S.sentence;
    const root = document.getElementById("view-sentence");
    root.replaceChildren();
    root.append(el("h2", {}, t("sentence.heading")), el("p", { class: "intro" }, t("sentence.intro")));
    if (!st.results) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    const res = st.swapped && st.results.swapped ? st.results.swapped : st.results.original;
    const [a, b] = swapPair();
    const model = res.model;
    root.append(el("p", { class: "badge " + (model.trained ? "trained" : "untrained"), id: "model-label" },
      el("strong", {}, `${t("sentence.model")}: ${model.trained ? t("trained") : t("untrained")}`), " — ",
      model.label[S.lang], ` (d=${model.config.d_model}, ${model.config.encoder_layers}+${model.config.decoder_layers}, ${model.config.heads}×)`));
    const src = el("input", { type: "text", id: "sent-source", value: st.source, readonly: !!EMBED, size: "36" });
    const tgt = el("input", { type: "text", id: "sent-target", value: st.target, readonly: !!EMBED, disabled: !st.teacher, size: "36" });
    src.addEventListener("change", () => { st.source = src.value; st.swapped = false; });
    tgt.addEventListener("change", () => { st.target = tgt.value; });
    root.append(el("div", { class: "controls" },
      el("label", { class: "group" }, el("span", { class: "label" }, t("sentence.source")), src),
      el("label", { class: "group" }, el("span", { class: "label" }, t("sentence.target")), tgt),
      el("label", { class: "group" }, el("input", { type: "checkbox", id: "sent-teacher", checked: st.teacher, disabled: !!EMBED,
        onchange: (e) => { st.teacher = e.target.checked; runSentence(); } }), t("sentence.teacher")),
      el("label", { class: "group" }, el("input", { type: "checkbox", id: "sent-positions", checked: st.positions,
        onchange: (e) => { st.positions = e.target.checked; runSentence(); } }),
      `${t("sentence.positions")}: ${st.positions ? t("sentence.positions.on") : t("sentence.positions.off")}`),
      el("button", { type: "button", id: "sent-run", disabled: !!EMBED, onclick: () => { st.source = src.value; st.target = tgt.value; st.swapped = false; st.row = null; runSentence(); } }, t("sentence.run")),
      el("button", { type: "button", id: "sent-swap", disabled: !st.results.swapped,
        onclick: () => { st.swapped = !st.swapped; renderSentence(); } }, t("sentence.swap", { a, b }))));
    root.append(el("p", { class: "note", id: "sent-showing" },
      st.results.swapped ? (st.swapped ? t("sentence.swapped") : t("sentence.original")) : t("sentence.noswap", { a, b })));
    if (res.unknown && res.unknown.length) root.append(el("p", { class: "note" }, t("sentence.unknown", { u: res.unknown.join(" ") })));
    root.append(el("p", { class: "translation" }, el("strong", {}, `${res.mode === "greedy" ? t("sentence.greedy") : t("sentence.forced")}: `),
      el("span", { id: "translation" }, res.translation)));

    const cmp = compareSwap(st.results);
    if (cmp) {
      const equi = cmp.enc < 1e-5;
      root.append(el("div", { class: "compare " + (equi ? "equal" : "differs"), id: "swap-check" },
        el("h3", {}, t("sentence.compare", { a, b })),
        el("p", {}, t("sentence.compare.enc", { d: cmp.enc.toExponential(2) })),
        cmp.out !== null ? el("p", {}, t("sentence.compare.out", { d: cmp.out.toExponential(2) })) : null,
        el("p", { class: "verdict" }, equi ? t("sentence.compare.equi") : t("sentence.compare.broken"))));
    }

    const srcLabels = res.source; const tgtLabels = res.target;
    const sel = st.sel;
    const clamp = (s, n) => { s[0] = Math.min(s[0], n.layers - 1); s[1] = Math.min(s[1], n.heads - 1); };
    const encN = { layers: res.layers.encoder, heads: res.heads }; const decN = { layers: res.layers.decoder, heads: res.heads };
    clamp(sel.enc, encN); clamp(sel.dec, decN); clamp(sel.cross, decN);
    const exact = (rl, cl) => (i, j, v) => `${rl[i]} → ${cl[j]}: ${fmt(v)}`;
    const grids = el("div", { class: "grids" },
      el("div", { class: "panel" }, el("h3", {}, t("sentence.enc")), pickers("enc", encN),
        matrix(res.encoder_self_attention[sel.enc[0]][sel.enc[1]], { probe: "encoder_self", rowLabels: srcLabels, colLabels: srcLabels,
          digits: 2, positive: true, compact: true, title: exact(srcLabels, srcLabels) })),
      el("div", { class: "panel" }, el("h3", {}, t("sentence.dec")), pickers("dec", decN),
        matrix(res.decoder_self_attention[sel.dec[0]][sel.dec[1]], { probe: "decoder_self", rowLabels: tgtLabels, colLabels: tgtLabels,
          digits: 2, positive: true, compact: true, masked: (i, j) => j > i, hiRow: st.row, title: exact(tgtLabels, tgtLabels) })),
      el("div", { class: "panel" }, el("h3", {}, t("sentence.cross")), pickers("cross", decN),
        matrix(res.cross_attention[sel.cross[0]][sel.cross[1]], { probe: "cross", rowLabels: tgtLabels, colLabels: srcLabels,
          digits: 2, positive: true, compact: true, hiRow: st.row, title: exact(tgtLabels, srcLabels) })));
    root.append(grids);

    // next tokens
    const rows = res.next_tokens;
    const row = Math.min(st.row || 0, rows.length - 1);
    const r = rows[row];
    const list = el("div", { class: "rowpick" }, el("span", { class: "label" }, t("sentence.next.pick")),
      rows.map((x, i) => el("button", { type: "button", class: i === row ? "on" : null, data: { nextRow: String(i), input: x.input },
        onclick: () => { st.row = i; renderSentence(); } }, `${x.input} → ${x.next}`)));
    const maxP = Math.max(...r.top.map((x) => x.prob), r.next_prob, 1e-9);
    const top = el("table", { class: "top", id: "next-top" }, el("tbody", {}, r.top.map((x) => el("tr", { class: x.id === r.next_id ? "label" : null },
      el("td", { class: "tok" }, x.token), el("td", { class: "p" }, fmt(x.prob)),
      el("td", { class: "bar" }, el("span", { style: `width:${Math.round(100 * x.prob / maxP)}%` }))))));
    root.append(el("div", { class: "next", id: "next-panel" }, el("h3", {}, t("sentence.next")), list,
      el("p", {}, t("sentence.next.row", { i: row + 1, t: r.input, seen: tgtLabels.slice(0, row + 1).join(" ") })),
      el("p", { class: "label-line", id: "next-label" }, t("sentence.next.label", { t: r.next, p: fmt(r.next_prob), r: r.next_rank })),
      el("h4", {}, t("sentence.next.top", { k: r.top.length })), top));
  }

  // ---------------------------------------------------------------- view 3: masks
  function boolGrid(rows, opts) {
    opts = opts || {};
    const table = el("table", { class: "bool", data: opts.probe ? { probe: opts.probe } : {} });
    if (opts.colLabels) table.append(el("thead", {}, el("tr", {}, el("th", {}), opts.colLabels.map((c) => el("th", { text: c })))));
    table.append(el("tbody", {}, rows.map((row, i) => el("tr", {}, opts.rowLabels ? el("th", { text: opts.rowLabels[i] }) : null,
      row.map((v) => el("td", { class: v ? "yes" : "no", title: String(v) }, v ? "✓" : ""))))));
    return table;
  }

  async function loadMasks() {
    if (S.masks) return;
    try { S.masks = EMBED ? EMBED.masks : await api("GET", "/api/masks"); showError(null); } catch (err) { showError(err); return; }
    renderMasks();
    document.body.dataset.masksReady = "1";
  }

  function renderMasks() {
    const root = document.getElementById("view-masks");
    root.replaceChildren();
    root.append(el("h2", {}, t("masks.heading")), el("p", { class: "intro" }, t("masks.intro")));
    const m = S.masks;
    if (!m) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    const pos = m.causal.map((_, i) => String(i));
    const tokensTable = (seqs, flags) => el("table", { class: "tokens" }, el("tbody", {}, seqs.map((seq, s) => el("tr", {},
      el("th", {}, t("masks.sample", { s: m.samples[s] })),
      seq.map((tok, j) => el("td", { class: flags && flags[s][j] ? "pad" : null }, tok))))));
    root.append(el("div", { class: "grids" },
      el("div", { class: "panel" }, el("h3", {}, t("masks.source")), tokensTable(m.source, m.source_padding),
        el("p", { class: "note" }, t("masks.pad")), boolGrid(m.source_padding, { probe: "source_padding", rowLabels: m.samples, colLabels: pos })),
      el("div", { class: "panel" }, el("h3", {}, t("masks.target")), el("p", { class: "note" }, t("masks.input")), tokensTable(m.target_input, m.target_padding),
        el("p", { class: "note" }, t("masks.labels")), tokensTable(m.labels, m.loss_mask.map((r) => r.map((x) => !x)))),
      el("div", { class: "panel" }, el("h3", {}, t("masks.causal")), boolGrid(m.causal, { probe: "causal", rowLabels: pos, colLabels: pos }))));
    const per = (key, title, rowTok, colTok) => el("div", { class: "grids" }, m.samples.map((s, k) => el("div", { class: "panel" },
      el("h3", {}, t(title, { s })), boolGrid(m[key][k], { probe: `${key}.${s}`, rowLabels: rowTok[k], colLabels: colTok[k] }))));
    root.append(per("decoder_self", "masks.decoder_self", m.target_input, m.target_input),
      per("encoder_self", "masks.encoder_self", m.source, m.source),
      per("cross", "masks.cross", m.target_input, m.source));
    root.append(el("div", { class: "panel" }, el("h3", {}, t("masks.loss")),
      boolGrid(m.loss_mask, { probe: "loss_mask", rowLabels: m.samples, colLabels: pos }),
      el("ul", { id: "loss-terms" }, m.samples.map((s, k) => el("li", {}, t("masks.terms", { s, n: m.loss_terms[k] }))))));
  }

  // ---------------------------------------------------------------- view 4: claims
  async function loadClaims() {
    if (S.claims) return;
    renderClaims();
    try { S.claims = EMBED ? EMBED.verify : await api("GET", "/api/verify"); showError(null); } catch (err) { showError(err); return; }
    renderClaims();
    document.body.dataset.claimsReady = "1";
  }

  function renderClaims() {
    const root = document.getElementById("view-claims");
    root.replaceChildren();
    root.append(el("h2", {}, t("claims.heading")), el("p", { class: "intro" }, t("claims.intro")));
    const c = S.claims;
    if (!c) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    root.append(el("p", { class: "summary" }, t("claims.summary", { p: c.passed, n: c.total })));
    root.append(el("table", { class: "claims", id: "claims-table" },
      el("thead", {}, el("tr", {}, ["claims.id", "claims.title", "claims.measured", "claims.passed", "claims.view"].map((k) => el("th", {}, t(k))))),
      el("tbody", {}, c.claims.map((r) => el("tr", { class: r.passed ? "pass" : "fail", data: { claim: r.id } },
        el("td", {}, r.id), el("td", {}, r.title), el("td", { class: "measured" }, r.measured === null ? "" : String(r.measured)),
        el("td", {}, r.passed ? `✓ ${t("claims.pass")}` : `✗ ${t("claims.fail")}`),
        el("td", {}, r.view ? el("a", { href: r.view }, `→ ${t("nav." + r.view.slice(1))}`) : t("claims.none")))))));
  }

  // ---------------------------------------------------------------- view 5: activation patching
  async function loadPatch() {
    const st = S.patch;
    if (st.clean !== null) return;
    if (EMBED) { renderPatch(); return; }                 // patching needs the server: one forward pass per cell
    if (!S.info) S.info = await api("GET", "/api/info");
    st.clean = S.info.default_source; st.corrupt = S.info.patch_corrupt; st.target = S.info.default_target;
    st.predict = S.info.patch_predict;
    await runPatch();
  }

  async function runPatch() {
    const st = S.patch;
    renderPatch();
    try {
      st.result = await api("POST", "/api/patch", { clean: st.clean, corrupt: st.corrupt, target: st.target, predict: st.predict });
      showError(null);
    } catch (err) { showError(err); return; }
    renderPatch();
    st.runs += 1;
    document.body.dataset.patchRuns = String(st.runs);
  }

  function fractionGrid(rows, rowLabels, colLabels, probe) {
    const cell = (c) => el("td", { class: "num", style: heat(c.fraction, 1), title: `p = ${fmt(c.p, 4)}` },
      c.fraction === null ? "n/a" : fmt(c.fraction, 2));
    return el("table", { class: "heat", data: { probe } },
      el("thead", {}, el("tr", {}, el("th", {}), colLabels.map((c) => el("th", { text: c })))),
      el("tbody", {}, rows.map((row, i) => el("tr", {}, el("th", { text: rowLabels[i] }), row.map(cell)))));
  }

  function renderPatch() {
    const root = document.getElementById("view-patch");
    const st = S.patch;
    root.replaceChildren();
    root.append(el("h2", {}, t("patch.heading")), el("p", { class: "intro" }, t("patch.intro")));
    if (EMBED) { root.append(el("p", { class: "note" }, t("patch.offline"))); return; }
    if (st.clean === null) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    const input = (id, key, size) => {
      const node = el("input", { type: "text", id, value: st[key], size });
      node.addEventListener("change", () => { st[key] = node.value; });
      return node;
    };
    const fields = [["patch-clean", "clean", "30"], ["patch-corrupt", "corrupt", "30"], ["patch-target", "target", "30"],
      ["patch-predict", "predict", "8"]].map(([id, key, size]) => [key, input(id, key, size)]);
    root.append(el("div", { class: "controls" },
      fields.map(([key, node]) => el("label", { class: "group" }, el("span", { class: "label" }, t("patch." + key)), node)),
      el("button", { type: "button", id: "patch-run", onclick: () => { fields.forEach(([key, node]) => { st[key] = node.value; }); runPatch(); } },
        t("patch.run"))));
    const r = st.result;
    if (!r) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    const run = r.runs[0];
    root.append(el("p", { class: "badge " + (r.model.trained ? "trained" : "untrained") }, el("strong", {},
      `${t("sentence.model")}: ${r.model.trained ? t("trained") : t("untrained")}`), " — ", r.model.label[S.lang]));
    root.append(el("p", { id: "patch-quantity" }, t("patch.quantity", { w: r.predict, i: r.row, seen: r.row_sees.join(" ") })));
    root.append(el("p", { id: "patch-probs" }, t("patch.probs", { c: fmt(run.p_clean, 4), x: fmt(run.p_corrupt, 4),
      all: run.all_heads.fraction === null ? "n/a" : fmt(run.all_heads.fraction, 2) })));
    root.append(el("div", { class: "panel" }, el("h3", {}, t("patch.heads")), el("p", { class: "note" }, t("patch.heads.note")),
      fractionGrid(run.heads, run.heads.map((_, i) => `L${i}`), run.heads[0].map((_, h) => `h${h}`), "patch.heads")));
    if (run.positions) {
      const labels = run.position_layers.map((n) => (n === "encoder.embedding" ? "emb" : "L" + n.split(".")[1]));
      root.append(el("div", { class: "panel" }, el("h3", {}, t("patch.positions")), el("p", { class: "note" }, t("patch.positions.note")),
        fractionGrid(run.positions, labels, run.units, "patch.positions")));
    }
  }

  // ---------------------------------------------------------------- routing
  // what an extra view gets from this page: its helpers and the shared state it may read
  const LAB = { t, el, api, fmt, heat, showError, embed: EMBED, lang: () => S.lang,
                info: async () => S.info || (S.info = await api("GET", "/api/info")) };

  function renderAll() {
    Object.values(EXTRA).forEach((v) => v.render(LAB));
    if (S.block.base) renderBlock();
    if (S.sentence.results) renderSentence();
    if (S.masks) renderMasks();
    if (S.claims) renderClaims();
    if (S.patch.clean !== null || EMBED) renderPatch();
    document.getElementById("lang").textContent = t("lang.switch");
  }

  async function show() {
    const name = (location.hash || "#block").slice(1);
    S.view = VIEWS.includes(name) ? name : "block";
    document.querySelectorAll("[data-view]").forEach((sec) => { sec.hidden = sec.dataset.view !== S.view; });
    document.querySelectorAll("[data-view-link]").forEach((a) => a.classList.toggle("on", a.dataset.viewLink === S.view));
    try {
      if (S.view === "block") { if (!S.block.base) renderBlock(); await loadBlock(); }
      else if (S.view === "sentence") { if (!S.sentence.results) renderSentence(); await loadSentence(); }
      else if (S.view === "masks") { if (!S.masks) renderMasks(); await loadMasks(); }
      else if (S.view === "patch") { if (!S.patch.result) renderPatch(); await loadPatch(); }
      else if (EXTRA[S.view]) await EXTRA[S.view].show(LAB);
      else await loadClaims();
    } catch (err) { showError(err); }
  }

  function start() {
    document.documentElement.lang = S.lang === "zh" ? "zh-CN" : "en";
    applyStaticLabels();
    document.getElementById("offline").hidden = !EMBED;
    document.getElementById("lang").addEventListener("click", () => setLang(S.lang === "zh" ? "en" : "zh"));
    window.addEventListener("hashchange", show);
    document.body.dataset.ready = "1";
    show();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
