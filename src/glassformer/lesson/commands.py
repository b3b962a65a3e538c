"""`glassformer trace`, `glassformer lesson` and `glassformer verify`: the lesson wing's commands."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
import unicodedata

import numpy as np
import torch

from .. import limits
from ..errors import UsageError
from ..threads import LESSON_THREADS
from ..validation import load_json
from . import claims
from . import examples as ex
from .spec import SpecError, run_spec
from .views import lesson_batch

# ---- trace -------------------------------------------------------------------------------------


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC.json", help="trace-spec v1 file ('-' reads standard input)")
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="write the JSON here instead of standard output (whole or not at all: an earlier FILE "
                             "stays as it was when the writing fails)")
    parser.add_argument("--indent", type=int, default=None, metavar="N",
                        help=f"pretty-print with N spaces, 0..{limits.MAX_JSON_INDENT} (default: one compact line)")


def read_spec(path: str) -> object:
    """Parse a spec file (or stdin for '-'): size, encoding, JSON and nesting problems are one SpecError line."""
    where = "stdin" if path == "-" else path
    with (open(sys.stdin.fileno(), "rb", closefd=False) if path == "-" else _opened(path)) as f:
        raw = f.read(limits.MAX_SPEC_FILE_BYTES + 1)
        if len(raw) > limits.MAX_SPEC_FILE_BYTES:
            info = os.fstat(f.fileno())
            size = info.st_size if stat.S_ISREG(info.st_mode) else len(raw)     # (a pipe: at least this much)
            limits.check(f"{where}: size in bytes", size, "MAX_SPEC_FILE_BYTES")
            raw += f.read()                                            # limits lifted (--no-limits)
    return load_json(raw, where, error_type=SpecError)


def _opened(path: str):
    """`path` open for reading without waiting at the open: a FIFO no one writes to reads as empty (one line then,
    not a hang); one that is written to, as /dev/stdin from a pipe, reads as usual."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)                                      # reads wait for a writer's data again
    return open(fd, "rb")


def write_output(path: str, text: str) -> None:
    """`text` into the file `path` (trace -o), whole or not at all: written to a temporary file in the same folder,
    then renamed over `path`, so a write that fails midway (a full disk, a file-size limit) leaves an earlier file
    as it was and no temporary one (it was truncated in place before). A symbolic link is followed (its target is
    replaced). Written in place: a path that is there but not a file (a FIFO, a device), one under /dev or /proc
    (/dev/stdout: an open file of this process), a file in a folder this process may not write. A failure is one
    line naming -o and `path`: UsageError (exit 2) when the file cannot be made there (no such folder, no
    permission, a folder), OSError (exit 1, as a full stdout) when the system refuses the writing."""
    target, temp = os.path.realpath(path), None
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        descriptor = any(p.startswith(("/dev/", "/proc/")) for p in (os.path.abspath(path), target))
        in_place = os.path.exists(path) and (descriptor or not os.path.isfile(path))
        folder, name = os.path.split(target)
        if not in_place:
            try:
                fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
            except PermissionError:
                if not os.access(target, os.W_OK):                  # (False too where there is no file yet)
                    raise
                in_place = True
        if in_place:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return
        try:
            mode = os.stat(target).st_mode & 0o7777                         # an earlier file keeps its mode
        except FileNotFoundError:
            mode = 0o666 & ~_umask()                                        # a new one gets open()'s
        os.chmod(temp, mode)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, target)
        temp = None
    except OSError as error:
        shown = path if path.isprintable() else json.dumps(path)            # one line whatever the name
        message = f"-o {shown}: {error.strerror or error}"
        if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            raise UsageError(message, "output") from None
        raise OSError(message) from None
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def trace_command(args: argparse.Namespace) -> int:
    if args.indent is not None and args.indent < 0:
        raise UsageError(f"--indent: expected N >= 0, got {args.indent}")
    if args.indent is not None:
        limits.check("--indent", args.indent, "MAX_JSON_INDENT", "indent")
    doc = read_spec(args.spec)
    torch.set_num_threads(LESSON_THREADS)
    try:
        result = run_spec(doc)
    except UsageError as error:                          # name the file, as the JSON errors do
        where = "stdin" if args.spec == "-" else args.spec
        raise type(error)(f"{where}: {error}", error.field) from None
    text = json.dumps(result, indent=args.indent, ensure_ascii=False, allow_nan=False)
    if args.output:
        write_output(args.output, text + "\n")
    else:
        print(text)
    return 0


