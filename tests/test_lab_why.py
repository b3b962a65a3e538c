"""The lab's "Why him" view in headless Chromium, in both languages, over the seeded untrained model.

Same browser set-up as tests/test_lab_browser.py (skipped locally without /usr/bin/chromium or
Playwright, a failure under CI); the API's own checks are in the second half (no browser needed)."""

from __future__ import annotations

import re

import pytest

import test_lab_browser as shared
from glassformer.errors import UsageError
from glassformer.lab.api import LabAPI, untrained_model
from glassformer.lab.export import write_export
from glassformer.lesson import examples

Page = shared.Page
browser, lab_server = shared.browser, shared.lab_server           # the same fixtures: Chromium, the lab server

WORDS = ["I", "gave", "him", "a", "book", "yesterday", ".", "</s>"]


@pytest.fixture(scope="module")
def api() -> LabAPI:
    return LabAPI(untrained_model())


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("locale, heading, sub, share", [("zh-CN", "为什么是 him", "交叉注意力", "源语言份额"),
                                                         ("en-US", "Why him", "cross-attn", "source share")])
def test_why_view_draws_the_map_the_contrast_and_the_lens(browser, lab_server, api, locale, heading, sub, share):
    p = Page(browser, locale)
    try:
        p.page.goto(lab_server.url + "#why")
        p.wait_count("whyRuns", 1)
        p.shot(f"why-{locale[:2]}")
        page = p.page
        assert heading in page.inner_text("#view-why h2")
        rows = page.locator('[data-probe="why.map"] tbody tr')
        assert rows.count() == len(WORDS)
        assert [rows.nth(k).locator("th").inner_text() for k in range(len(WORDS))] == WORDS
        units = page.locator('[data-probe="why.map"] thead th.src').all_inner_texts()
        assert units == list(examples.NINE_UNITS)
        him = rows.nth(2)
        assert him.locator("td.masked").count() == len(WORDS) - 3           # sees <s> I gave, not the rest
        # the page shows what the API computes for the same request (the default body)
        expected = api.attribute({})
        top = max(expected["rows"][2]["source"], key=lambda pair: abs(pair[1]))
        assert f"{top[0]}" in page.inner_text("#why-top") and f"{top[1]:.3f}" in page.inner_text("#why-top")
        him_row = expected["rows"][2]                                        # its completeness error and steps
        assert f"{100 * him_row['error']:.2f} %" in page.inner_text("#why-complete")
        assert str(him_row["steps"]) in page.inner_text("#why-complete")
        assert page.locator("#why-unconverged").count() == 0                 # every row within 1 %: no warning
        lens = page.locator('[data-probe="why.lens"] tbody tr')
        assert lens.count() == 2                                             # p(him) and p(her)
        cells = lens.first.locator("td").all_inner_texts()
        assert len(cells) == 3 * api.lab_model.model.cfg.decoder_layers
        assert cells[-1] == f"{expected['details']['lens']['p_model']:.4f}"
        assert sub in page.inner_text('[data-probe="why.lens"] thead')
        assert page.locator("#why-lens-chart polyline").count() == 2
        # saliency: a magnitude, every shown score ≥ 0
        page.select_option("#why-method", "saliency")
        p.wait_count("whyRuns", 2)
        scores = [float(v) for v in page.locator('[data-probe="why.map"] td.num').all_inner_texts()]
        assert scores and min(scores) >= 0
        assert p.outside == [] and p.errors == []
        # alti: every row's source share as a bar, the numbers the API gives (the contrast is dropped)
        page.select_option("#why-method", "alti")
        p.wait_count("whyRuns", 3)
        p.shot(f"why-alti-{locale[:2]}")
        assert share in page.inner_text('[data-probe="why.map"] thead')
        alti = api.attribute({"method": "alti"})
        bars = page.locator('[data-probe="why.map"] tbody td.share')
        assert bars.count() == len(WORDS)
        for k, row in enumerate(alti["rows"]):
            cell = bars.nth(k)
            assert float(cell.get_attribute("data-share")) == pytest.approx(row["source_share"], abs=1e-6)
            assert cell.inner_text().strip() == f"{row['source_share']:.2f}"
            width = cell.locator(".share-bar").evaluate("e => e.style.width")
            assert float(width.rstrip("%")) == pytest.approx(100 * row["source_share"], abs=0.06)
        assert p.errors == []
        # too few steps for a tight tolerance: the rows over it are named in a warning
        page.select_option("#why-method", "integrated-gradients")
        p.wait_count("whyRuns", 4)
        page.fill("#why-steps", "2")
        page.fill("#why-tolerance", "0.0001")
        page.click("#why-run")
        p.wait_count("whyRuns", 5)
        forced = api.attribute({"steps": 2, "tolerance": 0.0001})
        over = [r for r in forced["rows"] if r["error"] > 0.0001]
        warning = page.inner_text("#why-unconverged")
        named = [r for r in over if f"{r['token']} (" in warning or f"{r['token']}（" in warning]
        shown = [float(x) for x in re.findall(r"\d+\.\d\d", warning)]          # the page: float64, the API float32
        assert over and named == over and all(any(abs(x - 100 * r["error"]) <= 0.011 for x in shown) for r in over)
        page.fill("#why-steps", "auto")
        page.fill("#why-tolerance", "0.01")
        # a contrast word the vocabulary lacks: one line naming the field (the page refuses it; nothing is logged)
        page.fill("#why-contrast", "zebra")
        page.click("#why-run")
        page.wait_for_selector("#error:not([hidden])", timeout=20000)
        assert "contrast" in page.inner_text("#error") and "zebra" in page.inner_text("#error")
        assert p.errors == [] and p.outside == []
    finally:
        p.close()


