"""A sheet on paper and in Moodle: worksheet.md, worksheet.html (printable), moodle.xml; zh and en.

Moodle XML: one numerical question per asked cell. A question asks for one entry of its table (the entry
at which most bugs give distinct numbers), accepts the key within the sheet's half-unit, and answers
every bug's number at that entry with feedback naming the bug and the lesson's rule it breaks.
"""

from __future__ import annotations

import csv
import html
import io
import math
from xml.sax.saxutils import escape

import numpy as np

from .bugs import BUGS, BY_ID, not_covered, run
from .sheet import Sheet

TEXT = {
    "en": {
        "attention": "Attention by hand", "block": "A Transformer block by hand", "seed": "sheet",
        "intro": "Compute every table below to {d} decimals. Rows are positions (queries), columns are features "
                 "or keys; projections are x @ W (row vectors).",
        "rules_attention": "S = QKᵀ; scaled scores S/√d_k, with −∞ where the mask hides a key; weights = softmax "
                           "along each row (keys); output = weights · V.",
        "rules_block": "Per head r: Q_r = U W^Q_r, K_r = U W^K_r, V_r = U W^V_r, scores Q_r K_rᵀ, ÷√d_k, softmax "
                       "along keys, H_r = A_r V_r; concat (H_1 | H_2 | ...), MHA = concat · W^O; "
                       "LN(x) = (x − μ)/√(σ² + ε) over the d features of a row (γ = 1, β = 0); "
                       "FFN(x) = ReLU(x W_1) W_2.",
        "post": "Post-norm (2017): U = LN₁(X + MHA(X)), Z = LN₂(U + FFN(U)); here U in the heads is X.",
        "pre": "Pre-norm: N₁ = LN₁(X), R = X + MHA(N₁), N₂ = LN₂(R), Z = R + FFN(N₂); here U in the heads is N₁.",
        "mask_causal": "Mask: causal — query i sees keys 1..i (itself included).",
        "mask_none": "Mask: none — every query sees every key.",
        "mask_table": "Mask: the table below (1 = may attend).",
        "given": "Given", "compute": "Compute", "eps": "ε",
        "masked": "Write −∞ (in answers.json: null or \"-inf\") for a masked scaled score.",
        "answers": "Hand in answers.json: a trace-spec v1 output with the tables you computed, e.g. {example}; "
                   "check it with `glassformer exercise check exercise.json answers.json`.",
        "audit": "Mistakes this sheet tells apart", "not_covered": "Not diagnosed on this sheet",
        "question": "Sheet {seed}: compute entry (row {i}, column {j}) of {cell} to {d} decimals.",
        "right": "Right.",
        "other": "Not what the formula gives, nor a known mistake: recompute this entry step by step.",
        "key_title": "Keys of the class set",
    },
    "zh": {
        "attention": "手算注意力", "block": "手算一个 Transformer block", "seed": "练习",
        "intro": "把下面每张表算到小数点后 {d} 位。行是位置（query），列是特征或 key；投影是 x @ W（行向量）。",
        "rules_attention": "S = QKᵀ；缩放得分 S/√d_k，被 mask 遮住的 key 记 −∞；权重 = 沿每一行（key 方向）softmax；"
                           "输出 = 权重 · V。",
        "rules_block": "第 r 个头：Q_r = U W^Q_r，K_r = U W^K_r，V_r = U W^V_r，得分 Q_r K_rᵀ，除以 √d_k，沿 key 做 "
                       "softmax，H_r = A_r V_r；拼接 (H_1 | H_2 | ...)，MHA = 拼接 · W^O；LN(x) = (x − μ)/√(σ² + ε)，"
                       "对一行的 d 个特征求 μ、σ²（γ = 1，β = 0）；FFN(x) = ReLU(x W_1) W_2。",
        "post": "Post-norm（2017）：U = LN₁(X + MHA(X))，Z = LN₂(U + FFN(U))；各头里的 U 就是 X。",
        "pre": "Pre-norm：N₁ = LN₁(X)，R = X + MHA(N₁)，N₂ = LN₂(R)，Z = R + FFN(N₂)；各头里的 U 是 N₁。",
        "mask_causal": "Mask：因果——第 i 个 query 只看 key 1..i（包括自己）。",
        "mask_none": "Mask：无——每个 query 看全部 key。",
        "mask_table": "Mask：见下表（1 = 可以看）。",
        "given": "已知", "compute": "要算", "eps": "ε",
        "masked": "被遮住的缩放得分写 −∞（answers.json 里写 null 或 \"-inf\"）。",
        "answers": "交 answers.json：一份 trace-spec v1 输出，填上你算出的表，例如 {example}；"
                   "用 `glassformer exercise check exercise.json answers.json` 检查。",
        "audit": "本练习能区分的错误", "not_covered": "本练习诊断不了的错误",
        "question": "练习 {seed}：算出 {cell} 第 {i} 行第 {j} 列，保留 {d} 位小数。",
        "right": "正确。", "other": "既不是公式的结果，也不是已知的错误：请一步步重算这一项。",
        "key_title": "全班练习的答案",
    },
}