# ---- lesson: the worked examples, computed ------------------------------------------------------

NINE_UNITS_SEED = 0
"""Seed of the untrained tiny encoder whose 9×9 tables `lesson` prints."""


def nine_unit_tables(seed: int = NINE_UNITS_SEED) -> list[np.ndarray]:
    """Layer-0 self-attention weights (one 9×9 table per head) of a seeded, untrained tiny encoder."""
    model = claims.seeded_model(seed)                                       # the checks' model
    with torch.no_grad(), model.probes("encoder.0.self_attention.head.*.weights") as rec:
        model.encode(claims.source_ids(ex.NINE_UNITS))
    return [t[0].numpy() for _, t in rec.items()]


def lesson_results() -> dict:
    """Every worked example of the lesson, computed by the model code, as plain JSON."""
    return {
        "exercise": {"q": [list(r) for r in ex.EXERCISE_Q], "k": [list(r) for r in ex.EXERCISE_K],
                     "v": [list(r) for r in ex.EXERCISE_V],
                     "unscaled": run_spec(ex.exercise_spec(scale=False)),
                     "scaled": run_spec(ex.exercise_spec(scale=True))},
        "block": run_spec(ex.block_spec()),
        "nine_units": {"units": list(ex.NINE_UNITS), "model": f"tiny encoder, seed {NINE_UNITS_SEED}, untrained",
                       "layer": 0, "weights": [t.tolist() for t in nine_unit_tables()]},
        "batch": lesson_batch().to_json(),                  # the same view as the lab's Masks
    }


