"""The report on a student's code: its verdict, the words it is told in (中文, English), as text and HTML."""

from __future__ import annotations

import html
import math
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from .tasks import Probe, Task


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
    where: dict = field(default_factory=dict)      # bug id -> the one sub-layer of a block it sits in

    def as_json(self) -> dict:
        return {"task": self.task, "seed": self.seed, "verdict": self.verdict, "bugs": self.bugs, "where": self.where,
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
        "only_in": "only in the {site} sub-layer",
        "sites": {"self_attention": "self-attention", "cross_attention": "cross-attention", "ffn": "FFN"},
        "no_known": "Wrong, and no mistake of the library explains it; the smallest failing probe is below.",
        "claim": "lesson claim", "source": "seen in public code",
        "shape_got": "{name}: shape {got} where {expected} was expected",
        "output": "output {name}", "result_": "the result",
        "other_got": "returned {what}; the task returns {want} (a shape error)",
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
        "during_calls": "during the calls",
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
        "only_in": "只在{site}子层",
        "sites": {"self_attention": "自注意力", "cross_attention": " cross-attention ", "ffn": " FFN "},
        "no_known": "错，错误库里没有哪个错误能解释；下面是出错的最小探针。",
        "claim": "课文论断", "source": "公开代码中的同类错误",
        "shape_got": "{name}的形状（shape）是 {got}，应为 {expected}",
        "output": "输出 {name} ", "result_": "结果",
        "other_got": "返回了 {what}；本任务应返回 {want}（形状 shape 错误）",
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
        "during_call": "在探针 {probe}（{call}）上", "during_load": "在加载文件时", "during_calls": "在调用期间",
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


def size_text(n: int) -> str:
    return f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def shape_text(shape) -> str:
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


def plain(value):
    """JSON form of a probe's inputs or outputs: arrays as nested lists, NaN and ±inf as null."""
    if isinstance(value, np.ndarray):
        if value.dtype == bool:
            return value.tolist()
        return [plain(v) for v in value] if value.ndim else plain(float(value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (np.floating, np.integer)):
        return plain(value.item())
    return value


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
        lines += ["", f" #  {_pad(w['result'], 28)} {w['call']}"]
        for p in r.probes:
            lines.append(f"{p['index']:>2}  {_pad(_result(p, w), 28)} {p['call']}")
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


def _pad(text: str, width: int) -> str:
    """`text` padded to `width` columns, a CJK character counting two."""
    shown = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    return text + " " * max(0, width - shown)


def _result(probe: dict, w: dict) -> str:
    """right / wrong = no-scale / shape ... in the report's language."""
    text = w.get(probe["result"], probe["result"])
    return text + (" = " + "+".join(probe["as"]) if probe.get("as") else "")


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
                       f"{e(_result(p, w))}</td>"
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
