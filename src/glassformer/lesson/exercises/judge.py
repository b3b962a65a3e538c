"""The checker of a student's code: run their function on the task's probes, apart, and name the mistake.

1. The function runs in its own confined process (sandbox.py) on every probe of the seed; a hang is a
   `timeout`, a dead process `crashed`, an exception in their code `error` with the lines of their file.
2. Its outputs are compared with the lesson's on every probe (tasks.compute with the library's default
   switches, the computation `exercise check` uses). Equal within the tolerance of the dtype returned
   everywhere: `right`.
3. Otherwise every bug of the library that applies to the task — one reading of its switches, then two
   bugs at once — is computed on the same probes; those whose outputs the function's match on every
   probe are named (a bug whose computation cannot run on a probe's shapes, K Qᵀ with n ≠ m, matches a
   function that fails on that probe's shapes too). Verdict `wrong`.
4. No bug matches: a returned shape that is not the lesson's is named as a shape error (`shape_error`,
   the arrays' shapes, a guess at the cause); else `wrong` with the smallest failing probe printed.
The lesson's properties (permutation equivariance without positions, a future token or a padded row
changing nothing, LayerNorm's rows independent) are checked on the function's own outputs in any case.
"""

from __future__ import annotations

import numpy as np

from ... import limits
from ...errors import UsageError
from . import sandbox
from .bugs import BY_ID
from .compare import Outcome, agrees, close, outcome_of, prepared, shaped, status_of, variant_outputs
from .files import check_python, read_source, task_of
from .report import WORDS, CodeReport, arg_names, call_text, plain, shape_text, size_text
from .tasks import Probe, Task

VERDICTS = ("right", "wrong", "error", "timeout", "crashed")


# ---- judging --------------------------------------------------------------------------------------------


def judge(task: Task, seed: int, run: sandbox.Run, offset: int = 0, lang: str = "zh",
          file: str | None = None) -> CodeReport:
    """The report for one seed from the run its probes were part of (its calls from `offset` on)."""
    w = WORDS[lang]
    found, props, right = prepared(task.name, seed)
    calls = run.calls[offset:offset + len(found)]
    outcomes = [outcome_of(c) for c in calls]
    report = CodeReport(task.name, seed, "right", [], "", lang, file, contained=run.contained,
                        output={"stdout": run.stdout, "stderr": run.stderr, "stdout_bytes": run.stdout_bytes,
                                "stderr_bytes": run.stderr_bytes})
    statuses = [status_of(o, r) for o, r in zip(outcomes, right, strict=True)]
    report.probes = [{"index": i + 1, "call": call_text(task, p), "shows": list(p.shows), "result": s}
                     for i, (p, s) in enumerate(zip(found, statuses, strict=True))]

    def fail(verdict: str, message: str) -> CodeReport:
        report.verdict, report.message = verdict, message
        return report

    if run.load_error is not None:
        report.error = run.load_error
        e = run.load_error
        if e.get("type") == "MemoryError":
            report.stopped = {"cause": "memory", "probe": None}
            return fail("crashed", w["stop_memory"].format(size=size_text(limits.MAX_CODE_MEMORY_BYTES), probe="—",
                                                           message=e.get("message", "")))
        key = "load_exit" if e.get("type") == "SystemExit" else "load_error"
        return fail("error", w[key].format(type=e.get("type"), message=e.get("message", "")))
    if run.missing:
        return fail("error", w["missing"].format(function=task.function))
    if "not run" in statuses and run.stop is not None:
        return _stopped(report, task, found, run, offset, w)

    report.properties = _properties(props, outcomes, right, w)
    report.notes = _notes(task, outcomes, w)
    if "memory" in statuses:
        i = statuses.index("memory")
        report.error = outcomes[i].error
        report.stopped = {"cause": "memory", "probe": i + 1}
        return fail("crashed", w["stop_memory"].format(size=size_text(limits.MAX_CODE_MEMORY_BYTES), probe=i + 1,
                                                       message=outcomes[i].error.get("message", "")))
    if all(s == "right" for s in statuses):
        return fail("right", w["all_right"].format(n=len(found)))

    matched = _match(task, seed, outcomes, right)
    smallest = sorted(range(len(found)), key=lambda i: (found[i].numbers(), i))
    if matched:
        report.bugs = [m.split("@")[0] for m in matched]
        report.where = {m.split("@")[0]: m.split("@")[1] for m in matched if "@" in m}
        for entry in report.probes:
            if entry["result"] != "right":
                entry["as"] = list(report.bugs)
        first = next(i for i in smallest if statuses[i] != "right")
        report.failing = _failing(task, found[first], right[first], outcomes[first], first)
        text = _bug_text(matched, w, lang)
        shaped_off = [i for i in smallest if statuses[i] == "shape" or (statuses[i] == "error"
                                                                         and outcomes[i].shape_like)]
        if shaped_off:                       # a shape error the bug explains is still a shape error
            i = shaped_off[0]
            report.shape_error = True
            if statuses[i] == "shape":
                report.shape = _shape_detail(task, outcomes[i], right[i], i)
                text += "\n" + _shape_message(task, outcomes[i], right[i], w, found[i])
            else:
                e = outcomes[i].error
                text += "\n" + w["raised_shape"].format(type=e.get("type"), message=e.get("message", ""), probe=i + 1)
        return fail("wrong", text)
    raised = [i for i in smallest if statuses[i] == "error"]
    if raised:
        i = raised[0]
        o = outcomes[i]
        report.error, report.shape_error = o.error, o.shape_like
        report.failing = _failing(task, found[i], right[i], o, i)
        if o.error.get("type") == "SystemExit":
            return fail("error", w["sys_exit"].format(message=o.error.get("message"), probe=i + 1))
        key = "raised_shape" if o.shape_like else "raised"
        return fail("error", w[key].format(type=o.error.get("type"), message=o.error.get("message", ""), probe=i + 1))
    shaped = [i for i in smallest if statuses[i] == "shape"]
    if shaped:
        i = shaped[0]
        report.shape_error = True
        report.shape = _shape_detail(task, outcomes[i], right[i], i)
        report.failing = _failing(task, found[i], right[i], outcomes[i], i)
        return fail("wrong", _shape_message(task, outcomes[i], right[i], w, found[i]))
    i = next(i for i in smallest if statuses[i] == "wrong")
    report.failing = _failing(task, found[i], right[i], outcomes[i], i)
    return fail("wrong", w["no_known"])


