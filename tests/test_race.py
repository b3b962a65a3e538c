"""The race harness's pieces that need no export: batching, limits, the roofline, the comparisons and
the report; the glassformer system in-process; CTranslate2's compute types where it is installed."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmarks import race
from benchmarks.stats import speedup, summary
from tokenizers import Tokenizer, models

from glassformer.decoding.search import greedy
from glassformer.model import ModelConfig, Transformer


def test_sorted_batches_cover_every_sentence_once_shortest_first():
    lengths = [5, 1, 3, 3, 9, 2, 7]
    batches = race.sorted_batches(lengths, 3)
    assert batches == [[1, 5, 2], [3, 0, 6], [4]]                       # ties keep input order
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert race.sorted_batches([], 4) == []
    with pytest.raises(ValueError):
        race.sorted_batches(lengths, 0)


def test_output_limit_and_flops():
    assert race.output_limit([3, 7], cap=100) == 24                      # 2 x 7 + 10
    assert race.output_limit([3, 70], cap=100) == 100
    assert race.gemm_flops(2, 3, 4) == 48
    assert race.count_differences([[1, 2], [3], []], [[1, 2], [4], [5]]) == 2
    with pytest.raises(ValueError):
        race.count_differences([[1]], [])


def test_roofline_reports_every_precision_per_shape():
    rows = race.roofline(threads=1, seconds=0.01, shapes=((8, 16, 32), (4, 8, 8)))
    assert [(r["m"], r["dtype"]) for r in rows] == [(4, "float32"), (4, "bfloat16"), (4, "int8"),   # smallest first
                                                   (8, "float32"), (8, "bfloat16"), (8, "int8")]
    assert all(math.isfinite(r["gflops"]) and r["gflops"] > 0 for r in rows)
    rows = race.roofline(threads=1, seconds=0.01, shapes=((8, 16, 32), (4, 8, 8)), max_seconds=0.0)
    assert [r["gflops"] is None for r in rows] == [False] * 3 + [True] * 3   # estimated too slow: skipped
    assert all("skipped" in r for r in rows[3:])


def _result(case, system, rates, bleu):
    return {"case": case, "system": system, "tokens_per_s": summary(rates), "bleu": bleu, "chrf": 50.0,
            "sentences": 10, "differ_from_baseline": 0,
            "rss_loaded_mb": 100.0, "rss_peak_mb": 150.0}


def test_comparisons_pick_the_fastest_precision_that_holds_quality():
    timings = {("g", "glassformer/float32"): [200.0, 300.0], ("g", "glassformer/int8"): [400.0, 500.0],
               ("g", "glassformer/bfloat16"): [900.0, 900.0], ("g", "ctranslate2/float32"): [100.0, 100.0],
               ("g", "ctranslate2/int8"): [100.0, 250.0]}
    bleu = {"glassformer/float32": 30.0, "glassformer/int8": 29.8, "glassformer/bfloat16": 29.6,
            "ctranslate2/float32": 30.0, "ctranslate2/int8": 29.0}
    results = [_result("g", s, r, bleu[s]) for (_, s), r in timings.items()]
    out = race.comparisons(results, timings, speedup)
    same, best = out
    assert (same["ours"], same["theirs"]) == ("glassformer/float32", "ctranslate2/float32")
    assert same["speedup"]["median"] == pytest.approx(2.5)               # 200/100 and 300/100, round by round
    assert (best["ours"], best["theirs"]) == ("glassformer/int8", "ctranslate2/int8")   # bf16 lost 0.4 BLEU
    assert best["speedup"]["min"] == pytest.approx(2.0) and best["speedup"]["max"] == pytest.approx(4.0)
    assert race.comparisons([r for r in results if r["system"].startswith("glass")], timings, speedup) == []
    empty = {k: [0.0, 0.0] for k in timings}                            # every output empty: no ratio to take
    assert race.comparisons(results, empty, speedup) == []


def test_float32_against_float32_takes_each_sides_fastest_float32_system():
    timings = {("g", "glassformer/float32"): [100.0], ("g", race.COMPILED): [400.0], ("g", "glassformer/int8"): [900.0],
               ("g", "ctranslate2/float32"): [100.0], ("g", "ctranslate2/float32-inter"): [200.0],
               ("g", "ctranslate2/int8-inter"): [800.0]}
    bleu = {"glassformer/float32": 30.0, race.COMPILED: 30.0, "glassformer/int8": 29.9, "ctranslate2/float32": 30.0,
            "ctranslate2/float32-inter": 30.0, "ctranslate2/int8-inter": 29.0}
    results = [_result("g", s, r, bleu[s]) for (_, s), r in timings.items()]
    same, best = race.comparisons(results, timings, speedup)
    assert (same["ours"], same["theirs"]) == (race.COMPILED, "ctranslate2/float32-inter")   # not int8, not eager
    assert same["speedup"]["median"] == pytest.approx(2.0)
    assert (best["ours"], best["theirs"]) == ("glassformer/int8", "ctranslate2/int8-inter")


def test_the_stopping_rule_comparison_is_for_beam_cases_only():
    """compiled-full (CTranslate2's stopping rule) is set against CTranslate2's fastest in a beam case, even
    when its BLEU is below the quality bar; a greedy case (where the rule changes nothing) has no such row."""
    out = {}
    for case in ("beam4-b32", "greedy-b32"):
        timings = {(case, "glassformer/float32"): [100.0], (case, race.COMPILED_RULE): [300.0],
                   (case, "ctranslate2/float32"): [100.0], (case, "ctranslate2/int8"): [200.0]}
        bleu = {"glassformer/float32": 30.0, race.COMPILED_RULE: 29.0, "ctranslate2/float32": 30.0,
                "ctranslate2/int8": 29.0}
        results = [_result(case, s, r, bleu[s]) for (_, s), r in timings.items()]
        out[case] = race.comparisons(results, timings, speedup)
    rule = [c for c in out["beam4-b32"] if c["comparison"] == "CTranslate2's stopping rule"]
    assert [(c["ours"], c["theirs"]) for c in rule] == [(race.COMPILED_RULE, "ctranslate2/int8")]
    assert rule[0]["speedup"]["median"] == pytest.approx(1.5)
    assert [c["ours"] for c in out["beam4-b32"] if c["comparison"] == "best against best"] == ["glassformer/float32"]
    assert not any(c["comparison"] == "CTranslate2's stopping rule" for c in out["greedy-b32"])


def test_markdown_report():
    timings = {("greedy-b32", "glassformer/float32"): [1234.0], ("greedy-b32", "ctranslate2/float32"): [617.0]}
    results = [_result("greedy-b32", s, r, 25.0) for (_, s), r in timings.items()]
    report = {"machine": {"cpu": "Test CPU", "threads": 2, "omp_wait_policy": "default", "date": "2026-12-01",
                          "command": "python -m benchmarks.race",
                          "precision": {"capability": "AVX2", "flags": ["avx2"], "amx": False},
                          "versions": {"torch": "2.13.0"}},
              "cases": [{"name": "greedy-b32", "beam": 1, "batch": 32, "sentences": None}], "results": results,
              "comparisons": race.comparisons(results, timings, speedup),
              "roofline": [{"m": 32, "k": 256, "n": 1024, "dtype": d, "gflops": g}
                           for d, g in (("float32", 224.0), ("bfloat16", 497.0), ("int8", 12.5))]}
    text = race.markdown(report)
    assert "| glassformer/float32 | 1,234 [1,234, 1,234] | 25.00 |" in text
    assert "| greedy-b32 | precision for precision | glassformer/float32 / ctranslate2/float32 | 2.00x" in text
    assert "| 32 x 256 by 256 x 1024 | 224 | 497 | 12.5 |" in text
    assert "AMX absent" in text and "avx2" in text and "OMP_WAIT_POLICY default" in text


def test_the_glassformer_system_returns_outputs_in_input_order():
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny(src_vocab=40, tgt_vocab=30)).eval()
    with torch.no_grad():
        model.head.weight.mul_(4.0)
    sources = [[5, 6, 7, 8, 9], [12], [14, 15, 16], [18, 19]]
    want = [greedy(model, torch.tensor([s]))[0] for s in sources]
    for dtype in ("float32", "int8"):
        system = race.Glassformer(model, dtype, threads=1)
        got = system.translate(sources, beam=1, batch=3)
        assert got == want if dtype == "float32" else len(got) == len(sources)


def test_token_map_between_ids_and_tokens(tmp_path):
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "我": 4, "书": 5}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(tmp_path / "t.json"))
    tokens = race.TokenMap(tmp_path / "t.json")
    assert tokens.to_tokens([4, 5, 2]) == ["我", "书", "</s>"]
    assert tokens.to_ids(["书", "?"], unknown=3) == [5, 3]


def test_ctranslate2_systems_are_the_supported_compute_types():
    ctranslate2 = pytest.importorskip("ctranslate2")
    supported = ctranslate2.get_supported_compute_types("cpu")
    names = race.systems(argparse.Namespace(ct2="somewhere", hf=None, threads=1))
    assert names[:3] == ["glassformer/float32", "glassformer/bfloat16", "glassformer/int8"]
    assert names[3:] == [f"ctranslate2/{t}" for t in ("float32", "int8", "bfloat16") if t in supported]
    inter = [race.COMPILED_INTER, race.COMPILED_BF16 + race.INTER, race.COMPILED_INT8 + race.INTER]
    for threads, inters in ((1, []), (2, inter)):                          # worker processes: threads to give
        names = race.systems(argparse.Namespace(ct2=None, hf=None, threads=threads, compiled=True))
        assert names[3:] == [race.COMPILED, race.COMPILED_RULE, race.COMPILED_BF16, race.COMPILED_INT8, *inters]
    assert [race.env_threads(name, 2) for name in inter] == [1, 1, 1]
    names = race.systems(argparse.Namespace(ct2="somewhere", hf=None, threads=2))   # both thread layouts
    assert names[3:] == [f"ctranslate2/{t}{x}" for t in ("float32", "int8", "bfloat16") if t in supported
                         for x in ("", "-inter")]


def test_ctranslate2_inter_layout_runs_batches_on_a_thread_each(monkeypatch):
    ctranslate2 = pytest.importorskip("ctranslate2")
    seen = []
    monkeypatch.setattr(ctranslate2, "Translator", lambda folder, **kw: seen.append(kw))
    monkeypatch.setattr(race, "TokenMap", lambda path: argparse.Namespace(ids={}))
    monkeypatch.setattr(race, "_ct2_cap", lambda run: 100)
    race.build_system("ctranslate2/int8", argparse.Namespace(ct2="x", run="r", threads=3))
    race.build_system("ctranslate2/int8-inter", argparse.Namespace(ct2="x", run="r", threads=3))
    assert [(k["compute_type"], k["inter_threads"], k["intra_threads"]) for k in seen] == [("int8", 1, 3),
                                                                                        ("int8", 3, 1)]
    assert race.env_threads("ctranslate2/int8-inter", 3) == 1                    # OpenMP / MKL: one per batch
    assert race.env_threads("ctranslate2/int8", 3) == race.env_threads("glassformer/compiled", 3) == 3


def test_a_missing_folder_is_one_line_and_status_2(tmp_path, capsys):
    assert race.main(["--run", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--run" in err


def test_peak_rss_is_the_workers_own_not_the_parents():
    """A fresh process (as each system's worker is) starts near its own size, whatever the parent held,
    and its peak grows with what it touches (ru_maxrss would carry the parent's peak across exec)."""
    code = ("from benchmarks.race import rss_mb; a = rss_mb(); block = b'x' * (200 << 20); "
            "print(a, rss_mb())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(race.__file__).parent.parent)
    start, peak = map(float, done.stdout.split())
    assert start < 100                                                   # stdlib only: tens of MiB
    assert peak >= start + 190


def test_every_worker_gets_the_wait_policy_asked_for_not_the_callers(monkeypatch):
    from benchmarks.pipe import child_env
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")                  # the caller's own, which must not leak
    assert "OMP_WAIT_POLICY" not in child_env(2, wait_policy="default")
    assert child_env(2, wait_policy="PASSIVE")["OMP_WAIT_POLICY"] == "PASSIVE"
    assert child_env(3)["OMP_NUM_THREADS"] == "3"
    with pytest.raises(ValueError, match="wait_policy"):
        child_env(2, wait_policy="passive ")
    args = race.parse(["--run", "r"])
    assert args.omp_wait_policy == "default"
    assert race.parse(["--run", "r", "--omp-wait-policy", "PASSIVE"]).omp_wait_policy == "PASSIVE"


def test_the_command_race_sets_each_sides_fastest_against_the_other_round_by_round():
    """benchmarks/command.py: glassformer's fastest float32 layout over CTranslate2's fastest float32 layout, and
    the fastest of each over all (int8 included), the ratio taken round by round."""
    from benchmarks import command

    def row(system, rates):
        return {"system": system, "rates": rates, "words_per_s": sorted(rates)[len(rates) // 2]}
    rows = [row("glassformer/float32/workers1", [100, 120, 110]), row("glassformer/float32/workers2", [150, 90, 140]),
            row("glassformer/int8/workers2", [300, 280, 290]), row("ctranslate2/float32", [50, 60, 55]),
            row("ctranslate2/float32-inter", [200, 150, 100]), row("ctranslate2/int8-inter", [400, 500, 450])]
    by = {c["comparison"]: c for c in command._comparisons(rows)}
    assert (by["float32"]["ours"], by["float32"]["theirs"]) == ("glassformer/float32/workers2",
                                                                "ctranslate2/float32-inter")
    assert by["float32"]["speedup"]["median"] == pytest.approx(0.75)          # 150/200, 90/150, 140/100
    assert (by["best against best"]["ours"], by["best against best"]["theirs"]) == ("glassformer/int8/workers2",
                                                                                    "ctranslate2/int8-inter")
    assert by["best against best"]["speedup"]["min"] == pytest.approx(280 / 500)      # round 2


def test_the_command_races_beam_search_also_at_ctranslate2s_stopping_rule():
    """A beam case runs each glassformer system twice, at the default rule and at CTranslate2's (`--stop full`, the
    search CTranslate2 runs with a length penalty: fewer steps), and compares each rule with CTranslate2 apart; a
    greedy case has one rule."""
    from benchmarks import command

    commands = {"glassformer/float32/workers2": ["gf"], "ctranslate2/float32-inter": ["ct2"]}
    greedy = command.case_runs(commands, 1, 32)
    assert sorted(greedy) == sorted(commands) and greedy["glassformer/float32/workers2"] == ["gf", "--batch-size",
                                                                                              "32", "--beam", "1"]
    beam = command.case_runs(commands, 4, 32)
    assert beam["glassformer/float32/workers2/stop-full"] == ["gf", "--batch-size", "32", "--beam", "4", "--stop",
                                                              "full"]
    assert "--stop" not in beam["glassformer/float32/workers2"] and "--stop" not in beam["ctranslate2/float32-inter"]

    def row(system, rates):
        return {"system": system, "rates": rates, "words_per_s": sorted(rates)[len(rates) // 2]}
    rows = [row("glassformer/float32/workers2", [50, 40, 60]), row("glassformer/float32/workers2/stop-full",
                                                                    [100, 90, 110]),
            row("ctranslate2/float32-inter", [100, 100, 100])]
    by = {c["comparison"]: c for c in command._comparisons(rows)}
    assert by["float32"]["ours"] == "glassformer/float32/workers2"            # the default rule's, not the faster
    assert by["float32"]["speedup"]["median"] == pytest.approx(0.5)
    assert by["float32, CTranslate2's stopping rule"]["ours"] == "glassformer/float32/workers2/stop-full"
    assert by["float32, CTranslate2's stopping rule"]["speedup"]["median"] == pytest.approx(1.0)
    rows = rows[:1] + rows[2:]                                                   # greedy: no second rule
    assert [c["comparison"] for c in command._comparisons(rows)] == ["float32", "best against best"]


def test_the_command_race_runs_what_a_user_runs(tmp_path):
    """Each system is a command line: glassformer translate with --compile on at each precision and worker count
    (1 and the threads), CTranslate2's script in both thread layouts."""
    from benchmarks import command

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model": {"max_len": 96}}')
    args = argparse.Namespace(run=str(run), ct2=str(tmp_path), threads=2, dtypes="float32,int8", ct2_layouts="both")
    lines = command.systems(args)
    assert sorted(lines) == ["ctranslate2/float32", "ctranslate2/float32-inter", "ctranslate2/int8",
                             "ctranslate2/int8-inter", "glassformer/float32/workers1", "glassformer/float32/workers2",
                             "glassformer/int8/workers1", "glassformer/int8/workers2"]
    gf = lines["glassformer/int8/workers2"]
    assert gf[1:3] == ["translate", "--model"] and gf[gf.index("--compile") + 1] == "on"
    assert gf[gf.index("--dtype") + 1] == "int8" and gf[gf.index("--workers") + 1] == "2"
    assert "--inter" in lines["ctranslate2/int8-inter"] and "--inter" not in lines["ctranslate2/int8"]
    assert lines["ctranslate2/float32"][lines["ctranslate2/float32"].index("--max-positions") + 1] == "96"
    args.ct2_layouts = "inter"
    assert sorted(n for n in command.systems(args) if n.startswith("ctranslate2")) == ["ctranslate2/float32-inter",
                                                                                      "ctranslate2/int8-inter"]
    args.threads = 1                                                     # one thread: its one layout either way
    assert sorted(n for n in command.systems(args) if n.startswith("ctranslate2")) == ["ctranslate2/float32",
                                                                                      "ctranslate2/int8"]


def test_the_command_races_sample_is_distinct_new_sentences_of_the_asked_length(tmp_path, capsys):
    from benchmarks import command

    from glassformer.data.datasets import load_split

    lines = command.sample(500)
    assert len(lines) == len(set(lines)) == 500 and all(2 <= len(line) <= 40 for line in lines)
    assert lines == command.sample(500)                                  # the same draw each time
    assert not set(lines) & {p.zh for split in ("test", "tatoeba") for p in load_split(split)}
    for n in ("0", "10000000"):                                          # outside 1..the pool: one line, status 2
        assert command.main(["--run", str(tmp_path), "--sample", n]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"--sample: {n} sentences, outside 1..")
