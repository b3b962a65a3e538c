"""The lab's JSON API and HTTP server: numbers, masks, hardening (413/400/404/403), concurrency, export."""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import re
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from glassformer import cli
from glassformer.errors import UsageError
from glassformer.lab.api import (
    DEFAULT_SOURCE,
    DEFAULT_TARGET,
    LabAPI,
    claim_view,
    load_model,
    untrained_model,
)
from glassformer.lab.export import build_html, variant_key, with_toggles
from glassformer.lab.server import STATIC_DIR, make_server, serve_in_thread, static_table
from glassformer.lesson import claims, examples
from glassformer.lesson.reference import max_difference, run_reference
from glassformer.lesson.spec import run_spec

FAST_CLAIMS = ("A1", "A5", "B3", "B8", "C1", "E3", "G1")
NINE = list(examples.NINE_UNITS)


def fast_claims() -> list:
    return [claims.run_check(c) for c in FAST_CLAIMS]


@pytest.fixture(scope="module")
def api() -> LabAPI:
    return LabAPI(untrained_model(), run_claims=fast_claims)


@pytest.fixture(scope="module")
def one_thread():
    """As `glassformer lab` runs: one intra-op thread (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def server(api, one_thread):
    srv = make_server(api, "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """One raw HTTP request (http.client sends the path exactly as given); returns (status, headers, bytes)."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        hdrs = {"Host": f"127.0.0.1:{port}", **({"Content-Type": "application/json"} if method == "POST" else {}),
                **(headers or {})}
        if body is not None and "Content-Length" not in hdrs:
            hdrs["Content-Length"] = str(len(body))
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders()
        if body is not None:
            conn.send(body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def post_json(server, path: str, payload) -> tuple[int, dict]:
    status, _, raw = request(server, "POST", path, json.dumps(payload, ensure_ascii=False).encode("utf-8"),
                             {"Content-Type": "application/json"})
    return status, json.loads(raw)


# ---- the API without HTTP ----------------------------------------------------------------------

def test_trace_matches_the_float64_reference_and_gives_the_lessons_block_numbers(api):
    spec = api.block()["spec"]
    out = api.trace(spec)
    # every traced number against the formulas in plain NumPy float64 (lesson/reference.py, no torch)
    assert max_difference(out, run_reference(spec)) < 1e-12
    # the lesson's printed numbers (examples.BLOCK_ROW1), six decimals
    for got, want in zip(out["output"][0], examples.BLOCK_ROW1["ln2"], strict=True):
        assert abs(got - want) < 5e-7
    for got, want in zip(out["self_attention"]["output"][0], examples.BLOCK_ROW1["mha"], strict=True):
        assert abs(got - want) < 5e-7


def test_head_off_through_the_api_matches_the_independent_reference(api):
    spec = with_toggles(api.block()["spec"], (0,), "post", True, "none")
    assert spec["disabled_heads"] == [0]
    out = api.trace(spec)
    assert max_difference(out, run_reference(spec)) < 1e-12
    assert out["self_attention"]["concat"][0][:2] == [0.0, 0.0]      # head 1 contributes zeros


def test_trace_spec_errors_are_400_naming_the_field(api):
    spec = api.block()["spec"]
    spec["self_attention"]["heads"][0]["w_q"] = [[1.0, 0.0]] * 3      # 3×2 where 4×2 is needed
    with pytest.raises(UsageError) as info:
        api.trace(spec)
    assert info.value.status == 400 and "w_q" in info.value.field
    with pytest.raises(UsageError) as info:
        api.trace({"version": 1, "kind": "encoder_block", "x": [[1.0]], "self_attention": {}})
    assert info.value.status == 400 and info.value.field == "ffn"
    with pytest.raises(UsageError) as info:
        api.trace([1, 2])
    assert info.value.status == 400 and info.value.field == "body"


def test_sentence_tables_have_the_lessons_shapes_and_are_softmax_rows(api):
    r = api.sentence({"source": DEFAULT_SOURCE, "target": DEFAULT_TARGET})
    assert r["source"] == NINE and r["mode"] == "teacher_forced"
    assert r["target"][:4] == ["<s>", "I", "gave", "him"]
    cfg = api.lab_model.model.cfg
    enc, dec, cross = r["encoder_self_attention"], r["decoder_self_attention"], r["cross_attention"]
    assert (len(enc), len(enc[0])) == (cfg.encoder_layers, cfg.heads)
    t = len(r["target"])
    for table in (a for layer in enc for a in layer):
        assert len(table) == 9 and all(len(row) == 9 for row in table)
        assert all(abs(sum(row) - 1) < 1e-5 for row in table)          # softmax along keys (A3)
    for table in (a for layer in dec for a in layer):
        assert len(table) == t and all(len(row) == t for row in table)
        assert all(table[i][j] == 0.0 for i in range(t) for j in range(i + 1, t))   # the triangle
        assert all(abs(sum(row) - 1) < 1e-5 for row in table)
    for table in (a for layer in cross for a in layer):
        assert len(table) == t and all(len(row) == 9 for row in table)
        assert all(abs(sum(row) - 1) < 1e-5 for row in table)


def test_sentence_next_token_probabilities_match_the_fast_path(api):
    """The page's numbers come from the traced (glass) pass; the plain fast forward must agree."""
    r = api.sentence({"source": DEFAULT_SOURCE, "target": DEFAULT_TARGET, "top_k": 3})
    lab = api.lab_model
    src = torch.tensor([lab.source.encode(DEFAULT_SOURCE)])
    tgt_in = torch.tensor([r["target_ids"]])
    with torch.inference_mode():
        probs = torch.softmax(lab.model(src, tgt_in)[0].double(), dim=-1)
    row = r["next_tokens"][examples.GAVE_ROW]
    assert (row["input"], row["next"]) == ("gave", "him")
    him = lab.target.encode(" him")[0]
    assert row["next_id"] == him
    assert row["next_prob"] == pytest.approx(float(probs[examples.GAVE_ROW, him]), rel=1e-4)
    assert row["next_rank"] == int((probs[examples.GAVE_ROW] > probs[examples.GAVE_ROW, him]).sum()) + 1
    assert len(row["top"]) == 3 and row["top"][0]["prob"] >= row["top"][1]["prob"] >= row["top"][2]["prob"]
    assert row["top"][0]["id"] == int(probs[examples.GAVE_ROW].argmax())


def test_greedy_rows_predict_the_token_that_was_generated(api):
    r = api.sentence({"source": DEFAULT_SOURCE})
    assert r["mode"] == "greedy"
    assert r["target"][0] == "<s>" and len(r["next_tokens"]) == len(r["target"])
    # step-by-step (cached) argmax = teacher-forced argmax on the same prefix (D6)
    assert all(row["next_rank"] == 1 for row in r["next_tokens"])


def _permuted(table, p):
    return [[table[p[a]][p[b]] for b in range(len(table))] for a in range(len(table))]


def test_positions_off_the_swap_only_permutes_attention_on_it_does_not(api):
    swapped = list(NINE)
    i, j = NINE.index("我"), NINE.index("他")
    swapped[i], swapped[j] = swapped[j], swapped[i]
    p = list(range(9))
    p[i], p[j] = j, i
    worst = {}
    for positions in (False, True):
        a = api.sentence({"source": DEFAULT_SOURCE, "target": DEFAULT_TARGET, "positions": positions})
        b = api.sentence({"source": "／".join(swapped), "target": DEFAULT_TARGET, "positions": positions})
        assert b["source"] == swapped
        worst[positions] = max(abs(x - y)
                               for la, lb in zip(a["encoder_self_attention"], b["encoder_self_attention"], strict=True)
                               for ta, tb in zip(la, lb, strict=True)
                               for ra, rb in zip(_permuted(ta, p), tb, strict=True)
                               for x, y in zip(ra, rb, strict=True))
    assert worst[False] <= 2e-6        # C1: equivariance (tables are rounded to 6 decimals)
    assert worst[True] > 1e-2          # C2: positions break it


def test_sentence_input_errors_name_the_field(api):
    cases = [
        ({}, "source"),
        ({"source": ""}, "source"),
        ({"source": 3}, "source"),
        ({"source": "我／给／他", "target": "\ud800"}, "target"),
        ({"source": "我／给／他", "target": 7}, "target"),
        ({"source": "我／给／他", "positions": "yes"}, "positions"),
        ({"source": "我／给／他", "top_k": 0}, "top_k"),
        ({"source": "我／给／他", "colour": 1}, "colour"),
        ([1, 2], "body"),
    ]
    for body, field in cases:
        with pytest.raises(UsageError) as info:
            api.sentence(body)
        assert (info.value.status, info.value.field) == (400, field), body
        assert "\n" not in str(info.value)
    with pytest.raises(UsageError) as info:
        api.sentence({"source": "我" * 5000})
    assert (info.value.status, info.value.field) == (413, "source") and "MAX_SOURCE_CHARS" in str(info.value)


def test_masks_follow_the_lessons_batch(api):
    m = api.masks()
    assert m["source_padding"][1] == [False, False, True, True, True, True]     # E1
    assert m["causal"] == [[j <= i for j in range(6)] for i in range(6)]
    b = m["decoder_self"][1]                                                    # E2: causal AND B's padding
    assert b[5] == [True, True, True, True, False, False]
    assert all(not b[i][j] for i in range(6) for j in range(i + 1, 6))
    assert all(row == [True, True, False, False, False, False] for row in m["cross"][1])   # no triangle
    assert all(row == [True, True, False, False, False, False] for row in m["encoder_self"][1])
    assert m["loss_terms"] == [6, 3]                                            # E3
    assert m["loss_mask"][1] == [True, True, True, False, False, False]


def test_info_labels_the_untrained_model_in_both_languages(api):
    info = api.info()["model"]
    assert info["trained"] is False
    assert "未训练" in info["label"]["zh"] and "untrained" in info["label"]["en"]
    assert info["parameters"] == sum(p.numel() for p in api.lab_model.model.parameters())


def test_untrained_model_is_seeded_and_reproducible():
    a, b = untrained_model(), untrained_model()
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert a.no_positions.cfg.positions == "none"
    assert torch.equal(a.no_positions.src_embed.token.weight, a.model.src_embed.token.weight)
    assert all(u in a.source.vocab for u in NINE)


def test_verify_rows_link_to_views(api):
    v = api.verify()
    assert [c["id"] for c in v["claims"]] == list(FAST_CLAIMS)
    assert v["total"] == len(FAST_CLAIMS) and v["passed"] == sum(c["passed"] for c in v["claims"])
    assert claim_view("B3") == "#block" and claim_view("C2") == "#sentence" and claim_view("E3") == "#masks"
    assert claim_view("F1") is None


def test_a_missing_model_folder_named_by_the_user_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_model(tmp_path / "nowhere", required=True)
    assert load_model(tmp_path / "nowhere", required=False).trained is False


def test_a_run_folder_is_loaded_as_the_trained_translator_with_readable_pieces(tmp_path):
    """A folder written by the checkpoint code loads; BPE pieces show as words, never with ▁ or bytes."""
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights
    from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer
    from glassformer.model import ModelConfig, Transformer

    english = [DEFAULT_TARGET, "He gave me a book yesterday.", "I gave her a book."] * 3
    source = SourceTokenizer.train([NINE, list(examples.SIX_UNITS)])
    target = TargetTokenizer.train(english, vocab_size=160)
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size, encoder_layers=1,
                           decoder_layers=1)
    save_run_files(tmp_path, cfg, {}, source, target)
    save_weights(Transformer(cfg), tmp_path / MODEL)
    lab = load_model(tmp_path, required=True)
    assert lab.trained and lab.origin.startswith(f"{tmp_path}: trained here (")
    r = LabAPI(lab).sentence({"source": DEFAULT_SOURCE, "target": DEFAULT_TARGET})
    assert r["model"]["trained"] is True and "已训练" in r["model"]["label"]["zh"]
    assert r["target"][1:4] == ["I", "gave", "him"]                  # decoded strings, not '▁gave'
    assert not any("▁" in piece for piece in r["target"])
    assert r["next_tokens"][examples.GAVE_ROW]["next"] == "him"
    assert len(r["encoder_self_attention"]) == 1 and len(r["encoder_self_attention"][0][0]) == 9


