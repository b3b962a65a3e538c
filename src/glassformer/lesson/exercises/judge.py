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

import ast
import html
import math
import re
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

import numpy as np

from ... import limits
from ...errors import UsageError
from . import sandbox
from .bugs import BY_ID, RIGHT, Switches
from .files import read_regular
from .tasks import TASKS, Probe, Task, compute, probes

SHAPE = "shape"          # what a bug's computation gives on a probe whose shapes it cannot take (K Qᵀ, n ≠ m)
VERDICTS = ("right", "wrong", "error", "timeout", "crashed")


# ---- reading a file --------------------------------------------------------------------------------


def task_of(name: str) -> Task:
    if name not in TASKS:
        raise UsageError(f"--task: unknown task {name!r} (one of: {', '.join(TASKS)})", "task")
    return TASKS[name]


def read_source(path: str, task: Task) -> str:
    """A student's file as text, refused in one line when it cannot be their answer: not a regular file,
    over MAX_CODE_FILE_BYTES, not UTF-8, not Python (the line of the syntax error), or without the function."""
    raw = read_regular(path, "MAX_CODE_FILE_BYTES", "code")
    try:
        source = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not Python: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
                         f"{error.start})") from None
    check_python(source, path, task)
    return source


def check_python(source: str, where: str, task: Task) -> None:
    """Compile (nothing runs) and find the task's function at the top level; else one UsageError line."""
    try:
        tree = ast.parse(source, where)
        compile(tree, where, "exec", dont_inherit=True)
    except SyntaxError as error:
        raise UsageError(f"{where}: not Python: line {error.lineno}: {error.msg}") from None
    except (ValueError, RecursionError, MemoryError) as error:
        reason = "it holds a NUL byte" if isinstance(error, ValueError) else "it is nested too deeply"
        raise UsageError(f"{where}: not Python: {reason}") from None
    if task.function not in _top_level_names(tree):
        raise UsageError(f"{where}: no function {task.function}() at the top level (task {task.name} asks for "
                         f"def {task.function}({task.signature}))")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            names |= _top_level_names(ast.Module(body=list(ast.iter_child_nodes(node)), type_ignores=[]))
    return names


# ---- probes, the lesson's outputs and every bug's, per seed ----------------------------------------


def _merge(a: Switches, b: Switches) -> Switches | None:
    """Both bugs' switches at once; None when they set the same switch two ways."""
    changes = {}
    for f in fields(Switches):
        va, vb, right = getattr(a, f.name), getattr(b, f.name), getattr(RIGHT, f.name)
        if va != right and vb != right and va != vb:
            return None
        if va != right or vb != right:
            changes[f.name] = va if va != right else vb
    return replace(RIGHT, **changes)


def variants(task: Task) -> list[tuple[tuple[str, ...], Switches]]:
    """(bug ids, switches): each reading of each bug of the task, then each pair of two bugs' readings
    (pairs that set one switch two ways, or that give a single bug's switches, are left out)."""
    order = {b: i for i, b in enumerate(BY_ID)}
    readings = [(bug_id, sw) for bug_id in sorted(task.bugs, key=order.get) for sw in BY_ID[bug_id].readings]
    singles = [((bug_id,), sw) for bug_id, sw in readings]
    seen = {sw for _, sw in singles}
    pairs = []
    for i, (a, sa) in enumerate(readings):
        for b, sb in readings[i + 1:]:
            merged = _merge(sa, sb) if a != b else None
            if merged is not None and merged not in seen:
                seen.add(merged)
                pairs.append(((a, b), merged))
    return singles + pairs


def _outputs(task: Task, probe: Probe, sw: Switches):
    with np.errstate(all="ignore"):
        try:
            return compute(task, probe.inputs, sw)
        except (ValueError, IndexError):
            return SHAPE


@lru_cache(maxsize=256)
def prepared(task_name: str, seed: int):
    """The probes and properties of (task, seed) and the lesson's outputs on each probe."""
    task = TASKS[task_name]
    found, props = probes(task, seed)
    return found, props, [compute(task, p.inputs) for p in found]