NAMES = {
    "en": {"scores": "scores S = QKᵀ", "scaled_scores": "scaled scores S/√d_k", "weights": "weights A",
           "output": "output", "q": "Q", "k": "K", "v": "V", "concat": "concat (H_1 | H_2)",
           "mha": "MHA = concat · W^O", "residual": "residual", "normed": "LayerNorm", "hidden": "FFN hidden",
           "ffn": "FFN output", "final": "block output Z", "head": "head", "sublayer": "sub-layer", "input": "input"},
    "zh": {"scores": "得分 S = QKᵀ", "scaled_scores": "缩放得分 S/√d_k", "weights": "权重 A",
           "output": "输出", "q": "Q", "k": "K", "v": "V", "concat": "拼接 (H_1 | H_2)",
           "mha": "MHA = 拼接 · W^O", "residual": "残差和", "normed": "LayerNorm", "hidden": "FFN 隐层",
           "ffn": "FFN 输出", "final": "block 输出 Z", "head": "头", "sublayer": "子层", "input": "输入"},
}


def cell_label(path: str, lang: str, kind: str = "block") -> str:
    """A cell's path said in words: `self_attention.heads.0.weights` -> `head 1: weights A`."""
    n = NAMES[lang]
    parts = path.split(".")
    if path == "output" and kind == "block":
        return n["final"]
    if parts[0] == "self_attention" and parts[1] == "heads":
        return f"{n['head']} {int(parts[2]) + 1}: {n[parts[3]]}"
    if path == "self_attention.concat":
        return n["concat"]
    if path == "self_attention.output":
        return n["mha"]
    if parts[0] == "ffn":
        return n["hidden"] if parts[1] == "hidden" else n["ffn"]
    if parts[0] == "sublayers":
        return f"{n['sublayer']} {int(parts[1]) + 1}: {n[parts[2]]}"
    return n.get(path, path)


def _fmt(v: float, d: int) -> str:
    if not math.isfinite(v):
        return "−∞"
    text = f"{v:.{d}f}"
    return text.lstrip("-") if float(text) == 0 else text