# ---- the page's text ---------------------------------------------------------------------------

def _i18n() -> dict:
    text = (STATIC_DIR / "i18n.js").read_text(encoding="utf-8")
    start = text.index("{", text.index("LAB_I18N"))
    return json.loads(text[start: text.rindex("}") + 1])


def test_both_languages_have_every_label():
    i18n = _i18n()
    assert set(i18n) == {"zh", "en"}
    assert set(i18n["zh"]) == set(i18n["en"]) and len(i18n["zh"]) > 100
    assert all(v.strip() for lang in i18n.values() for v in lang.values())
    han = re.compile(r"[\u4e00-\u9fff]")
    assert han.search(i18n["zh"]["nav.block"]) and not han.search(i18n["en"]["nav.block"])
    assert i18n["zh"]["block.heading"] != i18n["en"]["block.heading"]
    # every key the page asks for exists
    app = "\n".join(p.read_text(encoding="utf-8") for p in sorted(STATIC_DIR.rglob("*.js")))   # shell and views
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    used = set(re.findall(r'\bt\("([a-z_.]*[a-z_])"\s*[,)]', app)) | set(re.findall(r'data-i18n="([a-z_.]+)"', html))
    used |= {f"block.{v}" for v in ("post", "pre", "lesson", "exercise", "custom", "block")}
    used |= {f"block.mask.{v}" for v in ("none", "causal", "padding", "custom")}
    used |= {f"step.sub.{v}" for v in ("self_attention", "cross_attention", "ffn")}
    used |= {f"nav.{v}" for v in ("block", "sentence", "masks", "claims")}
    assert used - set(i18n["en"]) == set()