@lru_cache(maxsize=256)
def variant_outputs(task_name: str, seed: int) -> list[tuple[tuple[str, ...], list]]:
    """Every variant's outputs on every probe of (task, seed): [(bug ids, [outputs or SHAPE per probe])]."""
    task = TASKS[task_name]
    found, _, _ = prepared(task_name, seed)
    return [(ids, [_outputs(task, p, sw) for p in found]) for ids, sw in variants(task)]


# ---- what a call gave --------------------------------------------------------------------------------

_SHAPE_WORDS = re.compile(r"shape|broadcast|dimension|align|mismatch|size of tensor|out of bounds|must match|"
                          r"cannot be multiplied|index \d+ is out", re.IGNORECASE)


@dataclass
class Outcome:
    kind: str                                  # arrays | other | raised | not run
    arrays: list[np.ndarray | None] = field(default_factory=list)   # float64 values (None: too many to read)
    shapes: list[tuple] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    other: str = ""
    error: dict | None = None

    @property
    def shape_like(self) -> bool:
        """An exception that is a shape mismatch (numpy's broadcasting or matmul, torch's sizes, an index)."""
        e = self.error or {}
        return e.get("type") in ("ValueError", "IndexError", "RuntimeError") and bool(
            _SHAPE_WORDS.search(e.get("message", "")))


def outcome_of(call: sandbox.Call | None) -> Outcome:
    if call is None:
        return Outcome("not run")
    if call.status == "raised":
        return Outcome("raised", error=call.error or {})
    result = call.result or {}
    if "arrays" not in result:
        return Outcome("other", other=str(result.get("other", "?")))
    out = Outcome("arrays")
    for entry in result["arrays"]:
        shape = tuple(int(n) for n in entry.get("shape", ()))
        values = entry.get("values")
        a = None
        if values is not None:
            a = np.asarray(values, dtype=np.float64)
            if a.shape != shape:
                a = None
        out.arrays.append(a)
        out.shapes.append(shape)
        out.dtypes.append(str(entry.get("dtype", "")))
    return out


def _tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for arrays of this dtype: float64 nearly exact, float32 and halves what they can hold."""
    if "16" in dtype:
        return 2e-2, 2e-2
    if "32" in dtype:
        return 1e-4, 1e-5
    if dtype.startswith(("int", "uint", "bool")):
        return 0.0, 1e-9
    return 1e-6, 1e-9


def _close(got: np.ndarray, expected: np.ndarray, dtype: str) -> bool:
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return False
    nan_got, nan_expected = np.isnan(got), np.isnan(expected)
    if (nan_got != nan_expected).any():
        return False
    rtol, atol = _tolerance(dtype)
    g, e = got[~nan_got], expected[~nan_expected]
    with np.errstate(invalid="ignore"):
        return bool(np.all((g == e) | (np.abs(g - e) <= atol + rtol * np.abs(e))))


def _shaped(outcome: Outcome, expected: tuple) -> bool:
    """The call returned the task's arrays with the lesson's shapes."""
    return outcome.kind == "arrays" and outcome.shapes == [tuple(e.shape) for e in expected]


def _status(outcome: Outcome, expected: tuple) -> str:
    """right | wrong | shape | error | memory | not run — a call against the lesson's outputs."""
    if outcome.kind == "raised":
        return "memory" if outcome.error.get("type") == "MemoryError" else "error"
    if outcome.kind == "not run":
        return "not run"
    if not _shaped(outcome, expected):
        return "shape"
    if any(a is None for a in outcome.arrays):
        return "wrong"
    ok = all(_close(a, e, d) for a, e, d in zip(outcome.arrays, expected, outcome.dtypes, strict=True))
    return "right" if ok else "wrong"


def _agrees(outcome: Outcome, expected, right: tuple) -> bool:
    """The call gave what a variant gives: its arrays, or a shape failure where the variant has one."""
    if isinstance(expected, str):                                         # SHAPE
        return (outcome.kind == "raised" and outcome.shape_like) or outcome.kind == "other" or (
            outcome.kind == "arrays" and not _shaped(outcome, right))
    if outcome.kind != "arrays" or len(outcome.arrays) != len(expected):
        return False
    return all(a is not None and _close(a, e, d)
               for a, e, d in zip(outcome.arrays, expected, outcome.dtypes, strict=True))


