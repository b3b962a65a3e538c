"""The lab server under hostile input: every answer JSON with a 4xx, slow clients cut off, Ctrl-C in 2 s,
work bombs refused before allocating, /api/info answering while /api/verify computes, bounded memory."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.test_lab_api import post_json, request

from glassformer.errors import UsageError
from glassformer.lab import connection
from glassformer.lab import server as server_module
from glassformer.lab.api import DEFAULT_SOURCE, DEFAULT_TARGET, LabAPI, untrained_model
from glassformer.lab.server import make_server, serve_in_thread
from glassformer.lesson import claims, examples
from glassformer.lesson.spec import run_spec

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.fixture(scope="module")
def api() -> LabAPI:
    return LabAPI(untrained_model(), run_claims=lambda: [claims.run_check(c) for c in ("A1", "B3")])


@pytest.fixture(scope="module")
def server(api):
    srv = make_server(api, "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def raw_exchange(server, data: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes, read until the server closes or answers completely."""
    with socket.create_connection(server.server_address, timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            reply = b"".join(chunks)
            head, _, body = reply.partition(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", head, re.I)
            if length and len(body) >= int(length.group(1)):
                break
        return b"".join(chunks)


def status_and_json(reply: bytes) -> tuple[int, dict]:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert re.search(rb"content-type: application/json", head, re.I), head
    return int(head.split()[1]), json.loads(body)


# ---- every status is a JSON answer --------------------------------------------------------------

def test_unknown_methods_long_paths_and_big_headers_get_json(server):
    host = f"Host: 127.0.0.1:{server.server_address[1]}\r\n".encode()
    for method in (b"TRACE", b"CONNECT", b"BREW"):
        status, payload = status_and_json(raw_exchange(server, method + b" / HTTP/1.1\r\n" + host + b"\r\n"))
        assert status == 501 and payload["field"] == "method", method
    status, payload = status_and_json(raw_exchange(server, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n" + host + b"\r\n"))
    assert status == 414 and payload["field"] == "path"
    many = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"v" * 100) for i in range(200))
    status, payload = status_and_json(raw_exchange(server, b"GET /api/info HTTP/1.1\r\n" + host + many + b"\r\n"))
    assert status == 431 and payload["field"] == "headers"
    status, payload = status_and_json(raw_exchange(server, b"GARBAGE\r\n\r\n"))
    assert status == 400
    status, payload = status_and_json(raw_exchange(server, b"PUT /api/trace HTTP/1.1\r\n" + host + b"\r\n"))
    assert status == 405 and payload["field"] == "method"


@pytest.mark.parametrize("body, words", [
    (b'{"source": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper"),
    (b'{"source": "x", "top_k": ' + b"7" * 5000 + b"}", "4,300 digits"),
    (b'{"source": "x", "top_k": ' + b"7" * 4000 + b"}", "integer too large"),
    (b'{"source": "\\ud800"}', "lone surrogate"),
    (b'{"source": "\xe6\x88\x91", "target": "\\udfff x"}', "lone surrogate"),
    (b'\xff\xfe{\x00}\x00', "UTF-16"),
    (b'{"\\n": 9223372036854775808}', '["\\n"]: integer too large'),              # a key with a line break
    (b'{"source": "x", "a\\tb": {"c": 99999999999999999999}}', '["a\\tb"].c: integer too large'),
    (b'{"source": "\xe6\x88\x91", "source": "x"}', "key 'source' appears twice"),     # once: the last, silently
])
def test_hostile_json_gets_400_not_a_dropped_connection(server, body, words):
    status, _, raw = request(server, "POST", "/api/sentence", body)
    payload = json.loads(raw)
    assert status == 400 and words in payload["error"] and "\n" not in payload["error"], payload


def test_work_bombs_are_refused_with_413_before_computing(server):
    started = time.perf_counter()
    wide = {"version": 1, "kind": "attention", "q": [[0.5] * 6000], "k": [[0.5] * 6000], "v": [[1.0]]}
    status, payload = post_json(server, "/api/trace", wide)
    assert status == 413 and "MAX_SPEC_WIDTH" in payload["error"] and payload["field"] == "q"
    rows = {"version": 1, "kind": "attention", "q": [[1.0]] * 1500, "k": [[1.0]] * 1500, "v": [[1.0]] * 1500}
    status, payload = post_json(server, "/api/trace", rows)
    assert status == 413 and "MAX_SPEC_ROWS" in payload["error"]
    huge = {"version": 1, "kind": "attention", "q": [[1.0, 1e300]], "k": [[1.0, 1.0]], "v": [[1.0]]}
    status, payload = post_json(server, "/api/trace", huge)     # once null for every score, unlike the reference
    assert status == 413 and payload == {"error": "q[0][1]: 1e+300 is beyond ±1e+12 (MAX_SPEC_MAGNITUDE)",
                                         "field": "q[0][1]"}
    assert time.perf_counter() - started < 5                    # once 32 s and a 67 MB answer


def test_patch_sentences_meet_the_shared_limits_and_name_their_field(server):
    """POST /api/patch: the sentence limits of limits.py (413, the constant named; the target's is 800, not the
    source's 400) and the model's positions (400), each error naming the sentence it is about."""
    cases = [({"clean": "我" * 401}, 413, "MAX_SOURCE_CHARS", "clean"),
             ({"corrupt": ["她" * 401]}, 413, "MAX_SOURCE_CHARS", "corrupt[0]"),
             ({"target": "a " * 400 + "him"}, 413, "MAX_TARGET_CHARS", "target"),
             ({"target": "I gave him " + "a " * 245}, 400, "positions", "target"),     # 500 characters: allowed
             ({"clean": "我" * 200}, 400, "units", "clean")]
    for body, status, words, field in cases:
        got, payload = post_json(server, "/api/patch", body)
        assert (got, payload["field"]) == (status, field) and words in payload["error"], (body, payload)


# ---- slow clients, concurrency, shutdown --------------------------------------------------------

def test_a_client_trickling_its_head_is_cut_off(server, monkeypatch):
    monkeypatch.setattr(connection, "HEAD_TIMEOUT", 1.0)
    with socket.create_connection(server.server_address, timeout=10) as sock:
        sock.sendall(b"GET /api/info HTTP/1.1\r\n")
        started = time.perf_counter()
        closed = False
        for i in range(10):                                    # one header line every 0.4 s
            time.sleep(0.4)
            try:
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
            except OSError:
                closed = True
                break
            sock.settimeout(0.01)
            try:
                if sock.recv(1) == b"":
                    closed = True
                    break
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                closed = True
                break
    assert closed and time.perf_counter() - started < 3


def test_a_head_that_stops_halfway_gets_408(server, monkeypatch):
    monkeypatch.setattr(connection, "HEAD_TIMEOUT", 0.5)
    started = time.perf_counter()
    status, payload = status_and_json(raw_exchange(server, b"GET /api/info HTTP/1.1\r\n"))
    assert status == 408 and payload["field"] == "request" and time.perf_counter() - started < 5


def test_a_client_that_stops_reading_is_cut_off_and_the_server_serves_on(monkeypatch):
    """Answers nobody reads (a large bundle, the client's window closed): each connection is cut WRITE_TIMEOUT
    after its socket filled, so it stops counting against MAX_CONNECTIONS; /api/info answers meanwhile. The
    answer is encoded once and sent a chunk at a time: four stuck clients do not hold four copies of it
    (a copy each was ~30 MB); a client that reads gets all of it."""
    monkeypatch.setattr(connection, "WRITE_TIMEOUT", 0.5)
    monkeypatch.setattr(connection, "MAX_CONNECTIONS", 4)
    api, bundle = LabAPI(untrained_model()), {"weights": "0" * (32 << 20)}      # a trained model's size, kept
    monkeypatch.setattr(api, "bundle", lambda: bundle)
    srv = make_server(api, "127.0.0.1", 0)
    serve_in_thread(srv)
    port, socks, before = srv.server_address[1], [], _rss_mb()
    try:
        for _ in range(4):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(srv.server_address)
            sock.sendall(f"GET /api/bundle HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            socks.append(sock)
        time.sleep(0.2)
        refused, _, raw = request(srv, "GET", "/api/info")           # the fifth connection: over the cap
        assert refused == 503, raw
        deadline, most = time.perf_counter() + 15, 0.0              # the four are cut off (0.5 s after each
        while (status := request(srv, "GET", "/api/info")[0]) == 503 and time.perf_counter() < deadline:
            most = max(most, _rss_mb() - before)                     # answer fills its socket), then served
            time.sleep(0.1)
        assert status == 200 and most < 80, most                     # one 32 MB encoding, a chunk each
        status, _, raw = request(srv, "GET", "/api/bundle")
        assert status == 200 and json.loads(raw) == bundle
        for sock in socks:                                           # each got part of its answer, then the end
            sock.settimeout(5)
            got = b""
            try:
                while chunk := sock.recv(1 << 20):
                    got += chunk
            except (ConnectionResetError, TimeoutError):
                pass
            length = int(re.search(rb"content-length: (\d+)", got, re.I).group(1))
            assert len(got.partition(b"\r\n\r\n")[2]) < length
    finally:
        for sock in socks:
            sock.close()
        srv.shutdown()
        srv.server_close()


def test_info_and_the_page_answer_while_every_model_thread_waits_and_a_left_request_never_runs(monkeypatch):
    """With the one model thread busy, /api/info and index.html answer at once (threads of their own); a POST
    whose client leaves while it waits is dropped without running."""
    monkeypatch.setattr(server_module, "WORKERS", 1)
    release, ran = threading.Event(), []

    def slow_claims():
        release.wait(20)
        return [claims.run_check("A1")]

    def counted_spec(doc):
        ran.append(doc)
        return run_spec(doc)

    srv = make_server(LabAPI(untrained_model(), run_spec=counted_spec, run_claims=slow_claims), "127.0.0.1", 0)
    serve_in_thread(srv)
    port = srv.server_address[1]
    try:
        with ThreadPoolExecutor(1) as pool:
            verify = pool.submit(request, srv, "GET", "/api/verify")
            time.sleep(0.3)
            started = time.perf_counter()
            assert request(srv, "GET", "/api/info")[0] == 200 and request(srv, "GET", "/")[0] == 200
            assert time.perf_counter() - started < 2
            body = json.dumps(examples.block_spec()).encode()
            with socket.create_connection(srv.server_address) as sock:   # queued behind verify, then gone
                sock.sendall(f"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                             f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                time.sleep(0.3)
            time.sleep(1.0)                                          # the server sees it leave
            release.set()
            assert verify.result(timeout=30)[0] == 200
            assert post_json(srv, "/api/trace", examples.block_spec())[0] == 200
        assert len(ran) == 1                                         # the last request's, not the one that left
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


def test_a_slow_body_gets_408(server, monkeypatch):
    monkeypatch.setattr(server_module, "BODY_TIMEOUT", 0.5)
    port = server.server_address[1]
    head = (f"POST /api/sentence HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{").encode()
    status, payload = status_and_json(raw_exchange(server, head))
    assert status == 408 and payload["field"] == "body"


def test_info_answers_while_verify_computes():
    release = threading.Event()

    def slow_claims():
        release.wait(20)
        return [claims.run_check("A1")]

    api = LabAPI(untrained_model(), run_claims=slow_claims)
    srv = make_server(api, "127.0.0.1", 0)
    serve_in_thread(srv)
    try:
        with ThreadPoolExecutor(2) as pool:
            verify = pool.submit(request, srv, "GET", "/api/verify")
            time.sleep(0.3)
            started = time.perf_counter()
            status, _, _ = request(srv, "GET", "/api/info")
            waited = time.perf_counter() - started
            status_s, body = post_json(srv, "/api/sentence", {"source": "我／给／他"})
            release.set()
            assert verify.result(timeout=30)[0] == 200
        assert status == 200 and status_s == 200 and waited < 2
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
def test_load_sixteen_threads_mixed_requests_identical_answers(server, api):
    spec = examples.block_spec()
    want_trace = json.loads(json.dumps(run_spec(spec)))
    sentence = {"source": DEFAULT_SOURCE, "target": DEFAULT_TARGET}
    want_sentence = json.loads(json.dumps(api.sentence(sentence), ensure_ascii=False))
    want_info = json.loads(json.dumps(api.info(), ensure_ascii=False))
    jobs = [("trace", spec), ("sentence", sentence), ("info", None), ("bad", {"source": 3})] * 80   # 320

    def one(job):
        kind, payload = job
        if kind == "info":
            status, _, raw = request(server, "GET", "/api/info")
            return kind, status, json.loads(raw)
        path = "/api/sentence" if kind in ("sentence", "bad") else "/api/trace"
        return (kind, *post_json(server, path, payload))

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, jobs))
    elapsed = time.perf_counter() - started
    want = {"trace": (200, want_trace), "sentence": (200, want_sentence), "info": (200, want_info)}
    for kind, status, body in results:
        if kind == "bad":
            assert status == 400 and body["field"] == "source"
        else:
            assert (status, body) == want[kind], kind
    print(f"\nlab load: {len(results)} requests from 16 threads in {elapsed:.1f} s")
    assert elapsed < 120


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_memory_after_a_burst_of_hostile_requests(server):
    before = _rss_mb()
    bombs = [
        ("/api/trace", json.dumps({"version": 1, "kind": "attention", "q": [[0.5] * 16000], "k": [[0.5] * 16000],
                                   "v": [[1.0]]}).encode()),
        ("/api/trace", json.dumps({"version": 1, "kind": "attention", "q": [[1.0]] * 1500, "k": [[1.0]] * 1500,
                                   "v": [[1.0]] * 1500}).encode()),
        ("/api/sentence", b'{"source": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("/api/sentence", b'{"source": "' + "我".encode() * 100_000 + b'"}'),
    ]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda job: request(server, "POST", *job)[0], bombs * 6))
    assert all(400 <= s < 500 for s in statuses), statuses
    assert _rss_mb() - before < 300


# ---- the command: non-loopback needs --expose; Ctrl-C with a slow client ------------------------------

def test_other_addresses_need_expose(api):
    with pytest.raises(UsageError, match="--expose"):
        make_server(api, "0.0.0.0", 0)
    srv = make_server(api, "0.0.0.0", 0, expose=True, allow_hosts=("lab.example",))
    try:
        port = srv.server_address[1]
        assert f"lab.example:{port}" in srv.allowed_hosts and f"localhost:{port}" in srv.allowed_hosts
        assert not any(h.startswith("127.") and h != f"127.0.0.1:{port}" for h in srv.allowed_hosts)
    finally:
        srv.server_close()


def _start_lab(tmp_path, *extra):
    proc = subprocess.Popen([sys.executable, "-m", "glassformer.cli", "lab", "--port", "0", "--no-browser", *extra],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    line = proc.stdout.readline()
    match = re.search(r"http://([\d.]+):(\d+)/", line)
    assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, (match.group(1), int(match.group(2)))


@pytest.mark.slow
def test_ctrl_c_stops_the_server_well_before_the_slow_clients_time_out(tmp_path):
    """Two clients that never finish their request (the server would wait 10 s for each): Ctrl-C still ends
    the process, exit 0, in under 5 s (its own shutdown, not the clients' timeouts)."""
    proc, address = _start_lab(tmp_path)
    socks = []
    try:
        with socket.create_connection(address, timeout=10) as probe:      # serving
            probe.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{address[1]}\r\n\r\n".encode())
            assert b"200" in probe.recv(100)
        head_only = socket.create_connection(address, timeout=10)
        head_only.sendall(b"GET /api/info HTTP/1.1\r\nX-Slow: 1\r\n")          # head never finished
        half_body = socket.create_connection(address, timeout=10)
        half_body.sendall(f"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:{address[1]}\r\nContent-Type: "
                          "application/json\r\nContent-Length: 1000\r\n\r\n{".encode())  # body never finished
        socks = [head_only, half_body]
        time.sleep(0.5)
        started = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
        assert time.perf_counter() - started < 5.0 and code == 0
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_binding_elsewhere_warns(tmp_path):
    run = subprocess.run([sys.executable, "-m", "glassformer.cli", "lab", "--host", "0.0.0.0", "--port", "0",
                          "--no-browser"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=ENV)
    assert run.returncode == 2 and "--expose" in run.stderr and run.stderr.count("\n") == 1
    # the lab as a shell starts it: Ctrl-C at its default disposition (a child inherits an ignored SIGINT, and
    # Python then installs no KeyboardInterrupt handler; a test runner's own signal state must not leak in)
    proc = subprocess.Popen([sys.executable, "-m", "glassformer.cli", "lab", "--host", "0.0.0.0", "--port", "0",
                             "--no-browser", "--expose"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.stdout.readline()
        first = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)      # the 2-second stop is its own test; this one is about the warning
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    assert "warning" in first and code == 0, (first, code, signal.getsignal(signal.SIGINT), proc.stderr.read()[-2000:])


def test_a_ctrl_c_before_the_server_runs_stops_it(monkeypatch, tmp_path):
    """A Ctrl-C that lands after the lab has printed its address but before uvicorn has its own handlers asks the
    server to stop instead of raising KeyboardInterrupt, which Python drops when it lands in a callback (once under a
    loaded suite: the lab served on, deaf to it, until killed after 60 s)."""
    from glassformer.cli import main
    from glassformer.lab.server import LabServer

    real, raised = LabServer.serve_forever, []

    def interrupted(self):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raised.append(True)
            raise
        real(self)                                      # asked to stop already: starts, then stops at once

    monkeypatch.setattr(LabServer, "serve_forever", interrupted)
    monkeypatch.chdir(tmp_path)
    started = time.perf_counter()
    assert main(["lab", "--port", "0", "--no-browser"]) == 0
    assert raised == [] and time.perf_counter() - started < 30
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler           # the caller's handler back


# ---- generated junk --------------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
KEYS = st.sampled_from(["source", "target", "positions", "top_k", "x"])
SENTENCE = st.dictionaries(KEYS, JSON | st.text(max_size=30), max_size=4)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=JSON | SENTENCE)
def test_generated_sentence_bodies_are_answered_or_refused_in_one_line(api, body):
    try:
        api.sentence(body)
    except UsageError as error:
        assert 400 <= error.status < 500 and "\n" not in str(error) and error.field


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(body=JSON | st.fixed_dictionaries({"version": st.just(1),
                                          "kind": st.sampled_from(["attention", "encoder_block"])},
                                         optional={"q": JSON, "k": JSON, "v": JSON, "x": JSON, "mask": JSON}))
def test_generated_trace_bodies_are_refused_in_one_line(api, body):
    try:
        api.trace(body)
    except UsageError as error:
        assert 400 <= error.status < 500 and "\n" not in str(error)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_generated_bytes_over_http_never_get_a_5xx(server, raw):
    status, headers, body = request(server, "POST", "/api/sentence", raw)
    assert status < 500 and headers["content-type"].startswith("application/json")
    assert "\n" not in json.loads(body).get("error", "") if status >= 400 else True