@pytest.mark.browser
@pytest.mark.slow
def test_the_exported_page_computes_gradients_live_for_a_new_sentence(browser, api, tmp_path):
    """From file:// with nothing precomputed: integrated gradients of the default sentence as the API gives them,
    then saliency of a sentence of the student's own (the page's engine in its worker) and ALTI+."""
    out = tmp_path / "lab.html"
    write_export(api, out)
    p = Page(browser, "en-US")
    try:
        p.page.goto(out.as_uri() + "#why")
        p.wait_count("whyRuns", 1)
        assert p.page.is_visible("#why-live") and p.page.locator("#why-precomputed").count() == 0
        expected = api.attribute({})
        top = max(expected["rows"][2]["source"], key=lambda pair: abs(pair[1]))
        assert f"{top[1]:.3f}" in p.page.inner_text("#why-top")
        own = "我／给／他／一／本／书／。"                                  # units of the untrained model's vocabulary
        p.page.fill("#why-source", own)
        p.page.fill("#why-target", "")
        p.page.select_option("#why-method", "saliency")
        p.wait_count("whyRuns", 2)
        p.page.click("#why-run")
        p.wait_count("whyRuns", 3)
        units = p.page.locator('[data-probe="why.map"] thead th.src').all_inner_texts()
        assert units == own.split("／")
        want = api.attribute({"source": own, "target": None, "method": "saliency", "contrast": "her"})
        rows = p.page.locator('[data-probe="why.map"] tbody tr')
        assert rows.count() == len(want["rows"])
        first = [float(v) for v in rows.first.locator("td.num").all_inner_texts()[: len(units)]]
        assert first == pytest.approx([v for _, v in want["rows"][0]["source"]], abs=0.006)
        p.page.select_option("#why-method", "alti")
        p.wait_count("whyRuns", 4)
        shares = [float(x) for x in p.page.locator('[data-probe="why.map"] td.share').evaluate_all(
            "(cells) => cells.map((c) => c.dataset.share)")]
        assert shares and all(0 <= s <= 1 for s in shares)
        # a special token's text as the target: one line naming the field, as the CLI and the server answer
        p.page.fill("#why-target", "</s>")
        p.page.click("#why-run")
        p.page.wait_for_selector("#error:not([hidden])", timeout=20000)
        assert "target" in p.page.inner_text("#error") and "special tokens" in p.page.inner_text("#error")
        assert p.errors == [] and p.outside == []
    finally:
        p.close()


# ---- POST /api/attribute without a browser ----------------------------------------------------