def test_static_files_are_utf8_and_load_nothing_from_outside():
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    assert '<meta charset="utf-8">' in html
    for path in STATIC_DIR.rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), path
            assert "@import" not in text and "url(http" not in text, path


# ---- the HTTP server ---------------------------------------------------------------------------

def test_static_files_with_charset(server):
    for path, kind in [("/", "text/html"), ("/index.html", "text/html"), ("/app.js", "text/javascript"),
                       ("/style.css", "text/css"), ("/i18n.js", "text/javascript")]:
        status, headers, body = request(server, "GET", path)
        assert status == 200, path
        assert headers["content-type"] == f"{kind}; charset=utf-8", path
        assert headers["x-content-type-options"] == "nosniff"
        assert int(headers["content-length"]) == len(body)
    status, headers, body = request(server, "GET", "/api/info")
    assert (status, headers["content-type"]) == (200, "application/json; charset=utf-8")
    assert "未训练" in body.decode("utf-8")                           # real UTF-8, not \\u escapes


def test_nothing_outside_the_static_folder_is_served(server):
    for path in ["/../api.py", "/..%2fapi.py", "/%2e%2e/api.py", "/%2E%2E/%2E%2E/pyproject.toml",
                 "/static/../server.py", "//etc/passwd", "/etc/passwd", "/api.py", "/server.py",
                 "/../../../../etc/passwd", "/index.html/../api.py", "/.%2e/api.py", "/%5c..%5capi.py",
                 "http://127.0.0.1/../api.py", "/nope.html", "/api/nope", "/api", "/app.js%00.html"]:
        status, headers, body = request(server, "GET", path)
        assert status == 404, path
        assert headers["content-type"] == "application/json; charset=utf-8"
        assert b"import" not in body and b"root:" not in body, path