def _match(task: Task, seed: int, outcomes: list[Outcome], right: list[tuple]) -> tuple[str, ...]:
    """The bug ids whose computation the function follows on every probe: one bug, else a pair of two."""
    for size in (1, 2):                                      # the pairs are computed only when no bug alone fits
        found = [ids for ids, outs in variant_outputs(task.name, seed, (size,))
                 if all(agrees(o, e, r) for o, e, r in zip(outcomes, outs, right, strict=True))]
        if found:
            return tuple(dict.fromkeys(i for ids in found[:1 if size == 2 else None] for i in ids))
    return ()


def _bug_text(ids: tuple[str, ...], w: dict, lang: str) -> str:
    lines = [w["bug"] if len(ids) == 1 else w["pair"]]
    for named in ids:
        bug_id, _, site = named.partition("@")
        bug = BY_ID[bug_id]
        where = f" [{w['only_in'].format(site=w['sites'][site])}]" if site else ""
        lines.append(f"{bug_id}{where}: {getattr(bug, lang)} ({w['claim']} {bug.claim})")
        if bug.source:
            lines.append(f"    {w['source']}: {bug.source}")
    return "\n".join(lines)


def _properties(props, outcomes: list[Outcome], right: list[tuple], w: dict) -> list[dict]:
    out = []
    for prop in props:
        base, changed = outcomes[prop.base], outcomes[prop.changed]
        held = None
        if (shaped(base, right[prop.base]) and shaped(changed, right[prop.changed])
                and all(a is not None for a in base.arrays + changed.arrays)):
            with np.errstate(all="ignore"):
                want, got = prop.expect(tuple(base.arrays)), prop.view(tuple(changed.arrays))
            held = all(close(g, e, d) for g, e, d in zip(got, want, changed.dtypes, strict=True))
        out.append({"name": prop.name, "what": w[prop.name], "probes": [prop.base + 1, prop.changed + 1],
                    "held": held})
    return out


