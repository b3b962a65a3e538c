// glassformer lab, view 7 "exercise" (#exercise): a sheet of the lesson's arithmetic from a seed, the cells to
// fill in, and beside each cell its verdict (right / carried / wrong) with the named bug and the lesson's sentence
// it breaks. Everything runs in the page (engine/exercises.js through window.LAB_LIVE.exercises): the same sheet
// of a seed as `glassformer exercise new`, the same verdicts as `glassformer exercise check`.
"use strict";
(function () {
  const { S, t, el, matrix, showError, LabError, register } = window.LAB;

  S.exercise = { kind: "attention", norm: "post", seed: 1, sheet: null, values: {}, report: null, plant: "" };

  function engine() {
    const E = window.LAB_LIVE && window.LAB_LIVE.exercises;
    if (!E) throw new LabError(t("live.broken"), "file");
    return E;
  }

  function newSheet() {
    const st = S.exercise;
    try {
      st.sheet = engine().newSheet(st.kind, st.seed, { norm: st.norm });
      showError(null);
    } catch (err) { st.sheet = null; showError(err); }
    st.values = {}; st.report = null; st.plant = "";
    renderExercise();
    if (st.sheet) document.body.dataset.exerciseSeed = `${st.kind}|${st.norm}|${st.seed}`;
  }

  // ---------------------------------------------------------------- reading and checking the filled cells
  function ownTables() {
    const st = S.exercise, E = engine(), key = st.key || E.key(st.sheet), own = {};
    for (const path of st.sheet.asked) {
      const rows = st.values[path];
      if (!rows) continue;
      const table = E.parseTable(rows, [key[path].length, key[path][0].length], path);
      if (table) own[path] = table;
    }
    return own;
  }

  function runCheck() {
    const st = S.exercise;
    try {
      st.report = engine().check(st.sheet, ownTables());
      showError(null);
    } catch (err) { st.report = null; showError(err); }
    renderExercise();
    document.body.dataset.exerciseChecks = String(Number(document.body.dataset.exerciseChecks || 0) + 1);
  }

  function fillWith(bugId) {          // the key, or what a student with this mistake would write, rounded
    const st = S.exercise, E = engine();
    const values = bugId ? E.runWith(st.sheet, bugId) : E.key(st.sheet);
    const d = st.sheet.decimals;
    st.values = {};
    for (const path of st.sheet.asked) {
      st.values[path] = values[path].map((row) => row.map((v) => (Number.isFinite(v) ? Number(v.toFixed(d)).toString()
        : (v === -Infinity ? "-inf" : ""))));
    }
    st.plant = bugId || "";
    runCheck();
  }

  // ---------------------------------------------------------------- drawing
  function label(path) {
    const parts = path.split(".");
    const last = parts[parts.length - 1];
    const name = t(`exercise.cell.${last}`);
    if (parts[0] === "self_attention" && parts[1] === "heads") return `${t("exercise.head", { n: Number(parts[2]) + 1 })} · ${name}`;
    if (parts[0] === "self_attention") return t(`exercise.cell.mha_${last}`);
    if (parts[0] === "sublayers") return `${t("exercise.sublayer", { n: Number(parts[1]) + 1 })} · ${name}`;
    if (parts[0] === "ffn") return t(`exercise.cell.ffn_${last}`);
    return path === "output" && S.exercise.sheet.kind === "block" ? t("exercise.cell.final") : name;
  }

  function given(sheet) {
    const d = sheet.doc;
    const small = (title, rows) => el("div", { class: "panel" }, el("h3", {}, title), matrix(rows, { digits: 1, compact: true }));
    if (sheet.kind === "attention") return [small("Q", d.q), small("K", d.k), small("V", d.v)];
    const out = [small("X", d.x)];
    d.self_attention.heads.forEach((h, r) => {
      for (const w of ["w_q", "w_k", "w_v"]) out.push(small(`${{ w_q: "W^Q", w_k: "W^K", w_v: "W^V" }[w]}_${r + 1}`, h[w]));
    });
    out.push(small("W^O", d.self_attention.w_o), small("W_1", d.ffn.w_1), small("W_2", d.ffn.w_2));
    return out;
  }

  function inputGrid(path, shape, verdict) {
    const st = S.exercise;
    const [n, m] = shape;
    const rows = st.values[path] || Array.from({ length: n }, () => new Array(m).fill(""));
    const off = new Set(verdict && verdict.off ? verdict.off.map(([i, j]) => `${i},${j}`) : []);
    const table = el("table", { class: "exercise-grid", data: { cell: path } });
    for (let i = 0; i < n; i++) {
      const tr = el("tr");
      for (let j = 0; j < m; j++) {
        const input = el("input", { type: "text", inputmode: "decimal", size: "7", value: rows[i][j] || "",
          "aria-label": `${path}[${i}][${j}]`, data: { i: String(i), j: String(j) },
          style: off.has(`${i},${j}`) ? "outline:2px solid #c0392b" : null,
          oninput: (ev) => {
            if (!st.values[path]) st.values[path] = rows.map((r) => r.slice());
            st.values[path][i][j] = ev.target.value;
          } });
        tr.append(el("td", {}, input));
      }
      table.append(tr);
    }
    return table;
  }

  function verdictNote(v) {
    if (!v) return el("span", { class: "verdict", data: { verdict: "empty" } }, "");
    const colour = { right: "#1e7b34", carried: "#8a6d00", wrong: "#c0392b" }[v.verdict];
    const out = el("div", { class: "verdict", data: { verdict: v.verdict, bug: v.bug || "" } },
      el("strong", { style: `color:${colour}` }, t(`exercise.${v.verdict}`)));
    if (v.verdict === "carried") out.append(" — ", t("exercise.carried_note"));
    if (v.verdict === "wrong" && v.bug === "slip") {
      out.append(" — ", t("exercise.slip"), " ", t("exercise.entries", { e: v.off.map(([i, j]) => `(${i + 1},${j + 1})`).join(", ") }));
    } else if (v.verdict === "wrong") {
      const bug = engine().bug(v.bug);
      out.append(" — ", el("code", { class: "bug" }, v.bug), ": ", bug[S.lang], " ", el("span", { class: "note" },
        `(${t("exercise.claim")} ${bug.claim})`));
    }
    return out;
  }

  function renderExercise() {
    const root = document.getElementById("view-exercise");
    if (!root) return;
    const st = S.exercise;
    root.replaceChildren();
    root.append(el("h2", {}, t("exercise.heading")), el("p", { class: "intro" }, t("exercise.intro")));
    const kind = el("select", { id: "exercise-kind", onchange: (ev) => { st.kind = ev.target.value; newSheet(); } },
      ["attention", "block"].map((k) => el("option", { value: k, selected: st.kind === k }, t(`exercise.kind.${k}`))));
    const norm = el("select", { id: "exercise-norm", disabled: st.kind !== "block",
      onchange: (ev) => { st.norm = ev.target.value; newSheet(); } },
    ["post", "pre"].map((k) => el("option", { value: k, selected: st.norm === k }, k + "-norm")));
    const seed = el("input", { id: "exercise-seed", type: "number", min: "0", step: "1", value: String(st.seed), style: "width:6rem" });
    const go = el("button", { type: "button", id: "exercise-new", onclick: () => {
      const value = Number(seed.value);
      if (!Number.isSafeInteger(value) || value < 0) { showError(new LabError(t("exercise.bad_seed", { v: seed.value }), "seed")); return; }
      st.seed = value; newSheet();
    } }, t("exercise.new"));
    root.append(el("div", { class: "controls" }, el("label", {}, t("exercise.kind"), " ", kind), " ",
      el("label", {}, t("exercise.norm"), " ", norm), " ", el("label", {}, t("exercise.seed"), " ", seed), " ", go));
    const sheet = st.sheet;
    if (!sheet) { root.append(el("p", { class: "note" }, t("loading"))); return; }
    const E = engine();
    st.key = E.key(sheet);
    root.append(el("p", { class: "note" }, t("exercise.sheet", { kind: t(`exercise.kind.${sheet.kind}`), seed: sheet.seed,
      d: sheet.decimals, n: sheet.asked.length })));
    const rules = [t(`exercise.rules_${sheet.kind}`)];
    if (sheet.kind === "block") rules.push(t(`exercise.${sheet.norm}`), t("exercise.eps", { eps: sheet.eps }));
    rules.push(t(`exercise.mask_${sheet.mask}`), t("exercise.masked"));
    root.append(el("div", { class: "panel" }, el("h3", {}, t("exercise.given")), rules.map((r) => el("p", { class: "note" }, r)),
      el("div", { class: "grids" }, given(sheet))));
    // the cells
    const byPath = new Map((st.report ? st.report.cells : []).map((c) => [c.path, c]));
    const list = el("div", { id: "exercise-cells" });
    for (const path of sheet.asked) {
      const shape = [st.key[path].length, st.key[path][0].length];
      list.append(el("div", { class: "panel exercise-cell", data: { path } },
        el("h3", {}, label(path), " ", el("code", { class: "note" }, path)),
        el("div", { style: "display:flex;gap:1rem;align-items:flex-start;flex-wrap:wrap" },
          inputGrid(path, shape, byPath.get(path)), verdictNote(byPath.get(path)))));
    }
    root.append(el("h3", {}, t("exercise.compute", { d: sheet.decimals })), list);
    // the buttons: check, fill in the key, fill in as a student with a mistake would, clear
    const covered = sheet.audit.covered;
    const plant = el("select", { id: "exercise-plant" }, el("option", { value: "" }, t("exercise.plant_pick")),
      covered.map((id) => el("option", { value: id, selected: st.plant === id }, id)));
    root.append(el("div", { class: "controls" },
      el("button", { type: "button", id: "exercise-check", onclick: runCheck }, t("exercise.check")), " ",
      el("button", { type: "button", id: "exercise-key", onclick: () => fillWith(null) }, t("exercise.fill_key")), " ",
      el("label", {}, t("exercise.plant"), " ", plant), " ",
      el("button", { type: "button", id: "exercise-fill-bug", onclick: () => { if (plant.value) fillWith(plant.value); } }, t("exercise.fill_bug")), " ",
      el("button", { type: "button", id: "exercise-clear", onclick: () => { st.values = {}; st.report = null; st.plant = ""; renderExercise(); } },
        t("exercise.clear"))));
    // the summary
    if (st.report) {
      const r = st.report;
      const counts = { right: 0, carried: 0, wrong: 0 };
      r.cells.forEach((c) => { counts[c.verdict] += 1; });
      const summary = el("div", { class: "panel", id: "exercise-summary", data: { verdict: r.verdict, bugs: r.bugs.join(" ") } },
        el("p", {}, r.cells.length ? t("exercise.summary", { total: r.cells.length, ...counts }) : t("exercise.empty")));
      if (r.cells.length && r.verdict === "right") summary.append(el("p", {}, t("exercise.all_right")));
      for (const id of r.bugs) {
        const bug = E.bug(id);
        summary.append(el("p", {}, el("code", { class: "bug" }, id), ": ", bug[S.lang], " ",
          el("span", { class: "note" }, `(${t("exercise.claim")} ${bug.claim})`),
          bug.source ? el("span", { class: "note" }, " · ", t("exercise.source"), " ", el("a", { href: bug.source, rel: "noreferrer" }, bug.source)) : null));
      }
      root.append(summary);
    }
    // the audit
    root.append(el("details", { class: "panel" }, el("summary", {}, t("exercise.audit", { draws: sheet.audit.draws })),
      el("p", {}, t("exercise.covered"), " ", covered.map((id) => el("code", { title: E.bug(id)[S.lang] }, id + " "))),
      el("p", {}, t("exercise.not_covered")),
      el("ul", {}, sheet.audit.not_covered.map((b) => el("li", {}, el("code", {}, b.bug), ": ",
        E.notCovered(E.bug(b.bug), sheet, S.lang))))));
  }

  register("exercise", {
    show: async () => { if (!S.exercise.sheet) newSheet(); else renderExercise(); },
    render: () => { if (S.exercise.sheet) renderExercise(); },
  });
})();