def test_symlinks_in_the_static_folder_are_never_served(tmp_path, api):
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<!doctype html><meta charset=\"utf-8\">ok", encoding="utf-8")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret", encoding="utf-8")
    (static / "leak.txt").symlink_to(secret)
    (static / "dir").symlink_to(tmp_path, target_is_directory=True)
    assert set(static_table(static)) == {"/", "/index.html"}
    srv = make_server(api, "127.0.0.1", 0, static_dir=static)
    serve_in_thread(srv)
    try:
        assert request(srv, "GET", "/")[0] == 200
        for path in ["/leak.txt", "/dir/secret.txt", "/dir/static/index.html"]:
            status, _, body = request(srv, "GET", path)
            assert status == 404 and b"secret" not in body, path
    finally:
        srv.shutdown()
        srv.server_close()


def test_oversized_bodies_get_413(server):
    # the limit is judged from Content-Length before the body is read: the answer comes while the
    # client is still sending (so only the start of the body is sent here)
    for path, size in [("/api/trace", 1024 * 1024 + 1), ("/api/sentence", 5 * 1024 * 1024)]:
        status, _, body = request(server, "POST", path, b"{" + b" " * 1000,
                                  {"Content-Type": "application/json", "Content-Length": str(size)})
        assert status == 413 and json.loads(body)["field"] == "body"
    # exactly 1 MiB is still accepted (and then judged as JSON)
    status, _, body = request(server, "POST", "/api/trace", b"[" + b" " * (1024 * 1024 - 2) + b"]")
    assert status == 400 and json.loads(body)["field"] == "body"


