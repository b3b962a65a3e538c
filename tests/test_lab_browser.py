"""The lab page in a real browser (headless Debian Chromium driven by Playwright).

Skipped only when /usr/bin/chromium (or Playwright) is missing AND the CI variable is unset; under
CI a missing browser is a failure. Screenshots of every view land in artifacts/ (repository root).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from glassformer.lab.api import DEFAULT_SOURCE, DEFAULT_TARGET, LabAPI, untrained_model
from glassformer.lab.export import with_toggles, write_export
from glassformer.lab.server import make_server, serve_in_thread
from glassformer.lesson import claims, examples
from glassformer.lesson.reference import run_reference

pytestmark = pytest.mark.browser
pytestmark = [pytestmark, pytest.mark.slow]   # every browser test starts Chromium

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
DOCS_SHOT = ROOT / "docs" / "lab.png"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
FAST_CLAIMS = ("A1", "A5", "B3", "B8", "C1", "C2", "E3", "G1")


def _need_browser():
    """Playwright's sync API, or a skip (locally) / failure (CI) saying what is missing."""
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is missing (apt-get install -y chromium fonts-noto-cjk)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = missing or "the playwright package is missing (pip install playwright; never `playwright install`)"
        sync_playwright = None
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests need Chromium under CI: {missing}")
        pytest.skip(f"browser tests skipped: {missing}")
    return sync_playwright


def _six(v: float) -> str:
    s = f"{v:.6f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s


