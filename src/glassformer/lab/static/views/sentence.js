// glassformer lab, view 2 "sentence" (#sentence): attention maps and next tokens for one sentence, and the 我↔他 swap check.
"use strict";
(function () {
  const { S, t, el, api, info, live, compute, fmt, matrix, showError, register } = window.LAB;

  S.sentence = { source: null, target: null, teacher: true, positions: true, swapped: false,
                 results: null, row: null, sel: { enc: [0, 0], dec: [0, 0], cross: [0, 0] }, runs: 0 };

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
    await info();
    S.sentence.source = S.info.default_source; S.sentence.target = S.info.default_target;
    await runSentence();
  }

  async function runSentence() {
    const st = S.sentence;
    const target = st.teacher ? st.target : null;
    let original; let swapped = null; let swap = null;
    try {
      const L = await live();                          // the engine in the page, else the server
      const call = (body) => (L ? compute(() => L.sentence(body)) : api("POST", "/api/sentence", body));
      const body = { source: st.source, positions: st.positions };
      if (target) body.target = target;
      original = await call(body);
      swap = swappedSource(original);
      if (swap) swapped = await call(Object.assign({}, body, { source: swap.text }));
      st.live = !!L;
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
    const src = el("input", { type: "text", id: "sent-source", value: st.source, size: "36" });
    const tgt = el("input", { type: "text", id: "sent-target", value: st.target, disabled: !st.teacher, size: "36" });
    src.addEventListener("change", () => { st.source = src.value; st.swapped = false; });
    tgt.addEventListener("change", () => { st.target = tgt.value; });
    root.append(el("div", { class: "controls" },
      el("label", { class: "group" }, el("span", { class: "label" }, t("sentence.source")), src),
      el("label", { class: "group" }, el("span", { class: "label" }, t("sentence.target")), tgt),
      el("label", { class: "group" }, el("input", { type: "checkbox", id: "sent-teacher", checked: st.teacher,
        onchange: (e) => { st.teacher = e.target.checked; runSentence(); } }), t("sentence.teacher")),
      el("label", { class: "group" }, el("input", { type: "checkbox", id: "sent-positions", checked: st.positions,
        onchange: (e) => { st.positions = e.target.checked; runSentence(); } }),
      `${t("sentence.positions")}: ${st.positions ? t("sentence.positions.on") : t("sentence.positions.off")}`),
      el("button", { type: "button", id: "sent-run", onclick: () => { st.source = src.value; st.target = tgt.value; st.swapped = false; st.row = null; runSentence(); } }, t("sentence.run")),
      el("button", { type: "button", id: "sent-swap", disabled: !st.results.swapped,
        onclick: () => { st.swapped = !st.swapped; renderSentence(); } }, t("sentence.swap", { a, b }))));
    root.append(el("p", { class: "note", id: "sent-showing" },
      st.results.swapped ? (st.swapped ? t("sentence.swapped") : t("sentence.original")) : t("sentence.noswap", { a, b })));
    if (st.live) root.append(el("p", { class: "note", id: "sent-live" }, t("live.computed")));
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

  register("sentence", {
    show: async () => { if (!S.sentence.results) renderSentence(); await loadSentence(); },
    render: () => { if (S.sentence.results) renderSentence(); },
    reset: () => { Object.assign(S.sentence, { source: null, target: null, results: null, row: null, swapped: false }); },
  });
})();