def test_bad_requests_get_400_with_error_and_field(server):
    status, _, body = request(server, "POST", "/api/trace", b"{not json", {"Content-Type": "application/json"})
    payload = json.loads(body)
    assert status == 400 and payload["field"] == "body" and "invalid JSON" in payload["error"]
    status, _, body = request(server, "POST", "/api/sentence", "\xff".encode("latin-1"))
    assert status == 400 and json.loads(body)["field"] == "body"
    status, _, body = request(server, "POST", "/api/sentence", b"")
    assert status == 400 and json.loads(body)["field"] == "body"
    status, payload = post_json(server, "/api/sentence", {"source": "我／给／他", "top_k": 99})
    assert status == 400 and payload["field"] == "top_k" and "\n" not in payload["error"]
    spec = examples.block_spec()
    spec["eps"] = -1.0
    status, payload = post_json(server, "/api/trace", spec)
    assert status == 400 and payload["field"] == "eps"
    status, _, _ = request(server, "GET", "/api/trace")
    assert status == 405
    status, _, _ = request(server, "DELETE", "/")
    assert status == 405


def test_cross_site_posts_are_refused(server):
    spec = json.dumps(examples.block_spec()).encode("utf-8")
    own = f"http://127.0.0.1:{server.server_address[1]}"
    assert request(server, "POST", "/api/trace", spec, {"Origin": own})[0] == 200
    status, _, body = request(server, "POST", "/api/trace", spec, {"Origin": "https://evil.example"})
    assert status == 403 and json.loads(body)["field"] == "origin"
    status, _, body = request(server, "POST", "/api/trace", spec, {"Content-Type": "text/plain"})
    assert status == 415 and json.loads(body)["field"] == "content-type"


def test_a_loopback_server_refuses_other_host_names(server):
    status, _, body = request(server, "GET", "/api/info", headers={"Host": "evil.example:8765"})
    assert status == 403 and json.loads(body)["field"] == "host"
    port = server.server_address[1]
    for name in ("localhost", "127.0.0.1", "[::1]"):
        assert request(server, "GET", "/api/info", headers={"Host": f"{name}:{port}"})[0] == 200
    # DNS rebinding: names that merely start like a loopback address, another port, no port
    for host in (f"127.evil.example:{port}", f"127.0.0.1.nip.io:{port}", f"localhost:{port + 1}", "localhost",
                 f"localhost.:{port}", ""):
        status, _, body = request(server, "GET", "/api/info", headers={"Host": host})
        assert status == 403 and json.loads(body)["field"] == "host", host


def test_trace_over_http_matches_the_float64_reference(server):
    spec = examples.block_spec(norm="pre")
    status, payload = post_json(server, "/api/trace", spec)
    assert status == 200
    assert max_difference(payload, run_reference(spec)) < 1e-12


@pytest.mark.slow
def test_concurrent_trace_and_sentence_requests(server, api):
    """≥ 200 requests from 8 threads, trace and sentence mixed: no error, identical answers, p95 printed."""
    spec = examples.block_spec()
    want_trace = run_spec(spec)
    sentence = {"source": DEFAULT_SOURCE, "target": DEFAULT_TARGET}
    want_sentence = api.sentence(sentence)
    jobs = [("/api/trace", spec) if i % 2 else ("/api/sentence", sentence) for i in range(240)]

    def one(job):
        path, payload = job
        start = time.perf_counter()
        status, body = post_json(server, path, payload)
        return path, status, body, time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, jobs))
    assert all(status == 200 for _, status, _, _ in results)
    for path, _, body, _ in results:
        if path == "/api/trace":
            assert max_difference(body, want_trace) == 0.0
        else:
            assert body["encoder_self_attention"] == want_sentence["encoder_self_attention"]
            assert body["next_tokens"] == want_sentence["next_tokens"]
    def p95(values):
        values = sorted(values)
        return values[math.ceil(0.95 * len(values)) - 1]

    latencies = [t for *_, t in results]
    by_path = {path: [t for p, *_, t in results if p == path] for path in ("/api/trace", "/api/sentence")}
    print(f"\nlab server: {len(results)} requests from 8 threads, median "
          f"{statistics.median(latencies) * 1000:.1f} ms, p95 {p95(latencies) * 1000:.1f} ms "
          f"(trace p95 {p95(by_path['/api/trace']) * 1000:.1f} ms, "
          f"sentence p95 {p95(by_path['/api/sentence']) * 1000:.1f} ms)")
    assert threading.active_count() < 50