@pytest.fixture(scope="module")
def lab_server():
    before = torch.get_num_threads()
    torch.set_num_threads(1)                     # as `glassformer lab` runs
    api = LabAPI(untrained_model(), run_claims=lambda: [claims.run_check(c) for c in FAST_CLAIMS])
    srv = make_server(api, "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _need_browser()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A fresh page whose every request outside 127.0.0.1 is aborted and recorded, with console errors."""

    def __init__(self, browser, locale: str = "zh-CN") -> None:
        self.context = browser.new_context(locale=locale, viewport={"width": 1400, "height": 1000})
        self.outside: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith(("http://127.0.0.1:", "http://localhost:", "file://", "data:")):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()

    def wait_count(self, name: str, at_least: int) -> None:
        self.page.wait_for_function("([n, k]) => Number(document.body.dataset[n] || 0) >= k",
                                    arg=[name, at_least], timeout=20000)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"lab-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    p.close()


def _cells(page, probe: str) -> list[str]:
    return page.locator(f'[data-probe="{probe}"] td').all_inner_texts()


def test_every_view_loads_with_outside_network_blocked(page, lab_server):
    for view, counter in [("block", "blockRuns"), ("sentence", "sentenceRuns"), ("masks", "masksReady"),
                          ("claims", "claimsReady")]:
        page.page.goto(lab_server.url + "#" + view)
        page.wait_count(counter, 1)
        page.shot(view)
    assert page.outside == []
    assert page.errors == []
    assert page.page.locator("#claims-table tbody tr").count() == len(FAST_CLAIMS)
    assert page.page.locator("#loss-terms li").nth(1).inner_text().find("3") >= 0


def test_switching_head_1_off_shows_the_reference_numbers(page, lab_server):
    page.page.goto(lab_server.url + "#block")
    page.wait_count("blockRuns", 1)
    spec = examples.block_spec()
    full = run_reference(spec)
    assert _cells(page.page, "self_attention.output") == [_six(v) for v in full["self_attention"]["output"][0]]
    page.page.click('[data-head="0"]')
    page.wait_count("blockRuns", 2)
    off = run_reference(with_toggles(spec, (0,), "post", True, "none"))
    shown = _cells(page.page, "self_attention.output")
    assert shown == [_six(v) for v in off["self_attention"]["output"][0]]
    assert shown != [_six(v) for v in full["self_attention"]["output"][0]]
    # the page marks what changed and says how much
    assert page.page.locator('[data-probe="self_attention.output"] td.changed').count() > 0
    assert re.search(r"[1-9]\d* 个数变了", page.page.inner_text("#changes"))
    # row 2, pre-norm: still the reference's numbers
    page.page.click('[data-block-row="1"]')
    page.page.select_option("#norm", "pre")
    page.wait_count("blockRuns", 3)
    pre = run_reference(with_toggles(spec, (0,), "pre", True, "none"))
    assert _cells(page.page, "output") == [_six(v) for v in pre["output"][1]]
    assert page.errors == [] and page.outside == []


def test_the_language_switch_changes_every_label_and_is_remembered(page, lab_server):
    page.page.goto(lab_server.url + "#block")
    page.wait_count("blockRuns", 1)
    nav = page.page.locator("nav a").all_inner_texts()
    assert "一个 block" in nav[0] and "掩码" in nav[2]
    heading = page.page.inner_text("#view-block h2")
    page.page.click("#lang")
    assert page.page.locator("nav a").all_inner_texts()[2].endswith("Masks")
    assert page.page.inner_text("#view-block h2") != heading
    assert "Follow one token" in page.page.inner_text("#view-block h2")
    assert page.page.evaluate("document.documentElement.lang") == "en"
    page.page.reload()
    page.wait_count("blockRuns", 1)
    assert page.page.locator("nav a").all_inner_texts()[0].endswith("One block")
    page.page.click("#lang")
    assert "掩码" in page.page.locator("nav a").all_inner_texts()[2]


def test_sentence_view_shows_a_9x9_grid_and_the_gave_row(page, lab_server):
    page.page.goto(lab_server.url + "#sentence")
    page.wait_count("sentenceRuns", 1)
    rows = page.page.locator('[data-probe="encoder_self"] tbody tr')
    assert rows.count() == 9
    assert all(rows.nth(i).locator("td").count() == 9 for i in range(9))
    assert page.page.locator('[data-probe="encoder_self"] thead th').all_inner_texts()[1:] == list(examples.NINE_UNITS)
    assert "未训练" in page.page.inner_text("#model-label")
    want = lab_server.api.sentence({"source": DEFAULT_SOURCE, "target": DEFAULT_TARGET})
    gave = want["next_tokens"][examples.GAVE_ROW]
    page.page.click('[data-next-row="0"]')
    page.page.click('[data-input="gave"]')
    label = page.page.inner_text("#next-label")
    assert "him" in label and _six(gave["next_prob"]) in label
    # positions off: the swapped table is the permuted one (C1)
    page.page.click("#sent-positions")
    page.wait_count("sentenceRuns", 2)
    assert "C1" in page.page.inner_text("#swap-check")
    page.page.click("#sent-swap")
    assert page.page.locator('[data-probe="encoder_self"] thead th').all_inner_texts()[1] == "他"
    assert page.errors == [] and page.outside == []


def test_screenshot_for_the_readme(browser, lab_server):
    p = Page(browser, locale="zh-CN")
    try:
        p.page.goto(lab_server.url + "#block")
        p.wait_count("blockRuns", 1)
        p.page.click('[data-head="1"]')
        p.wait_count("blockRuns", 2)
        path = p.shot("block-head-off")
        assert path.stat().st_size > 10_000
        if not DOCS_SHOT.exists() or os.environ.get("LAB_UPDATE_SCREENSHOT"):
            shutil.copyfile(path, DOCS_SHOT)
    finally:
        p.close()


def test_exported_page_works_from_file_without_a_server(browser, lab_server, tmp_path):
    out = tmp_path / "lab.html"
    write_export(lab_server.api, out)
    p = Page(browser, locale="en-US")
    try:
        p.page.goto(out.as_uri() + "#block")
        p.wait_count("blockRuns", 1)
        assert p.page.is_visible("#offline")
        p.page.click('[data-head="0"]')
        p.wait_count("blockRuns", 2)
        off = run_reference(with_toggles(examples.block_spec(), (0,), "post", True, "none"))
        assert _cells(p.page, "self_attention.output") == [_six(v) for v in off["self_attention"]["output"][0]]
        p.page.goto(out.as_uri() + "#sentence")
        p.wait_count("sentenceRuns", 1)
        assert p.page.locator('[data-probe="encoder_self"] tbody tr').count() == 9
        p.page.goto(out.as_uri() + "#masks")
        p.wait_count("masksReady", 1)
        p.shot("export-masks")
        assert p.outside == [] and p.errors == []
    finally:
        p.close()


def test_patching_view_shows_the_heads_by_layers_table(page, lab_server):
    page.page.goto(lab_server.url + "#patch")
    page.wait_count("patchRuns", 1)
    page.shot("patch")
    info = untrained_model().model.cfg
    heads = page.page.locator('[data-probe="patch.heads"] tbody tr')
    assert heads.count() == info.decoder_layers
    assert heads.first.locator("td").count() == info.heads
    embedding = _cells(page.page, "patch.positions")[: len(examples.NINE_UNITS)]
    assert embedding[4] == "1.00" and set(embedding[:4] + embedding[5:]) <= {"0.00", "-0.00"}   # 他 → 她 only
    assert page.outside == [] and page.errors == []
    page.page.fill("#patch-corrupt", "我／昨天／给／了／龘／一／本／书／。")      # a unit the model does not know
    page.page.click("#patch-run")
    page.page.wait_for_selector("#error:not([hidden])", timeout=20000)
    assert "corrupt" in page.page.inner_text("#error") and "龘" in page.page.inner_text("#error")
    assert all("400" in e for e in page.errors)                                 # the refused request, nothing else


def test_patching_view_switches_to_attribution_patching(page, lab_server):
    """The method switch reruns the scan as attribution patching: the note appears, the tables keep their shape,
    and at the embedding the positions where the sentences agree estimate exactly 0."""
    page.page.goto(lab_server.url + "#patch")
    page.wait_count("patchRuns", 1)
    assert page.page.locator("#patch-approx").count() == 0
    page.page.select_option("#patch-method", "attribution")
    page.wait_count("patchRuns", 2)
    page.shot("patch-attribution")
    assert "backward" in page.page.inner_text("#patch-approx") or "反向" in page.page.inner_text("#patch-approx")
    info = untrained_model().model.cfg
    assert page.page.locator('[data-probe="patch.heads"] tbody tr').count() == info.decoder_layers
    embedding = _cells(page.page, "patch.positions")[: len(examples.NINE_UNITS)]
    assert set(embedding[:4] + embedding[5:]) <= {"0.00", "-0.00"} and embedding[4] not in ("0.00", "-0.00")
    assert page.outside == [] and page.errors == []


@pytest.fixture(scope="module")
def imported_lab(tmp_path_factory):
    """The lab on an imported Marian model of the lesson's base depth, 6 + 6 layers (small widths), untrained."""
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    from glassformer.interop.importer import import_marian
    from glassformer.lab.api import load_model
    from test_interop import build_marian

    root = tmp_path_factory.mktemp("marian-6x6")
    import_marian(build_marian(root / "opus-mt-6x6", steps=0, layers=6), root / "run")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    srv = make_server(LabAPI(load_model(root / "run")), "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()
    torch.set_num_threads(before)


def test_an_imported_six_plus_six_model_in_the_sentence_and_patching_views(browser, imported_lab):
    cfg = imported_lab.api.lab_model.model.cfg
    assert (cfg.encoder_layers, cfg.decoder_layers, cfg.activation) == (6, 6, "silu")
    p = Page(browser)
    try:
        p.page.goto(imported_lab.url + "#sentence")
        p.wait_count("sentenceRuns", 1)
        p.shot("sentence-6x6")
        info = imported_lab.api.info()
        assert info["default_source"] == "我昨天给了他一本书。"                   # no unit marks: SentencePiece cuts
        want = imported_lab.api.sentence({"source": info["default_source"], "target": DEFAULT_TARGET})
        rows = p.page.locator('[data-probe="encoder_self"] tbody tr')
        n_source = len(want["encoder_self_attention"][0][0])                   # the model's own source pieces
        assert n_source > 0 and rows.count() == n_source
        assert all(rows.nth(i).locator("td").count() == n_source for i in range(n_source))
        assert "opus-mt-6x6" in p.page.inner_text("#model-label")              # where the model came from
        p.page.goto(imported_lab.url + "#patch")
        p.wait_count("patchRuns", 1)
        p.shot("patch-6x6")
        heads = p.page.locator('[data-probe="patch.heads"] tbody tr')
        assert heads.count() == 6 and heads.first.locator("td").count() == cfg.heads
        assert p.errors == [] and p.outside == []
    finally:
        p.close()
