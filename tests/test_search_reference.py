"""The searches against a plain beam search written here: fairseq's rules as docs/translator.md states them.

A scripted model's next-token probabilities depend only on the prefix generated so far (a table). decoding/search.py
(through `generate` and `strategy`, as the Translator calls them) and the page's engine/search.js (through Node,
tests/engine/run_cases.mjs) must return the reference's hypotheses, their scores to 1e-9 and its number of steps.
Each rule has a table on which breaking it changes the answer (comparing two searches on a small model does not:
there these rules seldom change the winner); random tables on several seeds besides. Planted bugs, each in a copy
of search.py or search.js, turn their rule's table and the random tables red (the last tests here). The tables have
no exactly equal candidates: search.py's beams take equals in torch.topk's order, which is not specified.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
import types
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import glassformer
from glassformer.decoding import candidates as candidates_module
from glassformer.decoding import search as search_module
from glassformer.model import ModelConfig

ENGINE = Path(glassformer.__file__).parent / "lab" / "static" / "engine"
RUNNER = Path(__file__).parent / "engine" / "run_cases.mjs"
NODE = shutil.which("node")
TOL = 1e-9                                # scores: reference vs a search (float64 both)

PAD, BOS, EOS, A, B, C, D = range(7)      # the model's ids (ModelConfig's defaults: PAD 0, BOS 1, EOS 2)
VOCAB = 7
WIDE = 1100                               # a vocabulary where search.py reads candidates in blocks (candidates.py)
SPREAD = {A: 40, B: 517, C: 1030, D: WIDE - 1}   # A..D's ids in it: each in a block of its own


# ---- the reference -----------------------------------------------------------------------------------------------

class Hyp(NamedTuple):
    tokens: tuple[int, ...]   # generated ids, EOS left out
    score: float              # summed log-probability
    normalized: float         # score / length^alpha, the length counting EOS
    finished: bool            # ended with EOS (False: cut at the limit)


def reference(table, beam: int, alpha: float, limit: int, n_best: int = 1, greedy: bool = False
              ) -> tuple[list[Hyp], int]:
    """The n_best hypotheses, best first, and the steps taken. Each step every continuation of every live beam
    (PAD never) is ranked best first; the best 2K are candidates (greedy: the best one); a candidate that ends
    (EOS; at the limit, any token) finishes a hypothesis if it is among the top K, else it is dropped; the best K
    that do not end stay live. Done when no beam is live, at the limit, or when no live beam can beat the n-th best
    finished hypothesis: with log-probabilities <= 0, a beam with score s after L tokens ends at best at
    max(s / (L+1)^alpha, s / limit^alpha)."""
    beams = [(0.0, ())]                                                  # (score, prefix)
    found: list[Hyp] = []
    for length in range(1, limit + 1):                                  # tokens generated after this step
        continuations = [(score + math.log(p), prefix, token) for score, prefix in beams
                         for token, p in sorted(table(prefix).items()) if token != PAD and p > 0]
        continuations.sort(key=lambda c: -c[0])                          # stable: equals keep beam, then id order
        live = []
        for rank, (score, prefix, token) in enumerate(continuations[:1 if greedy else 2 * beam]):
            if token == EOS or length == limit:
                if rank < beam:
                    tokens = prefix if token == EOS else prefix + (token,)
                    found.append(Hyp(tokens, score, score / length ** alpha, token == EOS))
            elif len(live) < beam:
                live.append((score, prefix + (token,)))
        found.sort(key=lambda h: -h.normalized)                          # stable: the earlier first among equals
        del found[n_best:]
        if not live:
            break
        reach = max(max(s / min(length + 1, limit) ** alpha, s / limit ** alpha) for s, _ in live)
        if len(found) == n_best and reach <= found[-1].normalized:
            break
        beams = live
    return found, length


# ---- tables: prefix -> {id: probability} (a distribution over the whole vocabulary, PAD included) -----------------

def distribution(probs: dict[int, float]) -> dict[int, float]:
    total = sum(probs.values())
    return {token: p / total for token, p in probs.items()}


def jittered(prefix: tuple[int, ...], probs: dict[int, float]) -> dict[int, float]:
    """`probs` with each value moved by under 1 % (seeded by the prefix), renormalised: no two paths tie."""
    rng = random.Random(f"jitter {prefix}")
    return distribution({token: p * (1 + 0.01 * rng.random()) for token, p in probs.items()})


def random_table(seed: int):
    """A random distribution per prefix over PAD, EOS and A..D: uniforms cubed (one token often dominates), as they
    are, or their square roots (flat rows, where a beam's score falls fast) by the seed; now and then a token has
    probability 0 (log-probability -inf)."""
    power = (3.0, 1.0, 0.5)[seed % 3]

    @cache
    def table(prefix: tuple[int, ...]) -> dict[int, float]:
        rng = random.Random(f"table {seed} {prefix}")
        weights = {token: 0.0 if token != EOS and rng.random() < 0.15 else rng.random() ** power + 1e-3
                   for token in (PAD, EOS, A, B, C, D)}
        return distribution({token: w for token, w in weights.items() if w > 0})
    return table


def normalisation_table(prefix):
    """alpha 1: A A A EOS (log(0.6 * 0.7 * 0.7 * 0.99) = -1.23, / 4) wins; unnormalised, [] (log 0.4 = -0.92) wins."""
    if prefix == ():
        return {EOS: 0.4, A: 0.6}
    return {A: 0.7, EOS: 0.3} if len(prefix) < 3 else {EOS: 0.99, A: 0.01}


def rank_table(prefix):
    """K 2: EOS is the first step's third candidate (rank K + 1), so [] may not finish; if it did, log 0.30 = -1.20
    would beat every hypothesis the search can find (no later token above 0.2; PAD's 0.3 is never chosen)."""
    if prefix == ():
        return {A: 0.36, B: 0.34, EOS: 0.30}
    return jittered(prefix, {PAD: 0.3, A: 0.16, B: 0.15, C: 0.14, D: 0.13, EOS: 0.12})


def bound_table(prefix):
    """alpha 1, limit 8: [] (0.9, -0.105) finishes at once; the live A (0.06) and B (0.04) can reach at best
    log(0.06) / 8 = -0.35: the search is done after one step. Without that stop it would go on to the limit."""
    if prefix == ():
        return {EOS: 0.9, A: 0.06, B: 0.04}
    return jittered(prefix, {A: 0.5, B: 0.3, C: 0.15, EOS: 0.05})


def reach_table(prefix):
    """alpha 1, limit 6: [] (0.62, -0.48) finishes first; the live A (0.33, -1.11) is below it divided by
    L + 1 = 2 (-0.55), but divided by up to the limit it can still reach -0.18, and A A A EOS
    ((log 0.33 + 3 log 0.99) / 4 = -0.28) wins."""
    if prefix == ():
        return {EOS: 0.62, A: 0.33, B: 0.05}
    if prefix in ((A,), (A, A)):
        return {A: 0.99, EOS: 0.01}
    return {EOS: 0.99, A: 0.01} if prefix == (A, A, A) else {EOS: 0.6, C: 0.4}


class Design(NamedTuple):
    table: object
    beam: int
    alpha: float
    limit: int


DESIGNS = {                 # each rule's table
    "length normalisation": Design(normalisation_table, 2, 1.0, 6),
    "only the top K finish": Design(rank_table, 2, 1.0, 6),
    "the bound stops early": Design(bound_table, 2, 1.0, 8),
    "the bound reaches the limit": Design(reach_table, 2, 1.0, 6),
}


def test_each_table_makes_its_rule_matter():
    """The premises, from the tables' numbers (not from a search): what breaking each rule would change."""
    lp = math.log
    # length normalisation: [] beats A A A EOS unnormalised, loses to it divided by lengths (1 and 4)
    aaa = lp(0.6 * 0.7 * 0.7 * 0.99)
    assert lp(0.4) > aaa and lp(0.4) / 1 < aaa / 4
    assert reference(*DESIGNS["length normalisation"])[0][0].tokens == (A, A, A)
    # only the top K finish: EOS ranks third; finished, [] would beat the reference's answer
    first = rank_table(())
    assert sorted(first, key=first.get, reverse=True).index(EOS) == 2
    best = reference(*DESIGNS["only the top K finish"])[0][0]
    assert best.tokens != () and lp(first[EOS]) > best.normalized
    # the bound: one step, [] found; the beams left could still continue (they have non-EOS tokens)
    found, steps = reference(*DESIGNS["the bound stops early"])
    assert steps == 1 and found[0].tokens == () and lp(0.06) / 8 <= lp(0.9)
    assert any(t != EOS for t in bound_table((A,)))
    # the bound reaches the limit: A's bound over L + 1 alone would end the search with []
    found, steps = reference(*DESIGNS["the bound reaches the limit"])
    assert lp(0.33) / 2 <= lp(0.62) < lp(0.33) / 6 and found[0].tokens == (A, A, A) and steps == 4


def test_the_reference_is_exhaustive_with_a_beam_wider_than_every_path():
    """With K above the number of paths the reference is exact search: its n best are the best of every path
    (EOS at length <= limit, or cut at the limit), each scored here by its own length penalty."""
    table, limit, alpha = random_table(7), 4, 0.6
    paths = []

    def walk(prefix, score):
        for token, p in table(prefix).items():
            if token == PAD:
                continue
            s, n = score + math.log(p), len(prefix) + 1
            if token == EOS or n == limit:
                paths.append(Hyp(prefix + (() if token == EOS else (token,)), s, s / n ** alpha, token == EOS))
            else:
                walk(prefix + (token,), s)

    walk((), 0.0)
    paths.sort(key=lambda h: -h.normalized)
    found, _ = reference(table, 1000, alpha, limit, n_best=5)
    assert [h.tokens for h in found] == [h.tokens for h in paths[:5]]
    assert [h.normalized for h in found] == pytest.approx([h.normalized for h in paths[:5]], abs=TOL)


# ---- decoding/search.py on a scripted model ------------------------------------------------------------------------

class _Prefixes:
    """The scripted model's cache: each row's generated prefix; reorder follows the beams as a KV cache does."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] | None = None

    def reorder(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        self.rows = [self.rows[i] for i in index.tolist()]


class ScriptedModel:
    """The decoding API `generate` needs (cfg, encode, new_cache, decode_step) over tables: sentence i (source
    [[i]]) has next-token log-probabilities log tables[i](prefix) in float64. `spread`: A..D at those ids of a
    vocabulary of `vocab`. `steps` counts decode_step calls."""

    def __init__(self, tables, vocab: int = VOCAB, spread: dict[int, int] | None = None) -> None:
        self.tables, self.cfg, self.steps = tables, ModelConfig.tiny(max_len=64, tgt_vocab=vocab), 0
        self.out = {t: t for t in range(VOCAB)} | (spread or {})
        self.back = {wide: t for t, wide in self.out.items()}

    def encode(self, src, src_pad=None):
        return src[:, :1, None].double()                                    # (sent, 1, 1): the sentence's table

    def new_cache(self):
        return _Prefixes()

    def decode_step(self, tokens, memory, src_pad, cache):
        self.steps += 1
        if cache.rows is None:                                              # BOS: nothing generated yet
            cache.rows = [() for _ in range(tokens.size(0))]
        else:
            fed = tokens[:, -1].tolist()                                    # the newest ids, A..D at their ids
            cache.rows = [row + (self.back.get(t, t),) for row, t in zip(cache.rows, fed, strict=True)]
        logits = torch.full((tokens.size(0), self.cfg.tgt_vocab), -math.inf, dtype=torch.float64)
        for r, (prefix, which) in enumerate(zip(cache.rows, memory[:, 0, 0].long().tolist(), strict=True)):
            probs = self.tables[which](prefix)
            assert abs(sum(probs.values()) - 1) < 1e-12, prefix              # a distribution: log-softmax keeps it
            for token, p in probs.items():
                logits[r, self.out[token]] = math.log(p)
        return logits[:, None, :]                                           # (rows, 1, vocab)


def python_search(table, beam, alpha, limit, n_best=1, greedy=False, wide=False, module=search_module,
                  scores=True) -> tuple[list[Hyp], int]:
    """`generate` with `strategy(beam)` (Greedy for greedy=True), as the Translator runs it: hypotheses, steps."""
    model = ScriptedModel([table], WIDE, SPREAD) if wide else ScriptedModel([table])
    search = module.strategy(1, scores) if greedy else module.BeamSearch(beam)
    hyps = module.generate(model, torch.tensor([[0]]), search, alpha=alpha, max_len=limit, n_best=n_best)[0]
    found = [Hyp(tuple(model.back.get(t, t) for t in h.tokens), h.score, h.normalized, h.finished) for h in hyps]
    return found, model.steps


def disagreement(got: list[Hyp], want: list[Hyp], scores: bool = True) -> str | None:
    """None when the hypotheses are the same (ids, finished, scores to TOL), else what differs first."""
    if [(h.tokens, h.finished) for h in got] != [(h.tokens, h.finished) for h in want]:
        return f"hypotheses {[(h.tokens, h.finished) for h in got]} != {[(h.tokens, h.finished) for h in want]}"
    for g, w in zip(got, want, strict=True):
        if scores and not (abs(g.score - w.score) <= TOL and abs(g.normalized - w.normalized) <= TOL):
            return f"scores of {g.tokens}: {g.score}, {g.normalized} != {w.score}, {w.normalized}"
    return None


@pytest.mark.parametrize("wide", [False, True], ids=["vocab 7", "vocab 1100"])
@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_python_search_equals_the_reference_on_each_rules_table(name, wide):
    design = DESIGNS[name]
    want, steps = reference(*design)
    got, got_steps = python_search(*design, wide=wide)
    assert disagreement(got, want) is None, disagreement(got, want)
    assert got_steps == steps


RANDOM_SEEDS = range(5)
RANDOM_CASES = [(k, a, n, best, w) for k in (1, 2, 3, 4) for a in (0.0, 0.6, 1.0, 2.0) for n in (1, 5)
                for best in sorted({1, k}) for w in (False, True)]   # beam, alpha, limit, n_best, wide


def python_differs(seed: int, module=search_module) -> tuple | None:
    """The first of RANDOM_CASES on random_table(seed) where `module`'s search is not the reference's, and how."""
    table = random_table(seed)
    for beam, alpha, limit, n_best, wide in RANDOM_CASES:
        want, steps = reference(table, beam, alpha, limit, n_best)
        got, got_steps = python_search(table, beam, alpha, limit, n_best, wide=wide, module=module)
        if disagreement(got, want) is not None or got_steps != steps:
            return (beam, alpha, limit, n_best, wide), disagreement(got, want) or f"steps {got_steps} != {steps}"
    return None


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_python_search_equals_the_reference_on_random_tables(seed):
    """K 1..4 (BeamSearch(1): two candidates), alpha 0 to 2, limits 1 and 5, the n_best 1 and K, both vocabularies
    (one topk of a sentence, or blocks); greedy (one candidate) with and without scores."""
    assert python_differs(seed) is None
    table = random_table(seed)
    for limit, scores in [(n, s) for n in (1, 3, 6) for s in (True, False)]:
        want, steps = reference(table, 1, 1.0, limit, greedy=True)
        got, got_steps = python_search(table, 1, 1.0, limit, greedy=True, scores=scores)
        assert disagreement(got, want, scores) is None and got_steps == steps, (limit, scores)


def test_the_traced_greedy_choice_equals_the_reference(monkeypatch):
    """A compiled greedy step traces candidates.py's other formula (slices around PAD): run eagerly here."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for seed, wide in [(s, w) for s in range(3) for w in (False, True)]:
        want, steps = reference(random_table(seed), 1, 1.0, 6, greedy=True)
        got, got_steps = python_search(random_table(seed), 1, 1.0, 6, greedy=True, wide=wide)
        assert disagreement(got, want) is None and got_steps == steps, (seed, wide)


def test_a_batch_of_tables_and_limits_equals_the_reference_sentence_by_sentence():
    """Sentences with their own tables and limits in one batch (slots shrink as they finish): each sentence's
    hypotheses are its reference's; the batch takes as many steps as its longest."""
    tables = [random_table(seed) for seed in range(6)] + [d.table for d in DESIGNS.values()]
    limits = [2, 3, 4, 5, 6, 7, 6, 6, 8, 6]
    for beam, alpha in [(2, 1.0), (3, 0.6), (4, 2.0)]:
        model = ScriptedModel(tables)
        src = torch.arange(len(tables))[:, None]
        hyps = search_module.generate(model, src, search_module.BeamSearch(beam), alpha=alpha,
                                      max_len=torch.tensor(limits), n_best=2)
        steps = 0
        for i, (table, limit) in enumerate(zip(tables, limits, strict=True)):
            want, taken = reference(table, beam, alpha, limit, n_best=2)
            got = [Hyp(tuple(h.tokens), h.score, h.normalized, h.finished) for h in hyps[i]]
            assert disagreement(got, want) is None, (beam, alpha, i, disagreement(got, want))
            steps = max(steps, taken)
        assert model.steps == steps


# ---- the page's search.js through Node ------------------------------------------------------------------------------

def table_rows(table, limit: int) -> dict[str, dict[str, float]]:
    """Every prefix a live beam can reach within `limit` tokens -> {id: log-probability}, for the runner's case."""
    rows, todo = {}, [()]
    while todo:
        prefix = todo.pop()
        probs = table(prefix)
        rows[",".join(map(str, prefix))] = {str(t): math.log(p) for t, p in probs.items()}
        if len(prefix) + 1 < limit:
            todo += [prefix + (t,) for t in probs if t not in (PAD, EOS)]
    return rows


def scripted_case(table, searches: list[dict]) -> dict:
    limit = max(s["maxLen"] for s in searches)
    return {"kind": "scripted", "pad": PAD, "bos": BOS, "eos": EOS, "modelMaxLen": 64, "vocab": VOCAB,
            "table": table_rows(table, limit), "searches": searches}


def run_js(folder: Path, cases: list[dict], engine: Path = ENGINE) -> list[list[tuple[Hyp, int]]]:
    """Each case's searches through `engine` (a copy with a planted bug, or the page's own): (hypothesis, steps)."""
    job, out = folder / "job.json", folder / "out.json"
    job.write_text(json.dumps({"bundle": None, "cases": cases}))
    done = subprocess.run([NODE, str(RUNNER), str(engine), str(job), str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [[(Hyp(tuple(r["tokens"]), r["score"], r["normalized"], r["finished"]), r["steps"]) for r in results]
            for results in json.loads(out.read_text())["results"]]


JS_SEARCHES = [{"beam": k, "alpha": a, "maxLen": n} for k in (1, 2, 3, 4) for a in (0.0, 0.6, 1.0, 2.0)
               for n in (1, 5)]           # beam 1: the page's greedy (one candidate)
JS_SEEDS = range(9)


def js_reference(table, s: dict) -> tuple[list[Hyp], int]:
    return reference(table, s["beam"], s["alpha"], s["maxLen"], greedy=s["beam"] == 1)


needs_node = pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")


@needs_node
def test_the_pages_search_equals_the_reference(tmp_path):
    """Every rule's table, and random tables on nine seeds (K 1..4, alpha 0..2, limits 1 and 5), one Node run."""
    designs = [(d.table, [{"beam": d.beam, "alpha": d.alpha, "maxLen": d.limit}]) for d in DESIGNS.values()]
    assert js_differs(tmp_path, designs + [(random_table(seed), JS_SEARCHES) for seed in JS_SEEDS]) == []


def js_differs(folder: Path, cases: list[tuple], engine: Path = ENGINE) -> list[tuple]:
    """Run (table, searches) cases in one Node run: [(search, how it differs from the reference)]."""
    out = run_js(folder, [scripted_case(table, searches) for table, searches in cases], engine)
    differ = []
    for (table, searches), results in zip(cases, out, strict=True):
        for s, (hyp, steps) in zip(searches, results, strict=True):
            want, want_steps = js_reference(table, s)
            if disagreement([hyp], want) is not None or steps != want_steps:
                differ.append((s, disagreement([hyp], want) or f"steps {steps} != {want_steps}"))
    return differ


# ---- planted bugs turn the comparisons red --------------------------------------------------------------------------

PLANTS = {                # rule -> (file, code, bug) in search.py / candidates.py, and in search.js
    "only the top K finish": (
        [("search.py", "ended = ends & valid & (rank < K) & live[:, None]", "ended = ends & valid & live[:, None]")],
        [("if (ends && rank < beam) {", "if (ends) {")]),
    "length normalisation": (
        [("search.py", "return score / (length ** alpha)", "return score")],
        [("normalized: lengthNormalized(c.value, length, alpha)", "normalized: c.value")]),
    "the bound stops early": (
        [("search.py", "done = live & (at_limit | ~kept.any(dim=1) | (bound <= worst))",
          "done = live & (at_limit | ~kept.any(dim=1))"),
         ("search.py", "done = advance.done | (slots.live & (advance.bound <= worst))", "done = advance.done")],
        [("(beam > 1 && bound <= worst)", "false")]),
    "the bound reaches the limit": (
        [("search.py", "return torch.maximum(scores / nearest ** alpha, scores / limits.double() ** alpha)",
          "return scores / nearest ** alpha")],
        [("bound = Math.max(bound, c.value / nearest ** alpha, c.value / limit ** alpha);",
          "bound = Math.max(bound, c.value / nearest ** alpha);")]),
    "PAD keeps its probability": (   # the bug: the other tokens share PAD's (a log-softmax without PAD)
        [("candidates.py", "_log_normalizer(x, x.amax(dim=-1, keepdim=True))",
          "_log_normalizer(allowed, allowed.amax(dim=-1, keepdim=True))"),
         ("candidates.py", "_log_normalizer(x, top)", "_log_normalizer(allowed, top)")],
        [("for (let i = 0; i < logits.length; i++) total += Math.exp(logits[i] - top);",
          "for (let i = 0; i < logits.length; i++) if (i !== padId) total += Math.exp(logits[i] - top);")]),
}
PLANT_TABLE = {rule: DESIGNS.get(rule, Design(rank_table, 2, 1.0, 6)) for rule in PLANTS}   # PAD: rank's has PAD


def planted(text: str, changes: list[tuple[str, str]]) -> str:
    for old, new in changes:
        assert text.count(old) == 1, old                                    # the code the bug goes into is there
        text = text.replace(old, new)
    return text


def planted_search(changes: list[tuple[str, str, str]], monkeypatch) -> types.ModuleType:
    """A copy of decoding/search.py (its candidates.py functions from a copy too) with `changes` made."""
    modules = {}
    for name, original in (("candidates", candidates_module), ("search", search_module)):
        path = Path(original.__file__)
        module = types.ModuleType(f"glassformer.decoding._planted_{name}")
        module.__package__, module.__file__ = "glassformer.decoding", str(path)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        text = planted(path.read_text(), [(old, new) for file, old, new in changes if file == f"{name}.py"])
        exec(compile(text, str(path), "exec"), module.__dict__)
        modules[name] = module
    modules["search"].best_continuations = modules["candidates"].best_continuations
    modules["search"].most_probable = modules["candidates"].most_probable
    return modules["search"]


@pytest.mark.parametrize("rule", sorted(PLANTS))
def test_a_planted_bug_in_search_py_turns_its_table_and_the_random_tables_red(rule, monkeypatch):
    design = PLANT_TABLE[rule]
    want, steps = reference(*design)
    assert disagreement(python_search(*design, module=planted_search([], monkeypatch))[0], want) is None   # a
    buggy = planted_search(PLANTS[rule][0], monkeypatch)                                   # faithful copy, then
    got, got_steps = python_search(*design, module=buggy)                                  # the bug
    assert disagreement(got, want) is not None or got_steps != steps
    assert any(python_differs(seed, buggy) for seed in RANDOM_SEEDS)


@needs_node
@pytest.mark.parametrize("rule", sorted(PLANTS))
def test_a_planted_bug_in_search_js_turns_its_table_and_the_random_tables_red(rule, tmp_path):
    design = PLANT_TABLE[rule]
    engine = tmp_path / "engine"
    shutil.copytree(ENGINE, engine)
    (engine / "search.js").write_text(planted((engine / "search.js").read_text(), PLANTS[rule][1]))
    own = [(design.table, [{"beam": design.beam, "alpha": design.alpha, "maxLen": design.limit}])]
    assert js_differs(tmp_path, own, engine)
    assert js_differs(tmp_path, [(random_table(seed), JS_SEARCHES) for seed in JS_SEEDS], engine)