def test_the_default_request_is_the_lesson_sentence_him_vs_her(api):
    out = api.attribute({})
    assert out["method"] == "integrated-gradients" and out["contrast"] == "her"
    assert [r["token"] for r in out["rows"]] == WORDS
    assert out["details"]["lens"]["row"] == 2 and out["details"]["baseline"] == "position-only"
    assert out["model"]["trained"] is False
    spec = out["integration"]
    assert spec == {"rule": "trapezoid", "steps": "auto", "tolerance": 0.01, "unconverged": []}
    for row in out["rows"]:                                               # completeness at the auto steps
        assert abs(row["sum"] - row["delta"]) <= 0.01 * max(abs(row["delta"]), 0.01) + 1e-5   # + the rounding
        assert row["error"] == pytest.approx(abs(row["sum"] - row["delta"]) / max(abs(row["delta"]), 0.01),
                                             abs=1e-4)
        assert 16 <= row["steps"] <= 1024 and row["passes"] >= row["steps"] + 1


def test_alti_answers_rows_with_their_source_share(api):
    out = api.attribute({"method": "alti"})                                 # the default contrast is dropped
    assert out["method"] == "alti" and out["contrast"] is None and out["integration"] is None
    assert [r["token"] for r in out["rows"]] == WORDS
    for row in out["rows"]:
        source = sum(v for _, v in row["source"])
        assert 0 < row["source_share"] < 1 and row["source_share"] == pytest.approx(source, abs=1e-5)
        assert row["sum"] == pytest.approx(1, abs=1e-5) and row["delta"] is None
        assert all(v >= 0 for _, v in row["source"] + row["prefix"])
    assert [t for t, _ in out["rows"][2]["prefix"]] == ["<s>", "I", "gave"]
    assert all(r["source_share"] is None for r in api.attribute({"method": "attention"})["rows"])
    shares = [r["source_share"] for r in api.attribute({"method": "saliency"})["rows"]]
    assert all(0 < v < 1 for v in shares)


def test_post_api_attribute_alti_over_http(lab_server):
    """The server itself: method alti answers 200 with each row's source share; a bad method is a 400 JSON answer."""
    import json
    import urllib.error
    import urllib.request

    def post(body):
        req = urllib.request.Request(lab_server.url + "api/attribute", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    status, out = post({"method": "alti"})
    assert status == 200 and out["method"] == "alti"
    assert all(0 <= r["source_share"] <= 1 and abs(r["sum"] - 1) < 1e-5 for r in out["rows"])
    status, out = post({"method": "alti+"})
    assert status == 400 and out["field"] == "method" and "alti" in out["error"]


def test_a_fixed_count_reports_the_rows_over_the_tolerance(api):
    out = api.attribute({"steps": 2, "rule": "gauss-legendre", "tolerance": 0.001})
    over = [r["token"] for r in out["rows"] if r["error"] > 0.001]
    assert over and out["integration"]["unconverged"] == over
    assert all(r["steps"] == 2 and r["passes"] == 2 for r in out["rows"])


@pytest.mark.parametrize("body, status, field, words", [
    ({"steps": 257}, 413, "steps", "MAX_IG_STEPS"),
    ({"steps": 0}, 400, "steps", "at least 1 step"),
    ({"steps": "many"}, 400, "steps", "or 'auto'"),
    ({"steps": True}, 400, "steps", "or 'auto'"),
    ({"tolerance": 1}, 400, "tolerance", "less than 1"),
    ({"tolerance": 0}, 400, "tolerance", "greater than 0"),
    ({"tolerance": "1%"}, 400, "tolerance", "expected a number"),
    ({"rule": "simpson"}, 400, "rule", "trapezoid"),
    ({"contrast": "zebra"}, 400, "contrast", "not one token"),
    ({"row": 99}, 400, "row", "outside the target rows"),
    ({"method": "shap"}, 400, "method", "expected"),
    ({"method": "ALTI"}, 400, "method", "'alti'"),
    ({"method": ["alti"]}, 400, "method", "expected"),
    ({"source": "我／龘"}, 400, "source", "unknown unit"),
    ({"source": "我" * 401}, 413, "source", "MAX_SOURCE_CHARS"),
    ({"target": "a " * 500}, 413, "target", "MAX_TARGET_CHARS"),
    ({"steps": "64"}, 400, "steps", "integer"),
    ({"steps": 257, "method": "saliency"}, 413, "steps", "MAX_IG_STEPS"),
    ({"lens": True}, 400, "lens", "unknown key"),
])
def test_bad_bodies_are_4xx_json_naming_the_field(api, body, status, field, words):
    with pytest.raises(UsageError) as caught:
        api.attribute(body)
    error = caught.value
    assert error.status == status and error.field == field and words in str(error)
    assert str(error).count("\n") == 0