# ---- the report ----------------------------------------------------------------------------------------


@dataclass
class CodeReport:
    """The verdict on a student's function for one task and seed: `verdict`, `bugs` (library ids), a
    one-paragraph `message`, one entry per probe, the properties, and the details the verdict rests on."""

    task: str
    seed: int
    verdict: str
    bugs: list[str]
    message: str
    lang: str = "zh"
    file: str | None = None
    probes: list[dict] = field(default_factory=list)
    properties: list[dict] = field(default_factory=list)
    shape_error: bool = False
    shape: dict | None = None
    failing: dict | None = None
    error: dict | None = None
    stopped: dict | None = None
    notes: list[str] = field(default_factory=list)
    output: dict = field(default_factory=dict)
    contained: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"task": self.task, "seed": self.seed, "verdict": self.verdict, "bugs": self.bugs,
                "message": self.message, "shape_error": self.shape_error, "shape": self.shape,
                "probes": self.probes, "properties": self.properties, "failing": self.failing,
                "error": self.error, "stopped": self.stopped, "notes": self.notes, "output": self.output,
                "contained": self.contained, "file": self.file}

    def text(self) -> str:
        return report_text(self)

    def __str__(self) -> str:
        return report_text(self)

    def __repr__(self) -> str:
        return report_text(self)

    def _repr_html_(self) -> str:
        return report_html(self)


# ---- words --------------------------------------------------------------------------------------------

