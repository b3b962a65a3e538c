"""A sheet: a trace-spec v1 input a student can compute by hand, with the cells asked and their decimals.

`exercise.json` is the spec itself (so `glassformer trace exercise.json` works on it); what a spec
cannot hold (the seed, the decimals, the asked cells, the audit) is in `sheet.json` beside it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ... import limits
from ...errors import UsageError
from ...validation import load_json
from ..spec_schema import SpecError, validate_spec
from .files import read_regular

SHEET_VERSION = 1
KIND_OF_SPEC = {"attention": "attention", "encoder_block": "block"}
DEFAULT_DECIMALS = 4


class NotASheet(UsageError):
    """An exercise file that is not a sheet (a key, a decoder block, an oversized spec...)."""


@dataclass
class Sheet:
    doc: dict                       # the trace-spec v1 document (exercise.json)
    spec: dict                      # validate_spec(doc): defaults filled in, float64 arrays
    decimals: int = DEFAULT_DECIMALS
    asked: list[str] = field(default_factory=list)
    seed: int | None = None
    lang: str = "zh"
    audit: dict | None = None

    # -- what the computation reads --------------------------------------------------------------
    @property
    def kind(self) -> str:
        return KIND_OF_SPEC[self.spec["kind"]]

    @property
    def mask(self):
        """"none", "causal", or an (n, m) bool table (a mask table and/or key padding)."""
        mask, pad = self.spec["mask"], self.spec["key_padding"]
        if pad is None:
            return mask
        n, m = self.n_queries, self.n_keys
        if isinstance(mask, np.ndarray):
            visible = mask.copy()
        elif mask == "causal":
            visible = np.arange(m)[None, :] <= np.arange(n)[:, None]
        else:
            visible = np.ones((n, m), dtype=bool)
        return visible & ~pad[None, :]

    @property
    def has_mask(self) -> bool:
        mask = self.mask
        return not (isinstance(mask, str) and mask == "none") and not (isinstance(mask, np.ndarray) and mask.all())

    @property
    def n_queries(self) -> int:
        return (self.spec["q"] if self.kind == "attention" else self.spec["x"]).shape[0]

    @property
    def n_keys(self) -> int:
        return self.spec["k"].shape[0] if self.kind == "attention" else self.n_queries

    @property
    def d_model(self) -> int:
        return self.spec["q"].shape[1] if self.kind == "attention" else self.spec["x"].shape[1]

    @property
    def n_heads(self) -> int:
        return 1 if self.kind == "attention" else len(self.spec["self_attention"]["heads"])

    @property
    def norm(self) -> str | None:
        return self.spec.get("norm")

    @property
    def tolerance(self) -> float:
        """Half a unit in the last asked decimal: a number rounded to `decimals` is this close."""
        return 0.5 * 10.0 ** -self.decimals

    def __getattr__(self, name: str) -> Any:          # q, k, v, x, eps, ffn, layer_norms, disabled_heads
        spec = self.__dict__.get("spec")
        names = {"attention": "self_attention"}
        if spec is not None and names.get(name, name) in spec:
            return spec[names.get(name, name)]
        raise AttributeError(name)

    def digest(self) -> str:
        return spec_digest(self.doc)

    def meta(self) -> dict:
        """sheet.json."""
        return {"sheet": SHEET_VERSION, "seed": self.seed, "kind": self.kind, "norm": self.norm,
                "mask": self.mask if isinstance(self.mask, str) else "table", "decimals": self.decimals,
                "lang": self.lang, "asked": self.asked, "audit": self.audit, "exercise_sha256": self.digest()}


def spec_digest(doc: dict) -> str:
    text = json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def default_asked(sheet: Sheet) -> list[str]:
    """Every cell a student computes: the trace output's tables less the copies (a sub-layer's input,
    and the final cell that `output` repeats)."""
    from .bugs import cells
    copies = {"sublayers.0.input", "sublayers.1.input",
              "sublayers.1.normed" if sheet.norm == "post" else "sublayers.1.residual"}
    return [c.path for c in cells(sheet) if c.path not in copies]


def from_spec(doc: Any, where: str) -> Sheet:
    """A Sheet from a parsed exercise document; anything that is not a sheet is one NotASheet line."""
    if isinstance(doc, dict) and "version" in doc and "kind" not in doc and not ({"q", "x"} & set(doc)):
        raise NotASheet(f"{where}: not a sheet: it looks like a trace output (a key or answers), not an exercise")
    if isinstance(doc, dict) and ("scores" in doc or "sublayers" in doc) and not ({"q", "x"} & set(doc)):
        raise NotASheet(f"{where}: not a sheet: it is a trace output (a key or answers), not an exercise")
    if isinstance(doc, dict) and doc.get("kind") == "decoder_block":
        raise NotASheet(f"{where}: not a sheet: kind decoder_block (a sheet is an attention or encoder_block spec)")
    try:
        spec = validate_spec(doc)
    except SpecError as error:
        raise NotASheet(f"{where}: not a sheet: {error}", error.field) from None
    except limits.LimitError as error:                                  # the file named, as for MAX_SHEET_*
        raise limits.LimitError(f"{where}: {error}", error.field) from None
    sheet = Sheet(doc=doc, spec=spec)
    _check_sheet_sizes(sheet, where)
    return sheet


def _check_sheet_sizes(sheet: Sheet, where: str) -> None:
    """A sheet is computed by hand: its rows, widths and heads are small (limits MAX_SHEET_*)."""
    s = sheet.spec
    mats = {"q": s.get("q"), "k": s.get("k"), "v": s.get("v"), "x": s.get("x")}
    if sheet.kind == "block":
        limits.check(f"{where}: self_attention.heads: number of heads", sheet.n_heads, "MAX_SHEET_HEADS",
                     "self_attention.heads")
        mats["ffn.w_1"] = s["ffn"]["w_1"]
    for name, a in mats.items():
        if a is None:
            continue
        limits.check(f"{where}: {name}: rows", a.shape[0], "MAX_SHEET_ROWS", name)
        limits.check(f"{where}: {name}: columns", a.shape[1], "MAX_SHEET_WIDTH", name)


def read_json_file(path: str, what: str, *, error_type: type[UsageError] = UsageError) -> Any:
    """A regular JSON file of at most MAX_SHEET_FILE_BYTES (a FIFO or /dev/zero is refused before a byte is
    read), read as one UsageError line when anything is wrong."""
    return load_json(read_regular(path, "MAX_SHEET_FILE_BYTES", what), path, error_type=error_type)


def load_sheet(path: str) -> Sheet:
    """exercise.json and, when it is there, the sheet.json beside it (decimals, asked cells, audit)."""
    doc = read_json_file(path, "exercise")
    sheet = from_spec(doc, path)
    meta_path = Path(path).with_name("sheet.json")
    if not meta_path.is_file():
        sheet.asked = default_asked(sheet)
        return sheet
    meta = read_json_file(str(meta_path), "sheet")
    where = str(meta_path)
    if not isinstance(meta, dict) or meta.get("sheet") != SHEET_VERSION:
        raise NotASheet(f"{where}: not a sheet description (expected an object with \"sheet\": {SHEET_VERSION})")
    if meta.get("exercise_sha256") != sheet.digest():
        raise NotASheet(f"{where}: belongs to another exercise (exercise_sha256 differs from {path})")
    decimals = meta.get("decimals")
    if not isinstance(decimals, int) or isinstance(decimals, bool) or not 0 <= decimals <= limits.MAX_SHEET_DECIMALS:
        raise NotASheet(f"{where}: decimals: expected an integer 0..{limits.MAX_SHEET_DECIMALS}, got {decimals!r}")
    known = set(default_asked(sheet)) | {"sublayers.0.input", "sublayers.1.input", "sublayers.1.normed",
                                          "sublayers.1.residual"}
    asked = meta.get("asked")
    if not isinstance(asked, list) or not asked or not all(isinstance(a, str) and a in known for a in asked):
        raise NotASheet(f"{where}: asked: expected a non-empty list of this sheet's cell paths")
    sheet.decimals, sheet.asked = decimals, asked
    sheet.seed = meta.get("seed") if isinstance(meta.get("seed"), int) else None
    sheet.lang = meta.get("lang") if meta.get("lang") in ("zh", "en") else "zh"
    sheet.audit = meta.get("audit") if isinstance(meta.get("audit"), dict) else None
    return sheet
