// glassformer lab, view 3 "masks" (#masks): the padding, causal, cross-attention and loss masks of a small batch.
"use strict";
(function () {
  const { S, EMBED, t, el, api, showError, register } = window.LAB;

  S.masks = null;

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

  register("masks", {
    show: async () => { if (!S.masks) renderMasks(); await loadMasks(); },
    render: () => { if (S.masks) renderMasks(); },
  });
})();