WORDS = {
    "en": {
        "right": "right", "wrong": "wrong", "error": "error", "timeout": "timeout", "crashed": "crashed",
        "shape": "shape", "memory": "memory", "not run": "not run",
        "title": "{file}task {task}, seed {seed}: {verdict}",
        "all_right": "Right on all {n} probes.",
        "bug": "The function computes what this mistake computes, on every probe:",
        "pair": "The function computes what these two mistakes together compute, on every probe:",
        "no_known": "Wrong, and no mistake of the library explains it; the smallest failing probe is below.",
        "claim": "lesson claim", "source": "seen in public code",
        "shape_got": "output {name}: shape {got} where {expected} was expected",
        "other_got": "returned {what} where {want} was expected (a shape error)",
        "want_pair": "{n} arrays ({names})", "want_one": "one array",
        "missing_return": "a missing return?",
        "transposed": "transposed?", "scores_transposed": "scores transposed (K Qᵀ in place of Q Kᵀ)?",
        "no_w_o": "the concat of the heads without W^O?",
        "raised": "{type} in your code on probe {probe}: {message}",
        "raised_shape": "{type} in your code on probe {probe} (a shape mismatch): {message}",
        "sys_exit": "your code called {message} on probe {probe}",
        "load_error": "{type} while running your file: {message}",
        "load_exit": "your file called {message} while it was loaded",
        "missing": "your file ran but defines no function {function}()",
        "stop_load": "loading your file ran past {s} s (MAX_CODE_LOAD_SECONDS): an endless loop at the top level?",
        "stop_call": "probe {probe}, {call}, ran past {s} s (MAX_CODE_CALL_SECONDS): an endless loop?",
        "stop_total": "the whole run took more than {s} s (MAX_CODE_TOTAL_SECONDS)",
        "stop_cpu": "the process used more than {s} s of CPU time (MAX_CODE_CPU_SECONDS)",
        "stop_memory": "over the memory limit ({size}, MAX_CODE_MEMORY_BYTES) on probe {probe}: {message}",
        "stop_signal": "the process was killed by {signal}{why} {during}",
        "stop_exit": "the process ended (exit status {code}) {during} without answering: os._exit, or a library "
                     "that ends the process?",
        "stop_answer": "the function returned more than {size} in all (MAX_CODE_ANSWER_BYTES)",
        "stop_garbled": "something wrote into the checker's pipe and garbled the answers {during}",
        "during_call": "during probe {probe} ({call})", "during_load": "while your file was loaded",
        "SIGSEGV": " (a segmentation fault)", "SIGKILL": " (the memory limit, or the system)",
        "SIGXFSZ": " (a file over {size}, MAX_CODE_WRITE_BYTES)", "SIGABRT": " (aborted)",
        "probe": "probe", "call": "call", "result": "result", "as": "as {bugs}",
        "properties": "properties of the lesson",
        "held": "held", "broken": "broken", "unchecked": "not checked (a call failed)",
        "permutation": "permutation equivariance: permuted inputs give the same outputs, permuted",
        "future": "a future token changes nothing before it (causal mask)",
        "padding": "padding changes no real output",
        "rows": "LayerNorm's rows are independent: changing one row changes no other",
        "memory-order": "the order of the memory rows changes nothing (cross-attention has no positions)",
        "failing": "smallest failing probe", "inputs": "inputs", "expected": "expected", "got": "got",
        "your_lines": "in your code", "printed": "printed {n} bytes on {stream}",
        "mask_numbers": "the mask's dtype is {dtype}, not bool: 1 was read as True, 0 as False",
        "additive": "an additive mask (0 where visible, −∞ where hidden): this task returns booleans, "
                    "True = may attend",
        "int_dtype": "output {name} has dtype {dtype}: the lesson's outputs are floats",
    },
    "zh": {
        "right": "对", "wrong": "错", "error": "出错", "timeout": "超时", "crashed": "崩溃",
        "shape": "形状", "memory": "内存", "not run": "未运行",
        "title": "{file}任务 {task}，种子 {seed}：{verdict}",
        "all_right": "全部 {n} 个探针都对。",
        "bug": "在每个探针上，函数算出的都是这个错误会算出的数：",
        "pair": "在每个探针上，函数算出的都是这两个错误同时出现时的数：",
        "no_known": "错，错误库里没有哪个错误能解释；下面是出错的最小探针。",
        "claim": "课文论断", "source": "公开代码中的同类错误",
        "shape_got": "输出 {name} 的形状（shape）是 {got}，应为 {expected}",
        "other_got": "返回了 {what}，应返回 {want}（形状 shape 错误）",
        "want_pair": "{n} 个数组（{names}）", "want_one": "一个数组",
        "missing_return": "漏写了 return？",
        "transposed": "转置了？", "scores_transposed": "分数转置了（算成了 K Qᵀ 而不是 Q Kᵀ）？",
        "no_w_o": "各头拼接后没有乘 W^O？",
        "raised": "你的代码在探针 {probe} 上抛出 {type}：{message}",
        "raised_shape": "你的代码在探针 {probe} 上抛出 {type}（形状 shape 不匹配）：{message}",
        "sys_exit": "你的代码在探针 {probe} 上调用了 {message}",
        "load_error": "运行你的文件时抛出 {type}：{message}",
        "load_exit": "加载你的文件时调用了 {message}",
        "missing": "文件运行了，但没有定义函数 {function}()",
        "stop_load": "加载文件超过 {s} 秒（MAX_CODE_LOAD_SECONDS）：顶层有死循环？",
        "stop_call": "探针 {probe}（{call}）超过 {s} 秒（MAX_CODE_CALL_SECONDS）：死循环？",
        "stop_total": "整个运行超过 {s} 秒（MAX_CODE_TOTAL_SECONDS）",
        "stop_cpu": "进程用掉了超过 {s} 秒 CPU 时间（MAX_CODE_CPU_SECONDS）",
        "stop_memory": "在探针 {probe} 上超出内存上限（{size}，MAX_CODE_MEMORY_BYTES）：{message}",
        "stop_signal": "进程{during}被信号 {signal} 杀死{why}",
        "stop_exit": "进程{during}结束（退出码 {code}），没有给出结果：os._exit，或某个库结束了进程？",
        "stop_answer": "函数返回的数据合计超过 {size}（MAX_CODE_ANSWER_BYTES）",
        "stop_garbled": "有东西{during}写进了检查器的管道，结果无法读取",
        "during_call": "在探针 {probe}（{call}）上", "during_load": "在加载文件时",
        "SIGSEGV": "（段错误）", "SIGKILL": "（内存上限，或被系统杀死）",
        "SIGXFSZ": "（写的文件超过 {size}，MAX_CODE_WRITE_BYTES）", "SIGABRT": "（abort）",
        "probe": "探针", "call": "调用", "result": "结果", "as": "同 {bugs}",
        "properties": "课文中的性质",
        "held": "成立", "broken": "不成立", "unchecked": "未检查（有调用失败）",
        "permutation": "置换等变：输入换了顺序，输出同样换顺序，数值不变",
        "future": "因果 mask 下，后面的 token 改变不了前面的输出",
        "padding": "padding 改变不了真实位置的输出",
        "rows": "LayerNorm 各行独立：改一行不影响其他行",
        "memory-order": "memory 各行的顺序不影响输出（cross-attention 没有位置）",
        "failing": "出错的最小探针", "inputs": "输入", "expected": "应为", "got": "你的结果",
        "your_lines": "你的代码", "printed": "{stream} 上打印了 {n} 字节",
        "mask_numbers": "mask 的 dtype 是 {dtype} 而不是 bool：1 当作 True，0 当作 False",
        "additive": "这是加性 mask（可见处 0，遮住处 −∞）：本任务要返回布尔表，True = 可以看",
        "int_dtype": "输出 {name} 的 dtype 是 {dtype}：课文的输出是浮点数",
    },
}

