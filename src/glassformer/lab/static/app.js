// glassformer lab: the shell (state, language, shared functions, the tab bar) and the registry the views plug into.
// No framework, no build step: state in one object, each view re-rendered from it. Each view is a file of its
// own (views/*.js, loaded after this one) that registers itself through window.LAB.register.
"use strict";
(function () {
  const I18N = window.LAB_I18N;
  const EMBED = window.LAB_EMBED || null;          // set only in the exported, offline page
  const LANG_KEY = "glassformer.lab.lang";
  const HOME = "block";                             // the view shown for an empty or unknown #hash
  const TOL = 1e-12;                                // a number "changed" when |Δ| exceeds this
  const VIEWS = new Map();                          // name -> { show(), render() }, in registration (= tab) order

  // the shared state; each view file adds its own slot (S.block, S.sentence, S.masks, S.claims, S.patch, S.why,
  // S.train). S.info: what the views run on (the translator's /api/info, or a toy trained in the Train view).
  const S = { lang: pickLang(), view: HOME, info: null, query: "" };

  // ---------------------------------------------------------------- language
  function pickLang() {
    try {
      const stored = window.localStorage.getItem(LANG_KEY);
      if (stored === "zh" || stored === "en") return stored;
    } catch (e) { /* storage may be off (private mode, file://): fall through */ }
    const nav = (navigator.language || "zh").toLowerCase();
    return nav.startsWith("en") ? "en" : "zh";
  }

  function t(key, vars, lang) {
    let s = I18N[lang || S.lang][key];
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

  // ---------------------------------------------------------------- small shared functions
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

  // The model in the page (live.js: the engine over the model bundle), or null when this model runs on the
  // server only (a SentencePiece vocabulary): the views then ask the server. In the exported page a model that
  // did not load is an error (live.js has said why in one line).
  // A toy trained in the Train view, once opened in the views, is always in the page.
  let liveState;
  async function live() {
    if (liveState === undefined) {
      const L = window.LAB_LIVE;
      if (!L) {
        if (EMBED) throw new LabError(t("live.broken"), "file");
        liveState = null;
      } else {
        busy(+1);
        try { await L.current(); liveState = L; } catch (err) {
          if (EMBED || err.field === "file") throw new LabError(err.message, err.field);
          liveState = null;
        } finally { busy(-1); }
      }
    }
    return liveState;
  }

  // long work in the page: the busy mark on, then the work (which yields to the page now and then)
  async function compute(fn) {
    busy(+1);
    try { await new Promise((r) => setTimeout(r, 0)); return await fn(); } finally { busy(-1); }
  }

  // /api/info, fetched once (the exported page carries it); a toy's own while it is open in the views
  async function info() {
    if (!S.info) S.info = EMBED ? EMBED.info : await api("GET", "/api/info");
    return S.info;
  }

  // The views switch between the translator and a toy trained in the Train view (live.js sends "lab-model"
  // with the toy's info, or null for the translator): every view forgets what it computed and shows again.
  function modelChanged(toyInfo) {
    S.info = toyInfo || null;
    liveState = undefined;
    VIEWS.forEach((view) => { if (view.reset) view.reset(); });
    renderBanner();
  }

  function renderBanner() {
    const box = document.getElementById("model-banner");
    if (!box) return;
    const toy = S.info && S.info.toy;
    box.hidden = !toy;
    if (!toy) { box.replaceChildren(); return; }
    box.replaceChildren(el("span", { id: "model-banner-text" }, t("toy.banner", { task: t("train.task." + toy.task), step: toy.step,
      acc: fmt(100 * toy.accuracy, 1) })), " ",
    el("button", { type: "button", id: "toy-close", onclick: () => window.LAB_LIVE.useTranslator() }, t("toy.back")));
  }

  // ---------------------------------------------------------------- views and routing
  // A view file calls register(name, { show, render, reset }): show() when its tab opens (load what it needs and
  // draw), render() to redraw after a language switch (a view with nothing loaded yet leaves itself alone),
  // reset() (optional) when the views switch model: forget what was computed, so show() starts again.
  function register(name, view) { VIEWS.set(name, view); }

  // everything a view file may use, written once here
  window.LAB = { S, EMBED, TOL, t, el, api, info, live, compute, fmt, fmtSmall, heat, as2d, matrix, showError, LabError, register,
    busy };

  function renderAll() {
    VIEWS.forEach((view) => view.render());
    renderBanner();
    document.getElementById("lang").textContent = t("lang.switch");
  }

  // #name or #name?key=value&...: the view, and its settings (the Train view keeps its whole set-up there)
  async function show() {
    const hash = (location.hash || "#" + HOME).slice(1);
    const cut = hash.indexOf("?");
    const name = cut < 0 ? hash : hash.slice(0, cut);
    S.query = cut < 0 ? "" : hash.slice(cut + 1);
    S.view = VIEWS.has(name) ? name : HOME;
    document.querySelectorAll("[data-view]").forEach((sec) => { sec.hidden = sec.dataset.view !== S.view; });
    document.querySelectorAll("[data-view-link]").forEach((a) => a.classList.toggle("on", a.dataset.viewLink === S.view));
    try { await VIEWS.get(S.view).show(); } catch (err) { showError(err); }
  }

  function start() {
    document.documentElement.lang = S.lang === "zh" ? "zh-CN" : "en";
    applyStaticLabels();
    document.getElementById("offline").hidden = !EMBED;
    document.getElementById("lang").addEventListener("click", () => setLang(S.lang === "zh" ? "en" : "zh"));
    window.addEventListener("hashchange", show);
    window.addEventListener("lab-model", (event) => { modelChanged(event.detail); show(); });
    document.body.dataset.ready = "1";
    show();
  }

  // The view files are deferred scripts after this one (inline scripts in the exported page): all of them
  // have run, and registered, before DOMContentLoaded.
  document.addEventListener("DOMContentLoaded", start);
})();
