// glassformer lab, view 4 "claims" (#claims): the lesson's checked claims, pass or fail, each linked to the view that shows it.
"use strict";
(function () {
  const { S, EMBED, t, el, api, showError, register } = window.LAB;

  S.claims = null;

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

  register("claims", {
    show: () => loadClaims(),
    render: () => { if (S.claims) renderClaims(); },
  });
})();