SHOWS_ZH = {"padding": "padding", "empty row": "有一行看不到任何 key", "causal": "因果", "single row": "单行",
            "keys permuted": "key 换序", "queries permuted": "query 换序", "padding redrawn": "padding 重抽",
            "future key redrawn": "未来的 key 重抽", "rows permuted": "行换序", "future row redrawn": "未来的行重抽",
            "memory permuted": "memory 换序", "row 2 redrawn": "第 2 行重抽", "3 heads": "3 个头", "2 heads": "2 个头",
            "post-norm": "post-norm", "pre-norm": "pre-norm"}


def _size(n: int) -> str:
    return f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def arg_names(task: Task) -> list[str]:
    return [a.split("=")[0].strip() for a in task.signature.split(",")]


def call_text(task: Task, probe: Probe) -> str:
    """attention(q 3×2, k 4×2, v 4×3, mask 3×4) — the call, its arrays by shape."""
    parts = []
    for name, value in zip(arg_names(task), probe.args, strict=False):
        if isinstance(value, np.ndarray):
            parts.append(f"{name} {'×'.join(str(n) for n in value.shape)}")
        elif isinstance(value, dict):
            sa = value.get("self_attention", value)
            h = sa["heads"][0]
            parts.append(f"{name}: {len(sa['heads'])} heads, d_k {h['w_q'].shape[1]}, d_v {h['w_v'].shape[1]}"
                         + (f", d_ff {value['ffn']['w_1'].shape[1]}, eps {value['eps']:g}" if "ffn" in value else ""))
        else:
            parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    parts += [f'{k}="{v}"' for k, v in probe.kwargs.items()]
    return f"{task.function}({', '.join(parts)})"


def _shows(probe: Probe, lang: str) -> str:
    return ", ".join(SHOWS_ZH.get(s, s) if lang == "zh" else s for s in probe.shows)


