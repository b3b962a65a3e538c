"""The command line: every usage error is one line naming the argument, with exit status 2."""

import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassformer import limits
from glassformer.cli import main
from glassformer.errors import UsageError
from glassformer.lesson.examples import block_spec
from glassformer.lesson.spec import run_spec


@pytest.mark.parametrize("argv,named", [
    (["translate", "--beam", "0", "x"], "--beam"),
    (["explain"], "sentence"),
    (["evaluate", "--split", "bogus"], "--split"),
    (["no-such-command"], "no-such-command"),
    (["trace"], "spec"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, named, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and named in err[0].lower()


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "trace" in capsys.readouterr().out


# ---- `trace` on hostile files: one line naming the file and the problem, exit 2 ---------------------

BLOCK = json.dumps(block_spec())


@pytest.mark.slow
@pytest.mark.parametrize("raw, words", [
    (BLOCK.encode("utf-16"), ["UTF-16"]),
    (BLOCK.encode("utf-8").replace(b'"x"', b'"\xff"'), ["not UTF-8", "0xff"]),
    (BLOCK.replace("1e-05", "7" * 4000).encode(), ["eps", "integer too large"]),
    (BLOCK.replace("1e-05", "7" * 5000).encode(), ["4,300 digits"]),
    (("[" * 100_000 + "]" * 100_000).encode(), ["nested deeper"]),
    (json.dumps({**block_spec(), "x": [[0.5] * 20_000] * 3}).encode(), ["x: columns", "MAX_SPEC_WIDTH"]),
    (json.dumps({"version": 1, "kind": "attention", "q": [[1.0]] * 2000, "k": [[1.0]] * 2000,
                 "v": [[1.0]] * 2000}).encode(), ["q: rows", "MAX_SPEC_ROWS"]),
    (b"", ["empty"]),
    (json.dumps({**block_spec(), "x": [["\ud800"]]}).encode(), ["lone surrogate"]),
    (BLOCK.replace('"norm"', '"eps": 1e300, "norm"', 1).encode(), ["'eps' appears twice"]),   # once: the last
    (json.dumps({**block_spec(), "x": [[1e300]]}).encode(), ["x[0][0]: 1e+300", "MAX_SPEC_MAGNITUDE"]),
])
def test_trace_refuses_hostile_files_in_one_line(tmp_path, capsys, raw, words):
    path = tmp_path / "spec.json"
    path.write_bytes(raw)
    tracemalloc.start()
    try:
        code = main(["trace", str(path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"glassformer trace: error: {path}: ")
    for w in words:
        assert w in err, (w, err)
    assert peak < 400 << 20                     # the 20,000-wide rows once peaked at 3.4 GB


def test_trace_file_size_limit_and_no_limits(tmp_path, capsys):
    path = tmp_path / "big.json"
    doc = {"version": 1, "kind": "attention", "q": [[0.25] * 4] * 300, "k": [[0.5] * 4] * 300,
           "v": [[1.0] * 2] * 300}                                 # 300 rows: over MAX_SPEC_ROWS
    path.write_text(json.dumps(doc))
    assert main(["trace", str(path)]) == 2
    assert "MAX_SPEC_ROWS" in capsys.readouterr().err
    assert main(["trace", "--no-limits", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["weights"]) == 300 and out["weights"][0][0] == pytest.approx(1 / 300)
    path.write_text(json.dumps({**doc, "padding": " " * (limits.MAX_SPEC_FILE_BYTES)}))
    assert main(["trace", str(path)]) == 2
    assert "MAX_SPEC_FILE_BYTES" in capsys.readouterr().err


# ---- generated junk at the spec parser ----------------------------------------------------------

JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=25)
SPEC_KEYS = st.sampled_from(["version", "kind", "q", "k", "v", "x", "mask", "key_padding", "self_attention", "ffn",
                             "norm", "eps", "layer_norms", "disabled_heads", "memory", "scale"])


def _mutations():
    base = st.sampled_from([block_spec(), {"version": 1, "kind": "attention", "q": [[1.0, 0.0]],
                                           "k": [[1.0, 0.0], [0.0, 1.0]], "v": [[1.0], [2.0]]}])
    return st.builds(lambda doc, changes: {**doc, **changes}, base, st.dictionaries(SPEC_KEYS, JUNK, max_size=2))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(doc=JUNK | _mutations())
def test_generated_specs_run_or_fail_in_one_line(doc):
    try:
        out = run_spec(doc)
    except UsageError as error:
        assert "\n" not in str(error) and str(error)
        assert error.status in (400, 413)
    else:
        assert out["version"] == 1
