"""The offline file's packed weights (lab/bundle.py pack_weights, static/pack.js): lossless, written in characters
that HTML script text keeps as they are, read back by the page's decoder (run by Node) to the same bytes, and a
damaged copy named in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import glassformer
from glassformer.lab.bundle import PACK_ESCAPE_BASE, PACK_ESCAPED, BundleError, pack_weights, unpack_weights

PACK_JS = Path(glassformer.__file__).parent / "lab" / "static" / "pack.js"
NODE = shutil.which("node")

# the page's decoder on a packed text: its bytes as hex, or {"error": message}
RUNNER = """
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const [packJs, jobPath] = process.argv.slice(2);
const { unpackWeights } = await import(pathToFileURL(packJs).href);
const job = JSON.parse(readFileSync(jobPath, "utf8"));
const out = [];
for (const c of job) {
  try { out.push({ hex: Buffer.from(await unpackWeights(c.text, c.info)).toString("hex") }); }
  catch (e) { out.push({ error: e.message }); }
}
console.log(JSON.stringify(out));
"""


def _samples() -> list[tuple[bytes, int]]:
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal(n) * 0.05).astype("<f4").tobytes() for n in (0, 1, 2, 3, 7, 1000, 50_000)]
    halves = [(rng.standard_normal(n)).astype("<f2").tobytes() for n in (1, 5, 999)]
    awkward = [bytes(range(256)) * 8, bytes(4 * 64), b"\x0d\x3c\x00\x00" * 100]    # escaped values everywhere
    return [(w, 4) for w in weights] + [(h, 2) for h in halves] + [(a, 4) for a in awkward]


def test_packing_is_lossless_and_holds_only_characters_script_text_keeps():
    for raw, width in _samples():
        text, info = pack_weights(raw, width)
        assert unpack_weights(text, info) == raw
        assert not set(text) & {"\0", "\r", "<"}
        assert all(ord(c) < 0x80 or PACK_ESCAPE_BASE <= ord(c) < PACK_ESCAPE_BASE + 128 * 2 * len(PACK_ESCAPED)
                   for c in text)
    # the escapes are exercised: values 0, 13 and 60 occur in these streams
    text, _ = pack_weights(bytes(range(256)) * 8, 4)
    assert any(ord(c) >= PACK_ESCAPE_BASE for c in text)


def test_trained_looking_weights_take_less_room_than_base64():
    raw = (np.random.default_rng(1).standard_normal(200_000) * 0.05).astype("<f4").tobytes()
    text, _ = pack_weights(raw, 4)
    assert len(text.encode("utf-8")) < 1.0 * len(raw) < 4 / 3 * len(raw)


def test_a_damaged_packing_is_named():
    raw = (np.random.default_rng(2).standard_normal(5000) * 0.05).astype("<f4").tobytes()
    text, info = pack_weights(raw, 4)
    flipped = text[:100] + ("!" if text[100] != "!" else "#") + text[101:]
    with pytest.raises(BundleError, match="model bundle: weights"):
        unpack_weights(flipped, info)


@pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")
def test_the_pages_decoder_reads_the_same_bytes(tmp_path):
    cases, want = [], []
    for raw, width in _samples():
        text, info = pack_weights(raw, width)
        cases.append({"text": text, "info": info})
        want.append(raw.hex())
    text, info = pack_weights((np.arange(4000, dtype="<f4") * 0.01).tobytes(), 4)
    cases += [{"text": text[: len(text) // 2], "info": info},                            # cut short
              {"text": text[:50] + ("!" if text[50] != "!" else "#") + text[51:], "info": info},   # one character
              {"text": text, "info": {**info, "format": "base64"}}]
    (tmp_path / "job.json").write_text(json.dumps(cases))
    (tmp_path / "run.mjs").write_text(RUNNER)
    done = subprocess.run([NODE, str(tmp_path / "run.mjs"), str(PACK_JS), str(tmp_path / "job.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert [g.get("hex") for g in got[: len(want)]] == want
    for g in got[len(want):]:
        assert "error" in g and g["error"].startswith("model bundle: ") and "\n" not in g["error"], g