def _num(v: float) -> str:
    """A given number as written on the sheet: 1, -0.5."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def given_tables(sheet: Sheet) -> list[tuple[str, np.ndarray]]:
    s = sheet.spec
    if sheet.kind == "attention":
        return [("Q", s["q"]), ("K", s["k"]), ("V", s["v"])]
    out = [("X", s["x"])]
    for r, h in enumerate(s["self_attention"]["heads"]):
        out += [(f"W^Q_{r + 1}", h["w_q"]), (f"W^K_{r + 1}", h["w_k"]), (f"W^V_{r + 1}", h["w_v"])]
    out += [("W^O", s["self_attention"]["w_o"]), ("W_1", s["ffn"]["w_1"]), ("W_2", s["ffn"]["w_2"])]
    return out


def rules(sheet: Sheet, lang: str) -> list[str]:
    t = TEXT[lang]
    lines = [t["intro"].format(d=sheet.decimals), t[f"rules_{sheet.kind}"]]
    if sheet.kind == "block":
        lines.append(t[sheet.norm])
        lines.append(f"{t['eps']} = {sheet.spec['eps']:g}")
    mask = sheet.mask
    lines.append(t["mask_table"] if isinstance(mask, np.ndarray) else t[f"mask_{mask}"])
    if sheet.has_mask:
        lines.append(t["masked"])
    example = '{"version": 1, "' + sheet.asked[0].split(".")[0] + '": ...}'
    lines.append(t["answers"].format(example=example))
    return lines


def _audit_lines(sheet: Sheet, lang: str) -> tuple[list[str], list[str]]:
    covered = [b.id for b in BUGS if not_covered(b, sheet) is None]
    return covered, [f"{', '.join(ids)} — {reason}" for reason, ids in uncovered_by_reason(sheet).items()]


def uncovered_by_reason(sheet: Sheet) -> dict[str, list[str]]:
    """The bugs a sheet cannot show, grouped by why."""
    out: dict[str, list[str]] = {}
    for b in BUGS:
        reason = not_covered(b, sheet)
        if reason is not None:
            out.setdefault(reason, []).append(b.id)
    return out


# ---- markdown --------------------------------------------------------------------------------

def _md_table(values: np.ndarray | None, shape: tuple[int, int], d: int | None = None) -> str:
    n, m = shape
    head = "| | " + " | ".join(str(j + 1) for j in range(m)) + " |"
    rule = "|---|" + "---|" * m
    rows = []
    for i in range(n):
        cells = [("" if values is None else (_num(values[i, j]) if d is None else _fmt(values[i, j], d)))
                 for j in range(m)]
        rows.append(f"| {i + 1} | " + " | ".join(c if c else "&nbsp;" for c in cells) + " |")
    return "\n".join([head, rule, *rows])


def worksheet_md(sheet: Sheet, lang: str | None = None) -> str:
    lang = lang or sheet.lang
    t = TEXT[lang]
    key = run(sheet)
    out = [f"# {t[sheet.kind]} — {t['seed']} {sheet.seed}", ""]
    out += [f"- {line}" for line in rules(sheet, lang)] + ["", f"## {t['given']}", ""]
    for name, a in given_tables(sheet):
        out += [f"**{name}** ({a.shape[0]}×{a.shape[1]})", "", _md_table(a, a.shape), ""]
    if isinstance(sheet.mask, np.ndarray):
        out += [_md_table(sheet.mask.astype(float), sheet.mask.shape), ""]
    out += [f"## {t['compute']}", ""]
    for path in sheet.asked:
        shape = key[path].shape
        out += [f"**{cell_label(path, lang, sheet.kind)}** — `{path}` ({shape[0]}×{shape[1]})", "",
                _md_table(None, shape), ""]
    covered, missing = _audit_lines(sheet, lang)
    out += ["---", "", f"{t['audit']}: {', '.join(covered)}.", ""]
    if missing:
        out += [f"{t['not_covered']}:", ""] + [f"- {m}" for m in missing] + [""]
    return "\n".join(out)


# ---- printable html ----------------------------------------------------------------------------

CSS = """body{font-family:system-ui,"Noto Sans CJK SC","PingFang SC",sans-serif;max-width:60rem;margin:1.5rem auto;
padding:0 1rem;line-height:1.45}h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:1.4rem}
table{border-collapse:collapse;margin:.3rem 1.2rem .9rem 0;display:inline-table;vertical-align:top}
td,th{border:1px solid #777;padding:.2rem .45rem;min-width:4.2rem;height:1.5rem;text-align:right;
font-variant-numeric:tabular-nums}th{background:#eee;min-width:1.2rem}caption{text-align:left;font-weight:600;
padding-bottom:.2rem}.given td{min-width:1.6rem}.audit{font-size:.85rem;color:#444;border-top:1px solid #aaa;
margin-top:1.5rem}code{font-size:.85em}@media print{body{margin:0;max-width:none}table{page-break-inside:avoid}
.audit{page-break-before:auto}}"""


def _html_table(caption: str, values: np.ndarray | None, shape: tuple[int, int], cls: str = "") -> str:
    n, m = shape
    head = "<tr><th></th>" + "".join(f"<th>{j + 1}</th>" for j in range(m)) + "</tr>"
    rows = "".join("<tr><th>" + str(i + 1) + "</th>" + "".join(
        f"<td>{'' if values is None else html.escape(_num(values[i, j]))}</td>" for j in range(m)) + "</tr>"
        for i in range(n))
    return f'<table class="{cls}"><caption>{caption}</caption>{head}{rows}</table>'


def worksheet_html(sheet: Sheet, lang: str | None = None) -> str:
    lang = lang or sheet.lang
    t = TEXT[lang]
    key = run(sheet)
    title = html.escape(f"{t[sheet.kind]} — {t['seed']} {sheet.seed}")
    parts = [f'<!doctype html><html lang="{"zh-CN" if lang == "zh" else "en"}"><head><meta charset="utf-8">'
             f"<title>{title}</title><style>{CSS}</style></head><body><h1>{title}</h1><ul>"]
    parts += [f"<li>{html.escape(line)}</li>" for line in rules(sheet, lang)]
    parts.append(f"</ul><h2>{html.escape(t['given'])}</h2>")
    for name, a in given_tables(sheet):
        parts.append(_html_table(html.escape(f"{name} ({a.shape[0]}×{a.shape[1]})"), a, a.shape, "given"))
    if isinstance(sheet.mask, np.ndarray):
        parts.append(_html_table("mask", sheet.mask.astype(float), sheet.mask.shape, "given"))
    parts.append(f"<h2>{html.escape(t['compute'])}</h2>")
    for path in sheet.asked:
        shape = key[path].shape
        caption = f"{html.escape(cell_label(path, lang, sheet.kind))} <code>{html.escape(path)}</code>"
        parts.append(_html_table(caption, None, shape))
    covered, missing = _audit_lines(sheet, lang)
    parts.append(f'<div class="audit"><p>{html.escape(t["audit"])}: {html.escape(", ".join(covered))}.</p>')
    if missing:
        parts.append(f"<p>{html.escape(t['not_covered'])}:</p><ul>"
                     + "".join(f"<li>{html.escape(m)}</li>" for m in missing) + "</ul>")
    parts.append("</div></body></html>\n")
    return "".join(parts)


# ---- moodle xml --------------------------------------------------------------------------------

def _entry_choices(sheet: Sheet, key: dict, runs: dict, path: str, wanted: set[str]) -> tuple[tuple[int, int], dict]:
    """The entry of `path` where most bugs give distinct numbers (those in `wanted` first), and those numbers."""
    gap = 2 * sheet.tolerance
    best, best_score, best_values = (0, 0), (-1, -1), {}
    n, m = key[path].shape
    for i in range(n):
        for j in range(m):
            k = key[path][i, j]
            if not math.isfinite(k):
                continue
            values: dict[str, float] = {}
            for bug_id, readings in runs.items():
                for values_run in readings:
                    v = values_run[path][i, j]
                    if math.isfinite(v) and abs(v - k) > gap:
                        values.setdefault(bug_id, v)
            groups = _groups(values, gap)
            score = (sum(bool(set(g) & wanted) for g, _ in groups), len(groups))
            if score > best_score:
                best, best_score, best_values = (i, j), score, values
    return best, best_values


def _groups(values: dict[str, float], gap: float) -> list[tuple[list[str], float]]:
    """Bugs whose numbers at an entry agree within `gap`, together (one answer with one feedback)."""
    groups: list[tuple[list[str], float]] = []
    for bug_id, v in values.items():
        for ids, w in groups:
            if abs(v - w) <= gap:
                ids.append(bug_id)
                break
        else:
            groups.append(([bug_id], v))
    return groups


def _cdata(text: str) -> str:
    return "<![CDATA[" + text.replace("]]>", "]]]]><![CDATA[>") + "]]>"


def _given_html(sheet: Sheet, lang: str) -> str:
    parts = ["<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in rules(sheet, lang)[:-1]) + "</ul>"]
    for name, a in given_tables(sheet):
        parts.append(_html_table(html.escape(f"{name} ({a.shape[0]}×{a.shape[1]})"), a, a.shape))
    return "".join(parts)


def moodle_xml(sheets: list[Sheet], lang: str | None = None) -> str:
    """Moodle XML: a category per sheet, a numerical question per asked cell, a feedback per named bug."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>', "<quiz>"]
    for sheet in sheets:
        lng = lang or sheet.lang
        t = TEXT[lng]
        key = run(sheet)
        runs = {b.id: [run(sheet, sw) for sw in b.readings] for b in BUGS if not_covered(b, sheet) is None}
        given = _given_html(sheet, lng)
        category = f"$course$/glassformer/{sheet.kind}/{t['seed']} {sheet.seed}"
        out.append(f'  <question type="category"><category><text>{escape(category)}</text></category></question>')
        unseen = set(runs)
        for path in sheet.asked:
            (i, j), values = _entry_choices(sheet, key, runs, path, unseen)
            k = float(key[path][i, j])
            label = f"{cell_label(path, lng, sheet.kind)} ({path})"
            text = t["question"].format(seed=sheet.seed, i=i + 1, j=j + 1, cell=label, d=sheet.decimals)
            tol = f"{sheet.tolerance:.{sheet.decimals + 2}f}"
            out += ['  <question type="numerical">',
                    f"    <name><text>{escape(f'{sheet.seed} {path} [{i + 1},{j + 1}]')}</text></name>",
                    f'    <questiontext format="html"><text>{_cdata(f"<p>{html.escape(text)}</p>{given}")}</text>'
                    "</questiontext>",
                    "    <defaultgrade>1</defaultgrade><penalty>0</penalty><hidden>0</hidden>",
                    f'    <answer fraction="100"><text>{k:.{sheet.decimals + 6}f}</text><tolerance>{tol}</tolerance>'
                    f'<feedback format="html"><text>{escape(t["right"])}</text></feedback></answer>']
            for ids, v in _groups(values, 2 * sheet.tolerance):
                unseen -= set(ids)
                words = " ".join(f"{b}: {getattr(BY_ID[b], lng)} ({BY_ID[b].claim})" for b in ids)
                out.append(f'    <answer fraction="0"><text>{v:.{sheet.decimals + 6}f}</text><tolerance>{tol}'
                           f'</tolerance><feedback format="html"><text>{escape(words)}</text></feedback></answer>')
            out += [f'    <answer fraction="0"><text>*</text><feedback format="html"><text>{escape(t["other"])}'
                    "</text></feedback></answer>",
                    "    <units></units><unitgradingtype>0</unitgradingtype><showunits>3</showunits>",
                    "  </question>"]
    out.append("</quiz>")
    return "\n".join(out) + "\n"


# ---- the class set's key table ---------------------------------------------------------------------

def key_table_csv(sheets: list[Sheet]) -> str:
    """One row per asked entry of every sheet: seed, cell, row, column, key (the sheet's decimals)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["seed", "cell", "row", "column", "key"])
    for sheet in sheets:
        key = run(sheet)
        for path in sheet.asked:
            for (i, j), v in np.ndenumerate(key[path]):
                writer.writerow([sheet.seed, path, i + 1, j + 1, _fmt(float(v), sheet.decimals)])
    return buf.getvalue()


def key_table_md(sheets: list[Sheet], lang: str | None = None) -> str:
    lang = lang or (sheets[0].lang if sheets else "zh")
    out = [f"# {TEXT[lang]['key_title']}", ""]
    for sheet in sheets:
        key = run(sheet)
        out += [f"## {TEXT[lang]['seed']} {sheet.seed} ({sheet.kind})", ""]
        for path in sheet.asked:
            out += [f"**{cell_label(path, lang, sheet.kind)}** `{path}`", "", _md_table(key[path], key[path].shape,
                                                                            sheet.decimals), ""]
    return "\n".join(out)
