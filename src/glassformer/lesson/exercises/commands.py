"""`glassformer exercise new ...` (sheets from seeds, audited) and `glassformer exercise check ...`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ... import limits
from ...errors import UsageError
from .sheet import NotASheet


def add_exercise_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = sub.add_parser("new", help="write sheets: exercise.json, key.json, worksheet.md/.html, moodle.xml",
                         description="Write a sheet per seed (numbers a student computes by hand) and print its "
                                     "audit: which mistakes it tells apart.")
    new.add_argument("--kind", choices=("attention", "block"), required=True,
                     help="attention: one head from Q, K, V (3×3); block: the lesson's BLOCK shape (3 rows, d=4, "
                          "two heads, LayerNorm, FFN)")
    new.add_argument("--norm", choices=("post", "pre"), default="post", help="block placement (default post)")
    new.add_argument("--mask", choices=("none", "causal"), default=None,
                     help="self-attention mask (default: causal for attention, none for block)")
    new.add_argument("--seed", type=int, default=0, help="the sheet's seed (default 0)")
    new.add_argument("--count", type=int, default=1,
                     help="a class set: COUNT sheets of seeds SEED, SEED+1, ... (one folder each, one key table)")
    new.add_argument("--out", required=True, metavar="DIR", help="folder to write")
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
    for p in (new, check):
        p.add_argument("--no-limits", action="store_true", default=argparse.SUPPRESS,
                       help="lift the work limits (docs/limits.md) for trusted local input")


def exercise_command(args: argparse.Namespace) -> int:
    if args.action == "new":
        return _new(args)
    return _check(args)


def _new(args: argparse.Namespace) -> int:
    from .generate import EPS, new_sheet, write_sheet
    from .render import key_table_csv, key_table_md, moodle_xml, uncovered_by_reason
    if args.count < 1:
        raise UsageError(f"--count: expected at least 1, got {args.count}")
    limits.check("--count: sheets", args.count, "MAX_SHEET_COUNT", "--count")
    if args.seed < 0 or args.seed + args.count - 1 > 2**32 - 1:
        raise UsageError(f"--seed: expected 0..{2**32 - 1} (with --count), got {args.seed}")
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


def _check(args: argparse.Namespace) -> int:
    from .check import check, parse_answers, report_text
    from .sheet import load_sheet, read_json_file
    try:
        sheet = load_sheet(args.exercise)
    except NotASheet:
        raise
    answers = read_json_file(args.answers, "answers")
    own = parse_answers(answers, sheet, args.answers)
    report = check(sheet, own)
    if args.json:
        print(json.dumps(report.as_json(), ensure_ascii=False))
    else:
        print(report_text(report, args.lang or sheet.lang))
    return 0
