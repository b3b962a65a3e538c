"""What a teacher hands out for the code tasks: a starter file per task, and Moodle CodeRunner questions.

A starter file has the task's signature, a docstring in 中文 and English with the lesson's formula, the
shapes and the params layout, and a body that raises NotImplementedError (checked as it is, it is an
`error`, not `right`). A CodeRunner question (type python3, a combinator template graded by the template)
holds the starter as its preloaded answer; its template calls the same checker, `check_source`, and prints
the JSON CodeRunner's template grader reads: the fraction (1 when right) and the report as HTML.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from .tasks import TASKS, Task

HEADS_LAYOUT = '''params = {
    "heads": [                                   # one dict per head, H >= 1
        {"w_q": (d_model, d_k), "w_k": (d_model, d_k), "w_v": (d_model, d_v)},
        ...
    ],
    "w_o": (H * d_v, d_model),                   # W^O
}'''

BLOCK_LAYOUT = '''params = {
    "self_attention": {"heads": [...], "w_o": ...},   # as multi_head's params{cross}
    "ffn": {"w_1": (d_model, d_ff), "b_1": (d_ff,), "w_2": (d_ff, d_model), "b_2": (d_model,)},
    "layer_norms": [{"gamma": (d_model,), "beta": (d_model,)}, ...],   # {count}: one per sub-layer, in order
    "eps": float,                                # LayerNorm's ε: use it, do not write 1e-5
}'''

CONVENTION = {
    "zh": "所有权重都是 (输入, 输出)：行向量乘在左边，Q_r = x @ w_q（课文的 X W^Q）。"
          "注意力投影没有偏置；FFN 有 b_1、b_2。",
    "en": "Every weight is (in, out): a row vector is multiplied on the left, Q_r = x @ w_q (the lesson's X W^Q). "
          "Attention projections have no bias; the FFN has b_1 and b_2.",
}

# what each argument is, and what the function returns: (zh, en) per task
DETAILS: dict[str, tuple[str, str]] = {
    "attention": (
        """q: (n, d_k)，每行一个 query；k: (m, d_k)；v: (m, d_v)
mask: None，或 (n, m) 布尔表，True = 可以看（第 i 个 query 可以读第 j 个 key）
返回 (weights, output)：weights (n, m)，每行在可见的 key 上和为 1；output (n, d_v) = weights @ v
一个 query 若看不到任何 key：它的权重全为 0，输出也为 0（与模型相同）。""",
        """q: (n, d_k), one query per row; k: (m, d_k); v: (m, d_v)
mask: None, or an (n, m) boolean table, True = may attend (query i may read key j)
returns (weights, output): weights (n, m), each row summing to 1 over its visible keys;
output (n, d_v) = weights @ v. A query with no visible key gets zero weights and a zero output (as the model)."""),
    "causal-mask": (
        """n: 位置个数
返回 (n, n) 布尔表 mask，mask[i, j] = True 表示第 i 个位置可以看第 j 个位置（j <= i，包括自己）。""",
        """n: the number of positions
returns an (n, n) boolean table, mask[i, j] = True when position i may attend to position j (j <= i, itself
included)."""),
    "layer-norm": (
        """x: (n, d)；gamma、beta: (d,)；eps: 浮点数
返回 (n, d)：每一行在它自己的 d 个特征上减均值、除以 √(方差 + eps)（方差除以 d），再乘 gamma 加 beta。""",
        """x: (n, d); gamma, beta: (d,); eps: a float
returns (n, d): each row minus its own mean over its d features, divided by √(variance + eps) (the variance
divided by d), times gamma plus beta."""),
    "multi-head": (
        """x: (n, d_model)；mask: None，或 (n, n) 布尔表，True = 可以看
params 的结构（形状）：
{heads}
返回 (n, d_model)。没有可见 key 的 query：它那一头的输出为 0。""",
        """x: (n, d_model); mask: None, or an (n, n) boolean table, True = may attend
params (shapes):
{heads}
returns (n, d_model). A query with no visible key gets a zero output from that head."""),
    "encoder-block": (
        """x: (n, d_model)；norm: "post"（2017 年的块，默认）或 "pre"
params 的结构（形状）：
{block}
返回 (n, d_model)。pre-norm 的输出就是第二个残差之后的结果（最后没有 LayerNorm）。""",
        """x: (n, d_model); norm: "post" (the 2017 block, the default) or "pre"
params (shapes):
{block}
returns (n, d_model). A pre-norm block's output is the second residual sum (no LayerNorm at the end)."""),
    "decoder-block": (
        """y: (n, d_model) 目标侧的行；memory: (m, d_model) encoder 的输出
自注意力用因果 mask（第 i 行只读 1..i 行）；cross-attention 的 Q 来自 y 这一侧，K、V 来自 memory，没有 mask。
params 的结构（形状）：
{block}
返回 (n, d_model)，post-norm。""",
        """y: (n, d_model), the target side's rows; memory: (m, d_model), the encoder's output
self-attention is causal (row i reads rows 1..i); cross-attention takes Q from the target side and K, V from
the memory, unmasked.
params (shapes):
{block}
returns (n, d_model), post-norm."""),
    "positions": (
        """n: 位置个数（p = 0..n−1）；d: 通道数（偶数）
返回 (n, d) 的表：第 2r 列是 sin，第 2r+1 列是同一频率的 cos。""",
        """n: the number of positions (p = 0..n−1); d: the number of channels (even)
returns the (n, d) table: column 2r a sine, column 2r+1 the cosine of the same frequency."""),
}