def _notes(task: Task, outcomes: list[Outcome], w: dict) -> list[str]:
    notes: list[str] = []
    for o in outcomes:
        if o.kind != "arrays":
            continue
        for name, dtype, a in zip(task.returns, o.dtypes, o.arrays, strict=False):
            if task.name == "causal-mask" and dtype != "bool" and a is not None:
                finite = a[np.isfinite(a)]
                if np.isin(a, (0.0, -np.inf)).all() and not np.isfinite(a).all():
                    note = w["additive"]
                elif np.isin(finite, (0.0, 1.0)).all():
                    note = w["mask_numbers"].format(dtype=dtype)
                else:
                    continue
            elif task.name != "causal-mask" and dtype.startswith(("int", "uint", "bool")):
                note = w["int_dtype"].format(name=name, dtype=dtype)
            else:
                continue
            if note not in notes:
                notes.append(note)
    if w["additive"] in notes:                   # its one-row probe (a single 0) read as 0/1 is no news
        notes = [n for n in notes if not n.startswith(w["mask_numbers"].split("{")[0])]
    return notes


def _shape_detail(task: Task, outcome: Outcome, expected: tuple, i: int) -> dict:
    detail = {"probe": i + 1, "expected": [list(e.shape) for e in expected]}
    if outcome.kind == "arrays":
        detail["got"] = [list(s) for s in outcome.shapes]
        bad = next((k for k, (s, e) in enumerate(zip(outcome.shapes, expected, strict=False))
                    if tuple(s) != tuple(e.shape)), None)
        if bad is not None:
            detail["output"] = task.returns[bad]
    else:
        detail["got"] = None
        detail["returned"] = outcome.other
    return detail


def _shape_message(task: Task, outcome: Outcome, expected: tuple, w: dict, probe: Probe) -> str:
    if outcome.kind != "arrays" or len(outcome.shapes) != len(expected):
        what = outcome.other if outcome.kind != "arrays" else f"{len(outcome.shapes)} arrays"
        want = (w["want_pair"].format(n=len(expected), names=", ".join(task.returns)) if len(expected) > 1
                else w["want_one"])
        text = w["other_got"].format(what=what, want=want)
        return f"{text}: {w['missing_return']}" if what == "None" else text
    k = next(k for k, (s, e) in enumerate(zip(outcome.shapes, expected, strict=True)) if tuple(s) != tuple(e.shape))
    got, want = tuple(outcome.shapes[k]), tuple(expected[k].shape)
    name = w["output"].format(name=task.returns[k]) if len(task.returns) > 1 else w["result_"]
    text = w["shape_got"].format(name=name, got=shape_text(got), expected=shape_text(want))
    hint = ""
    if got == want[::-1] and got != want:
        hint = w["scores_transposed"] if task.name == "attention" and task.returns[k] == "weights" else w["transposed"]
    elif task.name == "multi-head" and len(got) == 2 and got[0] == want[0]:
        heads = probe.args[1]["heads"]
        if got[1] == len(heads) * heads[0]["w_v"].shape[1]:
            hint = w["no_w_o"]
    return f"{text}: {hint}" if hint else text


def _failing(task: Task, probe: Probe, expected: tuple, outcome: Outcome, i: int) -> dict:
    names = arg_names(task)
    inputs = {name: plain(v) for name, v in zip(names, probe.args, strict=False)}
    inputs.update({k: v for k, v in probe.kwargs.items()})
    got = None
    if outcome.kind == "arrays":
        got = {name: (plain(a) if a is not None else None) for name, a in zip(task.returns, outcome.arrays,
                                                                                strict=False)}
    return {"probe": i + 1, "call": call_text(task, probe), "inputs": inputs,
            "expected": {name: plain(np.asarray(e, dtype=np.float64) if e.dtype != bool else e)
                         for name, e in zip(task.returns, expected, strict=True)},
            "got": got}


def _stopped(report: CodeReport, task: Task, found: list[Probe], run: sandbox.Run, offset: int,
             w: dict) -> CodeReport:
    """A timeout or a crash: which limit, during which probe (None: while the file was loaded, or during
    another seed's probe)."""
    probe = None
    if run.stop_call is not None and offset <= run.stop_call < offset + len(found):
        probe = run.stop_call - offset
    call = call_text(task, found[probe]) if probe is not None else ""
    during = (w["during_call"].format(probe=probe + 1, call=call) if probe is not None
              else w["during_calls"] if run.loaded else w["during_load"])
    report.stopped = {"cause": run.cause, "probe": None if probe is None else probe + 1}
    cause = run.cause
    if run.stop == "timeout":
        report.verdict = "timeout"
        if cause == "load":
            report.message = w["stop_load"].format(s=limits.MAX_CODE_LOAD_SECONDS)
        elif cause == "call":
            report.message = w["stop_call"].format(probe=probe + 1 if probe is not None else "?", call=call,
                                                   s=limits.MAX_CODE_CALL_SECONDS)
        elif cause == "cpu":
            report.message = w["stop_cpu"].format(s=limits.MAX_CODE_CPU_SECONDS)
        else:
            report.message = w["stop_total"].format(s=limits.MAX_CODE_TOTAL_SECONDS)
        return report
    report.verdict = "crashed"
    if cause.startswith("signal:"):
        name = cause.split(":", 1)[1]
        why = w.get(name, "").format(size=size_text(limits.MAX_CODE_WRITE_BYTES))
        report.message = w["stop_signal"].format(signal=name, why=why, during=during)
    elif cause == "answer":
        report.message = w["stop_answer"].format(size=size_text(limits.MAX_CODE_ANSWER_BYTES))
    elif cause == "garbled":
        report.message = w["stop_garbled"].format(during=during)
    else:
        report.message = w["stop_exit"].format(code=cause.split(":", 1)[-1], during=during)
    return report