# ---- command and export ------------------------------------------------------------------------

def test_export_is_one_self_contained_page(api, tmp_path):
    html = build_html(api)
    # i18n, data, app, views, the engine module, the worker's text, the model bundle and its weights; nothing
    # loaded from outside
    assert html.count("<script") == 8 and 'src="' not in html and 'href="style.css"' not in html
    assert html.count('<script type="module">') == 1 and "import {" not in html and "\nexport " not in html
    assert html.count('<script type="text/plain" id="lab-worker">') == 1
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    assert "default-src 'none'" in csp and "worker-src blob:" in csp and "connect-src" not in csp
    data = json.loads(re.search(r"window\.LAB_EMBED = (\{.*?\});</script>", html, re.S).group(1)
                      .replace("<\\/", "</"))
    assert set(data) == {"info", "block", "masks", "verify"}              # nothing precomputed for the views
    block = data["block"]["spec"]
    assert max_difference(run_reference(block), api.trace(block)) < 1e-12
    # the model comes last, its lengths recorded before it (a cut file is recognised): the bundle, then its weights
    match = re.search(r'<script type="application/json" id="lab-bundle" data-chars="(\d+)">(.*?)</script>\n'
                      r'<script type="text/plain" id="lab-weights" data-chars="(\d+)">(.*?)</script>\n</body>',
                      html, re.S)
    assert match and len(match.group(2).encode("utf-16-le")) // 2 == int(match.group(1)) and "<" not in match.group(2)
    assert len(match.group(4)) == int(match.group(3)) and not set(match.group(4)) & {"<", "\r", "\0"}
    payload = json.loads(match.group(2))
    from glassformer.lab.bundle import read_bundle, unpack_weights
    bundle = payload["bundle"]
    assert bundle["data"] == "" and bundle["packed"]["format"] == "planes-zlib-text7"
    raw = unpack_weights(match.group(4), bundle["packed"])
    cfg, vocab, tensors = read_bundle({**bundle, "data": base64.b64encode(raw).decode("ascii")})
    assert cfg == api.lab_model.model.cfg and payload["limits"]["MAX_SOURCE_CHARS"] == 400
    weight = api.lab_model.model.state_dict()["src_embed.token.weight"].double().numpy()
    assert abs(tensors["src_embed.token.weight"] - weight).max() == 0              # float32 weights, exactly
    assert variant_key((0,), "post", True, "none") == "0|post|1|none" and with_toggles(block, (0,), "post", True,
                                                                                        "none")["disabled_heads"] == [0]


def test_lab_command_rejects_bad_arguments_with_exit_2(capsys, tmp_path):
    assert cli.main(["lab", "--port", "70000", "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--port" in err
    assert cli.main(["lab", "--model", str(tmp_path / "none"), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and "Traceback" not in err


@pytest.mark.slow
def test_lab_command_serves_on_loopback(tmp_path):
    """The real command: binds 127.0.0.1 on a free port, prints its URL, answers, stops on SIGINT."""
    import signal
    import subprocess
    import sys
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "glassformer.cli", "lab", "--port", "0", "--no-browser"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url + "api/info", timeout=30) as response:
            info = json.loads(response.read().decode("utf-8"))
        assert info["model"]["trained"] is False and "untrained" in line
        with urllib.request.urlopen(url, timeout=30) as response:
            assert "<meta charset=\"utf-8\">" in response.read().decode("utf-8")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


@pytest.mark.slow
def test_lab_command_exports_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(claims, "run_all", fast_claims)      # the full claims table is `verify`'s test
    out = tmp_path / "lab.html"
    assert cli.main(["lab", "--export", str(out), "--model", str(tmp_path / "absent")]) == 2  # named: must exist
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(tmp_path)                                   # no runs/default here: the untrained model
    try:
        assert cli.main(["lab", "--export", str(out)]) == 0
    finally:
        os.chdir(cwd)
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and "window.LAB_EMBED" in text and "未训练" in text
    assert Path(out).stat().st_size < 5 * 1024 * 1024