def _width(text: str) -> int:
    """Columns a string takes in a terminal: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int, right: bool = True) -> str:
    space = " " * max(0, width - _width(text))
    return space + text if right else text + space


def table(title: str, values, rows=None, cols=None) -> str:
    """A fixed-width table: floats to 6 decimals, booleans as 1/0, None (masked) as '-inf'."""
    def cell(v) -> str:
        if v is None:
            return "-inf"
        if isinstance(v, (bool, np.bool_)):
            return "1" if v else "0"
        return f"{float(v):.6f}"
    grid = [[cell(v) for v in row] for row in values]
    rows = [str(r) for r in (rows or range(1, len(grid) + 1))]
    cols = [str(c) for c in (cols or range(1, len(grid[0]) + 1))]
    label_w = max(_width(r) for r in rows)
    col_w = max([_width(c) for c in cols] + [_width(v) for row in grid for v in row]) + 1
    lines = [title, _pad("", label_w, False) + " " + "".join(_pad(c, col_w) for c in cols)]
    for r, row in zip(rows, grid, strict=True):
        lines.append(_pad(r, label_w, False) + " " + "".join(_pad(v, col_w) for v in row))
    return "\n".join(lines)


def lesson_text(results: dict) -> str:
    """The lesson's worked examples as readable tables."""
    out = []
    e = results["exercise"]
    out.append("== The 2×3 exercise: two queries read three keys/values ==")
    out.append(table("Q", e["q"], cols=["d1", "d2"]))
    out.append(table("K (rows; the lesson prints Kᵀ)", e["k"], ["k1", "k2", "k3"], ["d1", "d2"]))
    out.append(table("V", e["v"], ["k1", "k2", "k3"], ["d1", "d2"]))
    for name, r in (("unscaled", e["unscaled"]), ("scaled by 1/√d_k, d_k = 2", e["scaled"])):
        keys = ["k1", "k2", "k3"]
        out.append(table(f"scores QKᵀ ({name})", r["scaled_scores"], ["q1", "q2"], keys))
        out.append(table(f"weights A = softmax over keys ({name})", r["weights"], ["q1", "q2"], keys))
        out.append(table(f"output AV ({name})", r["output"], ["q1", "q2"], ["d1", "d2"]))

    b = results["block"]
    pos = ["我", "给", "书"]
    out.append("== The BLOCK: 3 rows, d = 4, two heads, d_k = d_v = 2, post-norm, ε = 1e-5 ==")
    out.append(table("X", [list(r) for r in ex.X], pos))
    for h, head in enumerate(b["self_attention"]["heads"]):
        for key, label in (("q", "Q"), ("k", "K"), ("v", "V")):
            out.append(table(f"head {h + 1}: {label} = X W{label}{h + 1}", head[key], pos))
        out.append(table(f"head {h + 1}: scores QKᵀ", head["scores"], pos, pos))
        out.append(table(f"head {h + 1}: scaled scores QKᵀ/√2", head["scaled_scores"], pos, pos))
        out.append(table(f"head {h + 1}: weights (rows sum to 1)", head["weights"], pos, pos))
        out.append(table(f"head {h + 1}: output", head["output"], pos))
    s0, s1 = b["sublayers"]
    out += [table("concat (H1 | H2)", b["self_attention"]["concat"], pos),
            table("MHA = concat · W^O", b["self_attention"]["output"], pos),
            table("X + MHA", s0["residual"], pos),
            table("U = LN1(X + MHA)", s0["normed"], pos),
            table("FFN hidden ReLU(U W1)", b["ffn"]["hidden"], pos),
            table("FFN(U)", b["ffn"]["output"], pos),
            table("U + FFN(U)", s1["residual"], pos),
            table("Z = LN2(U + FFN(U))", b["output"], pos)]

    n = results["nine_units"]
    out.append(f"== 9×9 self-attention of 我／昨天／给／了／他／一／本／书／。 "
               f"({n['model']}: the pattern means nothing yet) ==")
    for h, w in enumerate(n["weights"]):
        out.append(table(f"layer 0, head {h + 1}: weights (query rows, key columns)", w, n["units"], n["units"]))

    m = results["batch"]
    out.append("== The two-sentence batch: masks (1 = may attend / counts, 0 = hidden) ==")
    out.append("\n".join(f"{name}: source {' '.join(m['source'][i])} | target input "
                         f"{' '.join(m['target_input'][i])} | labels {' '.join(m['labels'][i])}"
                         for i, name in enumerate("AB")))
    out.append(table("source keys visible (encoder and cross-attention)", [r[0] for r in m["encoder_self"]],
                     ["A", "B"], [str(j) for j in range(len(m["source"][0]))]))
    tgt_cols = [str(j) for j in range(len(m["causal"]))]
    out.append(table("causal 6×6 (query rows, key columns)", m["causal"], tgt_cols, tgt_cols))
    for i, name in enumerate("AB"):
        out.append(table(f"causal AND key padding, sample {name}", m["decoder_self"][i], m["target_input"][i],
                         m["target_input"][i]))
    out.append(table("loss mask (labels that count)", m["loss_mask"], ["A", "B"], tgt_cols))
    out.append(f"loss terms: A {m['loss_terms'][0]}, B {m['loss_terms'][1]}")
    return "\n\n".join(out)


def add_lesson_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def lesson_command(args: argparse.Namespace) -> int:
    torch.set_num_threads(LESSON_THREADS)
    results = lesson_results()
    if args.json:
        print(json.dumps(results, ensure_ascii=False, allow_nan=False))
    else:
        print(lesson_text(results))
    return 0


# ---- verify ---------------------------------------------------------------------------------


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="*", metavar="ID", help="only these claims (e.g. A4 B3); default all")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def verify_command(args: argparse.Namespace) -> int:
    unknown = [i for i in args.ids if i.upper() not in claims.CHECKS]
    if unknown:
        raise UsageError(f"unknown claim ID {unknown[0]!r} (known: {', '.join(claims.CHECKS)})")
    torch.set_num_threads(LESSON_THREADS)
    rows = [claims.run_check(i.upper()) for i in args.ids] if args.ids else claims.run_all()
    if args.json:
        print(json.dumps(claims.as_json(rows), ensure_ascii=False, allow_nan=False))
    else:
        print(claims.as_text(rows))
    return 0 if all(m.passed for m in rows) else 1