# ---- running ---------------------------------------------------------------------------------------------


def _job_value(value):
    if isinstance(value, np.ndarray):
        return {"__array__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {k: _job_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_job_value(v) for v in value]
    return value


def _calls(task: Task, seeds: list[int]) -> tuple[list[dict], list[int]]:
    calls, counts = [], []
    for seed in seeds:
        found, _, _ = prepared(task.name, seed)
        calls += [{"args": _job_value(list(p.args)), "kwargs": _job_value(p.kwargs)} for p in found]
        counts.append(len(found))
    return calls, counts


def _seeds(seeds) -> list[int]:
    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    if not seeds:
        raise UsageError("seeds: expected at least one seed")
    limits.check("seeds", len(seeds), "MAX_CODE_SEEDS", "seeds")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= 2**32 - 1:
            raise UsageError(f"seed: expected an integer 0..{2**32 - 1}, got {s!r}", "seed")
    return seeds


def _inputs(inputs: str) -> str:
    if inputs not in ("numpy", "torch"):
        raise UsageError(f"inputs: expected numpy or torch, got {inputs!r}", "inputs")
    return inputs


def _lang(lang: str) -> str:
    if lang not in WORDS:
        raise UsageError(f"lang: expected zh or en, got {lang!r}", "lang")
    return lang


def _reports(task: Task, seeds: list[int], run: sandbox.Run, counts: list[int], lang: str,
             file: str | None) -> list[CodeReport]:
    out, at = [], 0
    for seed, n in zip(seeds, counts, strict=True):
        out.append(judge(task, seed, run, at, lang, file))
        at += n
    return out


def check_source(source: str, task: str, seed: int | list[int] = 0, *, filename: str = "answer.py",
                 lang: str = "zh", inputs: str = "numpy") -> CodeReport | list[CodeReport]:
    """Check the Python source of a student's answer for `task`; a list of seeds gives a list of reports
    (every seed's probes run in the one process)."""
    t, seeds, lang = task_of(task), _seeds(seed), _lang(lang)
    check_python(source, filename, t)
    calls, counts = _calls(t, seeds)
    run = sandbox.run_source(source, filename, t.function, calls, len(t.returns), _inputs(inputs))
    reports = _reports(t, seeds, run, counts, lang, filename)
    return reports[0] if isinstance(seed, int) else reports


def check_code(path: str, task: str, seed: int | list[int] = 0, *, lang: str = "zh",
               inputs: str = "numpy") -> CodeReport | list[CodeReport]:
    """Check the student's file `path` for `task` (what `glassformer exercise check-code` runs)."""
    t = task_of(task)
    return check_source(read_source(path, t), task, seed, filename=path, lang=lang, inputs=inputs)


def check_function(fn, task: str, seed: int | list[int] = 0, *, lang: str = "zh",
                   inputs: str = "numpy") -> CodeReport | list[CodeReport]:
    """Check a function defined in a notebook (or anywhere) for `task`: it runs in a forked copy of this
    process, confined and watched as `check-code` runs a file, and the report shows as a table in Jupyter."""
    t, seeds, lang = task_of(task), _seeds(seed), _lang(lang)
    if not callable(fn):
        raise UsageError(f"check_function: expected a function, got {type(fn).__name__}")
    calls, counts = _calls(t, seeds)
    run = sandbox.run_function(fn, calls, len(t.returns), _inputs(inputs))
    reports = _reports(t, seeds, run, counts, lang, getattr(fn, "__name__", None))
    return reports[0] if isinstance(seed, int) else reports
