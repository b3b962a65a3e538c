"""`glassformer exercise new ...` (sheets from seeds, audited; starter files for code), `exercise check ...`
(a hand-filled sheet) and `exercise check-code ...` (a student's own code, run apart)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ... import limits
from ...errors import UsageError
from ...options import folder_path
from .sheet import NotASheet
from .tasks import TASKS


def add_exercise_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = sub.add_parser("new", help="write sheets (exercise.json, key.json, worksheet.md/.html, moodle.xml), or "
                                     "starter files for code (--code)",
                         description="Write a sheet per seed (numbers a student computes by hand) and print its "
                                     "audit: which mistakes it tells apart. With --code, a starter .py per task "
                                     "(and with --moodle, a CodeRunner question per task).")
    what = new.add_mutually_exclusive_group(required=True)
    what.add_argument("--kind", choices=("attention", "block"),
                      help="attention: one head from Q, K, V (3×3); block: the lesson's BLOCK shape (3 rows, d=4, "
                           "two heads, LayerNorm, FFN)")
    what.add_argument("--code", choices=(*TASKS, "all"), metavar="TASK",
                      help=f"a starter file for the task a student writes as code ({', '.join(TASKS)}, or all)")
    new.add_argument("--moodle", action="store_true",
                     help="with --code: also coderunner.xml, a Moodle CodeRunner question (python3) per task whose "
                          "template runs the checker")
    new.add_argument("--norm", choices=("post", "pre"), default="post", help="block placement (default post)")
    new.add_argument("--mask", choices=("none", "causal"), default=None,
                     help="self-attention mask (default: causal for attention, none for block)")
    new.add_argument("--seed", type=int, default=0, help="the sheet's seed (default 0)")
    new.add_argument("--count", type=int, default=1,
                     help="a class set: COUNT sheets of seeds SEED, SEED+1, ... (one folder each, one key table)")
    new.add_argument("--out", required=True, metavar="DIR", type=folder_path, help="folder to write")
    new.add_argument("--lang", choices=("zh", "en"), default="zh", help="worksheet language (default zh)")
    new.add_argument("--decimals", type=int, default=4, help="decimals a student gives (default 4)")
    new.add_argument("--eps", type=float, default=None,
                     help="LayerNorm ε of block sheets (default 0.1: 1e-5 hides ε outside the √ at 4 decimals)")
    new.add_argument("--ask", default=None, metavar="CELLS",
                     help="comma-separated cell paths to ask (default: every cell)")
    check = sub.add_parser("check", help="check a student's answers cell by cell",
                           description="Each filled cell: right, carried (right from the student's own earlier "
                                       "numbers) or wrong, with the named bug or `slip`.")
    check.add_argument("exercise", metavar="EXERCISE.json", help="the sheet (sheet.json beside it is read too)")
    check.add_argument("answers", metavar="ANSWERS.json", help="a trace-spec v1 output with any cells filled in")
    check.add_argument("--json", action="store_true", help="print {verdict, bugs, cells} as JSON")
    check.add_argument("--lang", choices=("zh", "en"), default=None, help="table language (default: the sheet's)")
    code = sub.add_parser("check-code", help="run a student's own function on probes, apart, and name the mistake",
                          description="Run the task's function of FILE.py in a confined process on probes drawn "
                                      "from the seed; compare with the lesson's computation and name the library's "
                                      "bug (or two) that the code follows. Verdicts: right, wrong, error, timeout, "
                                      "crashed.")
    code.add_argument("file", metavar="FILE.py", help="the student's Python file")
    code.add_argument("--task", choices=TASKS, required=True, metavar="TASK",
                      help=f"the function it implements: {', '.join(TASKS)}")
    code.add_argument("--seed", type=int, default=0, help="the probes' seed (default 0)")
    code.add_argument("--json", action="store_true",
                      help="print {verdict, bugs, shape_error, probes, ...} as JSON (docs/exercises.md)")
    code.add_argument("--lang", choices=("zh", "en"), default="zh", help="report language (default zh)")
    code.add_argument("--inputs", choices=("numpy", "torch"), default="numpy",
                      help="what the function is given: NumPy arrays (default) or torch tensors (float64)")
    for p in (new, check, code):
        p.add_argument("--no-limits", action="store_true", default=argparse.SUPPRESS,
                       help="lift the work limits (docs/limits.md) for trusted local input")


def exercise_command(args: argparse.Namespace) -> int:
    if args.action == "new":
        return _new_code(args) if args.code else _new(args)
    if args.action == "check-code":
        return _check_code(args)
    return _check(args)


def _new_code(args: argparse.Namespace) -> int:
    from .handout import coderunner_xml, starter, tasks_named
    sheet_only = {"--norm": args.norm != "post", "--mask": args.mask is not None, "--count": args.count != 1,
                  "--decimals": args.decimals != 4, "--eps": args.eps is not None, "--ask": args.ask is not None}
    for flag, given in sheet_only.items():
        if given:
            raise UsageError(f"{flag}: only for sheets (--kind), not with --code")
    if not 0 <= args.seed <= 2**32 - 1:
        raise UsageError(f"--seed: expected 0..{2**32 - 1}, got {args.seed}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    tasks = tasks_named(args.code)
    for task in tasks:
        path = out / f"{task.function}.py"
        path.write_text(starter(task), encoding="utf-8")
        print(f"{path}: starter for task {task.name}: def {task.function}({task.signature}); check it with "
              f"glassformer exercise check-code {path} --task {task.name}")
    if args.moodle:
        path = out / "coderunner.xml"
        path.write_text(coderunner_xml(tasks, args.seed, args.lang), encoding="utf-8")
        print(f"{path}: {len(tasks)} CodeRunner question(s) (python3), seed {args.seed}; the Jobe server needs "
              f"glassformer's checker: pip install --no-deps glassformer, and numpy")
    return 0


def _check_code(args: argparse.Namespace) -> int:
    from .judge import check_code
    if not 0 <= args.seed <= 2**32 - 1:
        raise UsageError(f"--seed: expected 0..{2**32 - 1}, got {args.seed}")
    report = check_code(args.file, args.task, args.seed, lang=args.lang, inputs=args.inputs)
    if args.json:
        print(json.dumps(report.as_json(), ensure_ascii=False, allow_nan=False))
    else:
        print(report.text())
    return 0


def _new(args: argparse.Namespace) -> int:
    from .generate import EPS, new_sheet, write_sheet
    from .render import key_table_csv, key_table_md, moodle_xml, uncovered_by_reason
    if args.count < 1:
        raise UsageError(f"--count: expected at least 1, got {args.count}")
    limits.check("--count: sheets", args.count, "MAX_SHEET_COUNT", "--count")
    if args.seed < 0 or args.seed + args.count - 1 > 2**32 - 1:
        top = 2**32 - args.count
        raise UsageError(f"--seed: expected 0..{top}" + (f" (with --count {args.count})" if args.count > 1 else "")
                         + f", got {args.seed}")
    if args.moodle:
        raise UsageError("--moodle: only with --code (a sheet's folder always holds moodle.xml)")
    eps = EPS if args.eps is None else args.eps
    if not eps >= 0 or eps != eps or eps == float("inf"):
        raise UsageError(f"--eps: expected a finite number >= 0, got {args.eps}")
    asked = [a.strip() for a in args.ask.split(",") if a.strip()] if args.ask else None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a folder")
    sheets = []
    for seed in range(args.seed, args.seed + args.count):
        sheet = new_sheet(args.kind, seed, norm=args.norm, mask=args.mask, eps=eps, decimals=args.decimals,
                          lang=args.lang, asked=asked)
        folder = out if args.count == 1 else out / f"seed-{seed}"
        write_sheet(sheet, folder)
        sheets.append(sheet)
        print(_audit_line(sheet, folder))
    if args.count > 1:
        (out / "keys.csv").write_text(key_table_csv(sheets), encoding="utf-8")
        (out / "keys.md").write_text(key_table_md(sheets), encoding="utf-8")
        (out / "moodle.xml").write_text(moodle_xml(sheets), encoding="utf-8")
        print(f"class set: {len(sheets)} sheets in {out}/seed-*/, one key table {out}/keys.csv (and keys.md), "
              f"all questions in {out}/moodle.xml")
    missing = uncovered_by_reason(sheets[0])
    if missing:
        print("not covered on these sheets:")
        for reason, ids in missing.items():
            print(f"  {', '.join(ids)}: {reason}")
    return 0


def _audit_line(sheet, folder: Path) -> str:
    a = sheet.audit
    return (f"{folder}: {sheet.kind} sheet, seed {sheet.seed}, {len(sheet.asked)} cells to {sheet.decimals} decimals; "
            f"audit passed on draw {a['draws']}: {len(a['covered'])} bugs each change an asked cell by more than "
            f"{a['margin']:g} and no two coincide ({', '.join(a['covered'])})")


def _check_key(sheet, where: str) -> None:
    """The lesson's own computation of the sheet must give numbers: a sheet whose values overflow float64 (q and k
    of 1e300) has an infinite or NaN key, against which no answer can be judged (and an answer's "-inf" would
    match an infinite score). Masked scaled scores alone are −∞."""
    import numpy as np

    from .bugs import run
    for path, table in run(sheet).items():
        masked = np.isneginf(table) if path.endswith("scaled_scores") else np.zeros(table.shape, dtype=bool)
        if not (np.isfinite(table) | masked).all():
            raise UsageError(f"{where}: {path}: the lesson's computation of this sheet gives inf or NaN (numbers "
                             "beyond float64, or a 0/0): no answer can be judged against it")


def _check(args: argparse.Namespace) -> int:
    from .bugs import quiet
    from .check import check, parse_answers, report_text
    from .sheet import load_sheet, read_json_file
    try:
        sheet = load_sheet(args.exercise)
    except NotASheet:
        raise
    _check_key(sheet, args.exercise)
    answers = read_json_file(args.answers, "answers")
    with quiet():                       # a student's ±1e308 overflows the products that read it: inf, never right
        own = parse_answers(answers, sheet, args.answers)
        report = check(sheet, own)
    if args.json:
        print(json.dumps(report.as_json(), ensure_ascii=False))
    else:
        print(report_text(report, args.lang or sheet.lang))
    return 0