def _layout(task: Task) -> dict:
    block = BLOCK_LAYOUT.replace("{cross}", '\n    "cross_attention": {"heads": [...], "w_o": ...},  # the same layout'
                                 if task.name == "decoder-block" else "")
    block = block.replace("{count}", "3" if task.name == "decoder-block" else "2")
    return {"heads": HEADS_LAYOUT, "block": block}


def details(task: Task, lang: str) -> str:
    text = DETAILS[task.name][0 if lang == "zh" else 1]
    for key, value in _layout(task).items():
        text = text.replace("{" + key + "}", value)
    if task.name in ("multi-head", "encoder-block", "decoder-block"):
        text += "\n" + CONVENTION[lang]
    return text


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def starter(task: Task) -> str:
    """The starter file of `task`: signature, the bilingual docstring with the formula, NotImplementedError."""
    file = f"{task.function}.py"
    return f'''"""{task.name} — {task.zh} / {task.en}

    {task.formula}

检查 / check:
    glassformer exercise check-code {file} --task {task.name}
在 notebook 里 / in a notebook:
    from glassformer.lesson.exercises import check_function
    check_function({task.function}, task="{task.name}")
只交这一个文件；需要的辅助函数也写在这里。/ Hand in this one file; write any helper you need in it.
"""

import numpy as np


def {task.function}({task.signature}):
    """{task.zh}
{_indent(details(task, "zh"))}

    {task.en}
{_indent(details(task, "en"))}
    """
    raise NotImplementedError("在这里写你的代码 / write your code here")
'''


TEMPLATE = '''import html
import json

student_answer = """{{ STUDENT_ANSWER | e('py') }}"""
try:
    from glassformer.lesson.exercises.judge import check_source
except ImportError:
    print(json.dumps({"fraction": 0.0, "prologuehtml": "<p>This question needs glassformer's checker on the "
                      "Jobe server: pip install --no-deps glassformer, and numpy.</p>"}))
else:
    try:
        report = check_source(student_answer, "TASK", SEED, filename="answer.py", lang="LANG")
    except ValueError as error:                      # not Python, no such function: one line
        print(json.dumps({"fraction": 0.0, "prologuehtml": "<p>" + html.escape(str(error)) + "</p>"}))
    else:
        print(json.dumps({"fraction": 1.0 if report.verdict == "right" else 0.0,
                          "prologuehtml": report._repr_html_()}))
'''


def coderunner_template(task: Task, seed: int, lang: str) -> str:
    return TEMPLATE.replace('"TASK"', f'"{task.name}"').replace("SEED", str(seed)).replace('"LANG"', f'"{lang}"')


def coderunner_xml(tasks: list[Task], seed: int, lang: str) -> str:
    """Moodle XML: one CodeRunner question (python3) per task, its template calling the checker."""
    quiz = ET.Element("quiz")
    category = ET.SubElement(ET.SubElement(ET.SubElement(quiz, "question", type="category"), "category"), "text")
    category.text = "$course$/glassformer code"
    for task in tasks:
        q = ET.SubElement(quiz, "question", type="coderunner")
        ET.SubElement(ET.SubElement(q, "name"), "text").text = f"glassformer: {task.name}"
        title = task.zh if lang == "zh" else task.en
        text = (f"<p><b>{title}</b></p><p><code>def {task.function}({task.signature})</code></p>"
                f"<p><code>{task.formula}</code></p><pre>{_escape(details(task, lang))}</pre>")
        ET.SubElement(ET.SubElement(q, "questiontext", format="html"), "text").text = text
        ET.SubElement(ET.SubElement(q, "generalfeedback", format="html"), "text").text = ""
        for tag, value in (("defaultgrade", "1"), ("penalty", "0"), ("hidden", "0"), ("coderunnertype", "python3"),
                           ("prototypetype", "0"), ("allornothing", "1"), ("penaltyregime", "0"), ("precheck", "0"),
                           ("showsource", "0"), ("answerboxlines", "30"), ("answerboxcolumns", "100"),
                           ("answerpreload", starter(task)), ("globalextra", ""), ("useace", "1"),
                           ("resultcolumns", ""), ("template", coderunner_template(task, seed, lang)),
                           ("iscombinatortemplate", "1"), ("allowmultiplestdins", "0"), ("answer", ""),
                           ("validateonsave", "0"), ("testsplitterre", ""), ("language", "python3"), ("acelang", ""),
                           ("sandbox", ""), ("grader", "TemplateGrader"), ("cputimelimitsecs", "40"),
                           ("memlimitmb", "2000"), ("sandboxparams", ""), ("templateparams", ""),
                           ("hoisttemplateparams", "1"), ("twigall", "0"), ("uiplugin", "ace"), ("attachments", "0"),
                           ("attachmentsrequired", "0"), ("maxfilesize", "10240"), ("filenamesregex", ""),
                           ("filenamesexplain", ""), ("displayfeedback", "1")):
            ET.SubElement(q, tag).text = value
        case = ET.SubElement(ET.SubElement(q, "testcases"), "testcase", testtype="0", useasexample="0",
                             hiderestiffail="0", mark="1.0000000")
        for tag, value in (("testcode", ""), ("stdin", ""), ("expected", ""), ("extra", ""), ("display", "SHOW")):
            ET.SubElement(ET.SubElement(case, tag), "text").text = value
    ET.indent(quiz)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(quiz, encoding="unicode") + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def tasks_named(name: str) -> list[Task]:
    return list(TASKS.values()) if name == "all" else [TASKS[name]]
