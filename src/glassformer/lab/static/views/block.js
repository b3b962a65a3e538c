// glassformer lab, view 1 "block" (#block): one encoder block (or the 2×3 attention exercise) walked step by step, with its switches.
"use strict";
(function () {
  const { S, EMBED, TOL, t, el, api, live, fmt, fmtSmall, as2d, matrix, showError, LabError, register } = window.LAB;

  S.block = { base: null, tokens: null, which: "block", toggles: null, row: 0, current: null, prev: null,
              runs: 0, custom: "", presets: null, specOpen: false };

  function card(n, title, ...content) {
    return el("div", { class: "card" }, el("h4", {}, n ? el("span", { class: "step" }, String(n)) : null, title),
      ...content);
  }

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

  // a trace spec through engine/trace.js in the page (the same numbers as POST /api/trace), else the server
  async function trace(doc) {
    const L = await live();
    if (!L) return api("POST", "/api/trace", doc);
    try { return await L.trace(doc); } catch (err) {
      const m = /^([\w.[\]]+): /.exec(err.message);
      throw new LabError(err.message, m ? m[1] : "body");
    }
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
      result = await trace(doc);
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
    const area = el("textarea", { id: "spec-text", rows: "6", spellcheck: "false",
      placeholder: '{"version": 1, "kind": "encoder_block", ...}' });
    area.value = b.custom;
    area.addEventListener("input", () => { b.custom = area.value; });
    const file = el("input", { type: "file", id: "spec-file", accept: ".json,application/json",
      onchange: async (e) => {
        const f = e.target.files[0]; if (!f) return;
        b.custom = await f.text(); area.value = b.custom; runCustom();
      } });
    const details = el("details", { class: "spec", open: b.specOpen || b.which === "custom",
      ontoggle: (e) => { b.specOpen = e.target.open; } },
      el("summary", {}, `${t("block.source")}: ${t("block." + (b.which === "block" ? "lesson" : b.which))}`),
      el("p", {}, t("block.paste")), area,
      el("div", { class: "row" },
        el("label", { class: "file" }, t("block.upload"), " ", file),
        el("button", { type: "button", id: "spec-run", onclick: runCustom }, t("block.run")),
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
    try { await trace(doc); } catch (err) { showError(err); return; }   // validate first
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

  register("block", {
    show: async () => { if (!S.block.base) renderBlock(); await loadBlock(); },
    render: () => { if (S.block.base) renderBlock(); },
  });
})();
