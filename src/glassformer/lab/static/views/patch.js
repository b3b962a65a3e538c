// glassformer lab, view 5 "patch" (#patch): activation or attribution patching, the share of clean→corrupt each head and position
// restores. Computed in the page (activation: a forward pass per cell, in chunks; attribution: one backward pass, in the
// page's worker), or by the server for a model the page cannot run.
"use strict";
(function () {
  const { S, t, el, api, info, live, fmt, heat, showError, register } = window.LAB;

  S.patch = { clean: null, corrupt: null, target: null, predict: null, method: "activation", result: null, runs: 0,
              progress: null, live: false };

  async function loadPatch() {
    const st = S.patch;
    if (st.clean !== null) return;
    await info();
    st.live = !!(await live());                           // patching runs in the page when it can
    st.clean = S.info.default_source; st.corrupt = S.info.patch_corrupt; st.target = S.info.default_target;
    st.predict = S.info.patch_predict;
    await runPatch();
  }

  async function runPatch() {
    const st = S.patch;
    renderPatch();
    const body = { clean: st.clean, corrupt: st.corrupt, target: st.target, predict: st.predict, method: st.method };
    try {
      if (st.live) {
        const L = await live();
        st.progress = { done: 0, total: 0 };
        renderProgress();
        st.result = await L.patch(body, (p) => { st.progress = p; renderProgress(); });
      } else {
        st.result = await api("POST", "/api/patch", body);
      }
      showError(null);
    } catch (err) { st.progress = null; renderProgress(); showError(err); return; } finally { st.progress = null; }
    renderPatch();
    st.runs += 1;
    document.body.dataset.patchRuns = String(st.runs);
  }

  function renderProgress() {                    // the scan's runs so far (the page stays usable meanwhile)
    const node = document.getElementById("patch-progress");
    if (!node) return;
    const p = S.patch.progress;
    node.hidden = !p;
    node.textContent = p ? t("patch.progress", { d: p.done, n: p.total || "…" }) : "";
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
    if (st.clean === null) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    const input = (id, key, size) => {
      const node = el("input", { type: "text", id, value: st[key], size });
      node.addEventListener("change", () => { st[key] = node.value; });
      return node;
    };
    const fields = [["patch-clean", "clean", "30"], ["patch-corrupt", "corrupt", "30"], ["patch-target", "target", "30"],
      ["patch-predict", "predict", "8"]].map(([id, key, size]) => [key, input(id, key, size)]);
    const method = el("select", { id: "patch-method" }, ["activation", "attribution"].map((m) =>
      el("option", { value: m, selected: st.method === m }, t("patch.method." + m))));
    method.addEventListener("change", () => { st.method = method.value; runPatch(); });
    root.append(el("div", { class: "controls" },
      fields.map(([key, node]) => el("label", { class: "group" }, el("span", { class: "label" }, t("patch." + key)), node)),
      el("label", { class: "group" }, el("span", { class: "label" }, t("patch.method")), method),
      el("button", { type: "button", id: "patch-run", onclick: () => { fields.forEach(([key, node]) => { st[key] = node.value; }); runPatch(); } },
        t("patch.run"))));
    root.append(el("p", { class: "note", id: "patch-progress", hidden: !st.progress }, ""));
    const r = st.result;
    if (!r) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    const run = r.runs[0];
    root.append(el("p", { class: "badge " + (r.model.trained ? "trained" : "untrained") }, el("strong", {},
      `${t("sentence.model")}: ${r.model.trained ? t("trained") : t("untrained")}`), " — ", r.model.label[S.lang]));
    if (st.live) root.append(el("p", { class: "note", id: "patch-live" }, t("live.computed")));
    if (r.method === "attribution") root.append(el("p", { class: "note", id: "patch-approx" }, t("patch.approx.note")));
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

  register("patch", {
    show: async () => { if (!S.patch.result) renderPatch(); await loadPatch(); },
    render: () => { if (S.patch.clean !== null) renderPatch(); },
    reset: () => { Object.assign(S.patch, { clean: null, corrupt: null, target: null, predict: null, result: null }); },
  });
})();
