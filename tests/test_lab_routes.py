"""The lab's Starlette routes and host check, its one error type, one default model folder and the lesson's
sentence defined once."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from tests.test_lab_api import post_json, request

from glassformer import options, paths
from glassformer.data import corpus
from glassformer.errors import UsageError
from glassformer.interpret import patching
from glassformer.lab.api import LabAPI, load_model, untrained_model
from glassformer.lab.server import make_server, serve_in_thread
from glassformer.lesson import examples

DOCS = Path(__file__).resolve().parent.parent / "docs" / "lab.md"


class WithExtraEndpoints(LabAPI):
    """Two endpoints added the documented way: a row in ROUTES and a method each."""

    ROUTES = (*LabAPI.ROUTES, ("POST", "/api/echo", "echo"), ("GET", "/api/broken", "broken"))

    def echo(self, body):
        if body.get("n") == 13:
            raise UsageError("n: 13 is not allowed", "n", status=422)
        return {"got": body}

    def broken(self):
        raise RuntimeError("a bug")


@pytest.fixture(scope="module")
def server():
    srv = make_server(WithExtraEndpoints(untrained_model()), "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def _json(reply) -> tuple[int, dict, dict]:
    status, headers, body = reply
    assert headers["content-type"] == "application/json; charset=utf-8", (status, headers)
    assert headers["x-content-type-options"] == "nosniff"
    return status, headers, json.loads(body)


# ---- routing --------------------------------------------------------------------------------------

def test_unknown_paths_are_404_json_without_redirects(server):
    for method, path in [("GET", "/api/info/"), ("GET", "/API/info"), ("POST", "/api/nope"), ("GET", "/app.js/"),
                         ("GET", "/api/info/x"), ("GET", "/index.htm")]:
        status, headers, payload = _json(request(server, method, path, b"{}" if method == "POST" else None))
        assert (status, payload["field"]) == (404, "path"), (method, path)
        assert "location" not in headers, path                  # no redirect to /api/info


def test_a_method_the_route_does_not_take_is_405_json_with_allow(server):
    cases = [("GET", "/api/trace", {"POST"}), ("POST", "/api/info", {"GET", "HEAD"}),
             ("DELETE", "/api/sentence", {"POST"}), ("PUT", "/", {"GET", "HEAD"}),
             ("OPTIONS", "/app.js", {"GET", "HEAD"})]
    for method, path, allow in cases:
        status, headers, payload = _json(request(server, method, path, b"{}" if method == "POST" else None))
        assert (status, payload["field"]) == (405, "method"), (method, path)
        assert set(headers["allow"].split(", ")) == allow, (method, path)
        assert method in payload["error"]


def test_every_route_row_is_served_and_documented(server):
    rows = {(method, path) for method, path, _ in LabAPI.ROUTES}
    documented = set(re.findall(r"^### `(GET|POST) (/api/\w+)`", DOCS.read_text(encoding="utf-8"), re.M))
    assert rows == documented
    for method, path in rows:
        if method == "GET" and path != "/api/verify":            # verify computes the claims table
            assert request(server, "GET", path)[0] == 200, path
            assert request(server, "HEAD", path)[0] == 200, path


def test_an_added_endpoint_is_one_row_and_one_method(server):
    status, payload = post_json(server, "/api/echo", {"n": 1, "text": "我"})
    assert (status, payload) == (200, {"got": {"n": 1, "text": "我"}})
    status, payload = post_json(server, "/api/echo", {"n": 13})
    assert (status, payload) == (422, {"error": "n: 13 is not allowed", "field": "n"})
    assert request(server, "GET", "/api/echo")[0] == 405
    # its body goes through the same checks as every POST
    status, _, payload = _json(request(server, "POST", "/api/echo", b"{}", {"Content-Type": "text/plain"}))
    assert (status, payload["field"]) == (415, "content-type")


def test_a_bug_is_a_500_json_line_and_the_server_keeps_serving(server, caplog):
    with caplog.at_level(logging.ERROR, logger="glassformer.lab"):
        status, _, payload = _json(request(server, "GET", "/api/broken"))
    assert status == 500 and payload == {"error": "internal error: RuntimeError", "field": None}
    lines = [r.getMessage() for r in caplog.records if r.name == "glassformer.lab"]
    assert lines == ["internal error on GET /api/broken: RuntimeError: a bug"]
    assert request(server, "GET", "/api/info")[0] == 200


# ---- the host check (TrustedHostMiddleware and the port) ---------------------------------------------

def test_exposed_server_answers_its_address_and_allowed_names_with_its_port_only():
    srv = make_server(LabAPI(untrained_model()), "0.0.0.0", 0, expose=True, allow_hosts=("Lab.Example",))
    serve_in_thread(srv)
    try:
        port = srv.server_address[1]
        for host in (f"lab.example:{port}", f"LAB.EXAMPLE:{port}", f"0.0.0.0:{port}", f"localhost:{port}"):
            assert request(srv, "GET", "/api/info", headers={"Host": host})[0] == 200, host
        for host in (f"other.example:{port}", f"www.lab.example:{port}", f"lab.example:{port + 1}", "lab.example",
                     f"x.lab.example:{port}", f"lab.example:{port}0", f"lab.example :{port}"):
            status, _, payload = _json(request(srv, "GET", "/api/info", headers={"Host": host}))
            assert (status, payload["field"]) == (403, "host"), host
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("name", ["*", "*.example", "lab.example:80", "a b", "lab/x", ""])
def test_allow_host_names_must_be_plain_host_names(name):
    with pytest.raises(UsageError, match="--allow-host"):
        make_server(LabAPI(untrained_model()), "0.0.0.0", 0, expose=True, allow_hosts=(name,))


# ---- one default model folder -----------------------------------------------------------------------

def test_default_model_dir_honours_the_environment(monkeypatch):
    monkeypatch.delenv("GLASSFORMER_MODEL", raising=False)
    assert paths.default_model_dir() == Path("runs/default")
    assert paths.default_model_dir("../..") == Path("../../runs/default")
    monkeypatch.setenv("GLASSFORMER_MODEL", "")
    assert paths.default_model_dir() == Path("runs/default")
    monkeypatch.setenv("GLASSFORMER_MODEL", "/data/my run")
    assert paths.default_model_dir("../..") == Path("/data/my run")
    assert options.default_model_dir is paths.default_model_dir


def test_the_lab_without_model_uses_glassformer_model(tmp_path, monkeypatch):
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights
    from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer
    from glassformer.model import ModelConfig, Transformer

    monkeypatch.chdir(tmp_path)                                  # no runs/default here
    monkeypatch.setenv("GLASSFORMER_MODEL", str(tmp_path / "absent"))
    lab = LabAPI().lab_model
    assert not lab.trained and str(tmp_path / "absent") in lab.origin
    run = tmp_path / "my-run"
    source = SourceTokenizer.train([list(examples.NINE_UNITS)])
    target = TargetTokenizer.train([examples.LESSON_TARGET] * 3, vocab_size=120)
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size, encoder_layers=1,
                           decoder_layers=1)
    save_run_files(run, cfg, {}, source, target)
    save_weights(Transformer(cfg), run / MODEL)
    monkeypatch.setenv("GLASSFORMER_MODEL", str(run))
    lab = LabAPI().lab_model
    assert lab.trained and lab.origin.startswith(f"{run}: ") and lab.model.cfg.encoder_layers == 1
    assert load_model(None).origin == lab.origin


# ---- the lesson's sentence, defined once ------------------------------------------------------------

def test_the_lessons_sentence_target_and_corruptions():
    assert examples.LESSON_SENTENCE == "我昨天给了他一本书。"
    assert examples.LESSON_TARGET == "I gave him a book yesterday."
    assert examples.LESSON_CORRUPTIONS == ("我昨天给了她一本书。", "他昨天给了我一本书。")
    assert examples.LESSON_PREDICT == "him"
    assert examples.in_units(examples.HER_UNITS) == "我／昨天／给／了／她／一／本／书／。"
    # the translator's patching, its corpus filter and the lab take them from there, not from copies
    assert patching.DEFAULT_CLEAN is examples.LESSON_SENTENCE
    assert patching.DEFAULT_CORRUPT is examples.LESSON_CORRUPTIONS
    assert patching.DEFAULT_TARGET is examples.LESSON_TARGET
    assert corpus.LESSON_SENTENCES is examples.LESSON_SENTENCES
    info = LabAPI(untrained_model()).info()
    assert info["default_source"] == "我／昨天／给／了／他／一／本／书／。"
    assert info["default_target"] == examples.LESSON_TARGET
    assert info["patch_corrupt"] == "我／昨天／给／了／她／一／本／书／。"
    assert info["swap"] == ["我", "他"] and info["patch_predict"] == "him"