def _plain(value):
    """JSON form of a probe's inputs or outputs: arrays as nested lists, NaN and ±inf as null."""
    if isinstance(value, np.ndarray):
        if value.dtype == bool:
            return value.tolist()
        return [_plain(v) for v in value] if value.ndim else _plain(float(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (np.floating, np.integer)):
        return _plain(value.item())
    return value


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
    statuses = [_status(o, r) for o, r in zip(outcomes, right, strict=True)]
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
            return fail("crashed", w["stop_memory"].format(size=_size(limits.MAX_CODE_MEMORY_BYTES), probe="—",
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
        return fail("crashed", w["stop_memory"].format(size=_size(limits.MAX_CODE_MEMORY_BYTES), probe=i + 1,
                                                       message=outcomes[i].error.get("message", "")))
    if all(s == "right" for s in statuses):
        return fail("right", w["all_right"].format(n=len(found)))

    matched = _match(task, seed, outcomes, right)
    smallest = sorted(range(len(found)), key=lambda i: (found[i].numbers(), i))
    if matched:
        report.bugs = list(matched)
        for entry in report.probes:
            if entry["result"] != "right":
                entry["result"] += " = " + "+".join(matched)
        first = next(i for i in smallest if statuses[i] != "right")
        report.failing = _failing(task, found[first], right[first], outcomes[first], first)
        return fail("wrong", _bug_text(matched, w, lang))
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
    found = [(ids, outs) for ids, outs in variant_outputs(task.name, seed)
             if all(_agrees(o, e, r) for o, e, r in zip(outcomes, outs, right, strict=True))]
    singles = [ids[0] for ids, _ in found if len(ids) == 1]
    if singles:
        return tuple(dict.fromkeys(singles))
    pairs = [ids for ids, _ in found]
    return pairs[0] if pairs else ()


def _bug_text(ids: tuple[str, ...], w: dict, lang: str) -> str:
    lines = [w["bug"] if len(ids) == 1 else w["pair"]]
    for bug_id in ids:
        bug = BY_ID[bug_id]
        lines.append(f"{bug_id}: {getattr(bug, lang)} ({w['claim']} {bug.claim})")
        if bug.source:
            lines.append(f"    {w['source']}: {bug.source}")
    return "\n".join(lines)


def _properties(props, outcomes: list[Outcome], right: list[tuple], w: dict) -> list[dict]:
    out = []
    for prop in props:
        base, changed = outcomes[prop.base], outcomes[prop.changed]
        held = None
        if (_shaped(base, right[prop.base]) and _shaped(changed, right[prop.changed])
                and all(a is not None for a in base.arrays + changed.arrays)):
            with np.errstate(all="ignore"):
                want, got = prop.expect(tuple(base.arrays)), prop.view(tuple(changed.arrays))
            held = all(_close(g, e, d) for g, e, d in zip(got, want, changed.dtypes, strict=True))
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
    text = w["shape_got"].format(name=task.returns[k], got=_shape_text(got), expected=_shape_text(want))
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
    inputs = {name: _plain(v) for name, v in zip(names, probe.args, strict=False)}
    inputs.update({k: v for k, v in probe.kwargs.items()})
    got = None
    if outcome.kind == "arrays":
        got = {name: (_plain(a) if a is not None else None) for name, a in zip(task.returns, outcome.arrays,
                                                                                strict=False)}
    return {"probe": i + 1, "call": call_text(task, probe), "inputs": inputs,
            "expected": {name: _plain(np.asarray(e, dtype=np.float64) if e.dtype != bool else e)
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
    during = w["during_call"].format(probe=probe + 1, call=call) if probe is not None else w["during_load"]
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
        why = w.get(name, "").format(size=_size(limits.MAX_CODE_WRITE_BYTES))
        report.message = w["stop_signal"].format(signal=name, why=why, during=during)
    elif cause == "answer":
        report.message = w["stop_answer"].format(size=_size(limits.MAX_CODE_ANSWER_BYTES))
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


# ---- rendering ----------------------------------------------------------------------------------------------


def _array_text(value) -> str:
    if value is None:
        return "—"
    a = np.asarray([[np.nan if v is None else v for v in row] for row in value] if value and isinstance(
        value[0], list) else [np.nan if v is None else v for v in value] if isinstance(value, list) else value)
    return np.array2string(a, precision=4, suppress_small=True, max_line_width=110)


def _inputs_text(value, name: str) -> list[str]:
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in _inputs_text(v, f"{name}[{k!r}]")]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [line for k, v in enumerate(value) for line in _inputs_text(v, f"{name}[{k}]")]
    if isinstance(value, list):
        text = _array_text(value)
        return [f"{name} ="] + ["    " + line for line in text.splitlines()] if "\n" in text else [f"{name} = {text}"]
    return [f"{name} = {value}"]


def report_text(r: CodeReport) -> str:
    w = WORDS[r.lang]
    file = f"{r.file} — " if r.file else ""
    lines = [w["title"].format(file=file, task=r.task, seed=r.seed, verdict=f"{w[r.verdict]} ({r.verdict})"), ""]
    lines += r.message.splitlines()
    if r.error and r.error.get("lines"):
        lines.append(f"  {w['your_lines']}:")
        for e in r.error["lines"]:
            lines.append(f"    {e['file']}, line {e['line']}, in {e['function']}: {e['text']}")
    lines += [f"  · {n}" for n in r.notes]
    if r.probes:
        lines += ["", f" #  {w['result']:<28} {w['call']}"]
        for p in r.probes:
            lines.append(f"{p['index']:>2}  {w.get(p['result'].split(' ')[0], p['result']) + _tail(p['result']):<28}"
                         f" {p['call']}")
    if r.properties:
        lines += ["", w["properties"] + ":"]
        for p in r.properties:
            mark = w["held"] if p["held"] else w["broken"] if p["held"] is False else w["unchecked"]
            lines.append(f"  {mark:<6} {p['what']} ({w['probe']} {p['probes'][0]} → {p['probes'][1]})")
    if r.failing and r.verdict != "right":
        f = r.failing
        lines += ["", f"{w['failing']}: {w['probe']} {f['probe']}, {f['call']}", f"  {w['inputs']}:"]
        for name, value in f["inputs"].items():
            lines += ["    " + line for line in _inputs_text(value, name)]
        for key in ("expected", "got"):
            if f[key] is None:
                continue
            lines.append(f"  {w[key]}:")
            for name, value in f[key].items():
                lines += ["    " + line for line in _inputs_text(value, name)]
    for stream in ("stdout", "stderr"):
        if r.output.get(f"{stream}_bytes"):
            shown = r.output.get(stream, "").splitlines()[:5]
            lines += ["", w["printed"].format(n=f"{r.output[f'{stream}_bytes']:,}", stream=stream)]
            lines += ["  | " + s[:160] for s in shown]
    return "\n".join(lines)


def _tail(result: str) -> str:
    return result[len(result.split(" ")[0]):]


def report_html(r: CodeReport) -> str:
    w = WORDS[r.lang]
    colour = {"right": "#1a7f37", "wrong": "#b35900", "error": "#cf222e", "timeout": "#8250df",
              "crashed": "#cf222e"}[r.verdict]
    e = html.escape
    out = [f'<div class="glassformer-check"><p><b>{e(r.task)}</b> (seed {r.seed}): '
           f'<b style="color:{colour}">{e(w[r.verdict])} ({e(r.verdict)})</b></p>',
           "<p>" + "<br>".join(e(line) for line in r.message.splitlines()) + "</p>"]
    if r.error and r.error.get("lines"):
        out.append("<pre>" + "\n".join(e(f"{x['file']}, line {x['line']}, in {x['function']}: {x['text']}")
                                       for x in r.error["lines"]) + "</pre>")
    if r.notes:
        out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in r.notes) + "</ul>")
    if r.probes:
        out.append(f"<table><tr><th>#</th><th>{e(w['result'])}</th><th>{e(w['call'])}</th></tr>")
        for p in r.probes:
            ok = p["result"] == "right"
            out.append(f"<tr><td>{p['index']}</td><td style=\"color:{'#1a7f37' if ok else '#cf222e'}\">"
                       f"{e(w.get(p['result'].split(' ')[0], p['result']) + _tail(p['result']))}</td>"
                       f"<td><code>{e(p['call'])}</code></td></tr>")
        out.append("</table>")
    if r.properties:
        out.append(f"<p>{e(w['properties'])}:</p><ul>")
        for p in r.properties:
            mark = w["held"] if p["held"] else w["broken"] if p["held"] is False else w["unchecked"]
            out.append(f"<li>{e(mark)}: {e(p['what'])}</li>")
        out.append("</ul>")
    if r.failing and r.verdict != "right":
        f = r.failing
        body = [f"{w['inputs']}:"] + ["  " + x for name, v in f["inputs"].items() for x in _inputs_text(v, name)]
        for key in ("expected", "got"):
            if f[key] is not None:
                body += [f"{w[key]}:"] + ["  " + x for name, v in f[key].items() for x in _inputs_text(v, name)]
        out.append(f"<details><summary>{e(w['failing'])}: {e(f['call'])}</summary><pre>"
                   + e("\n".join(body)) + "</pre></details>")
    out.append("</div>")
    return "".join(out)
