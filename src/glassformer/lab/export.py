"""`glassformer lab --export FILE`: the whole lab as one self-contained HTML file that works from file://.

CSS and JS are inlined; every view's data is embedded as JSON. Switches that would need the server
use precomputed results: for the BLOCK (and the 2×3 exercise) every combination of heads switched off,
norm placement, scaling and mask; for the sentence, the original and the 我↔他 swap, positions on
and off. Running your own trace spec or sentence needs the server and is disabled in the copy.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from ..lesson import examples
from .api import DEFAULT_SOURCE, DEFAULT_TARGET, LabAPI, lesson_text
from .server import STATIC_DIR

MASKS = ("none", "causal", "padding")
OFFLINE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "img-src data:; base-uri 'none'; form-action 'none'")
SCRIPT_TAG = re.compile(r'<script src="([^"<>]+)" defer></script>\n?')   # how index.html loads a script
VIEWS_DIR = "views/"                 # where the view files are: inlined together, as one script element


def with_toggles(spec: dict, disabled: tuple[int, ...], norm: str, scale: bool, mask: str) -> dict:
    """The spec the page sends for a set of switches (mirrors `withToggles` in views/block.js)."""
    doc = json.loads(json.dumps(spec))
    doc["scale"] = scale
    if doc["kind"] != "attention":
        doc["norm"] = norm
        if disabled:
            doc["disabled_heads"] = sorted(disabled)
        else:
            doc.pop("disabled_heads", None)
    n = len(doc["k"]) if doc["kind"] == "attention" else len(doc["x"])
    if mask in ("none", "causal"):
        doc["mask"] = mask
        doc.pop("key_padding", None)
    elif mask == "padding":
        doc["mask"] = "none"
        doc["key_padding"] = [i == n - 1 for i in range(n)]
    return doc


def variant_key(disabled: tuple[int, ...], norm: str, scale: bool, mask: str) -> str:
    """Same key as `variantKey` in views/block.js: "0,1|post|1|none"."""
    return f"{','.join(str(h) for h in sorted(disabled))}|{norm}|{1 if scale else 0}|{mask}"


def block_variants(api: LabAPI, spec: dict) -> dict[str, dict]:
    """Every switch combination of one spec, run through /api/trace's function."""
    heads = 0 if spec["kind"] == "attention" else len(spec["self_attention"]["heads"])
    if heads <= 4:
        subsets = [c for r in range(heads + 1) for c in itertools.combinations(range(heads), r)]
    else:
        subsets = [(), *((h,) for h in range(heads))]
    norms = ("post", "pre") if heads else ("post",)
    out = {}
    for disabled, norm, scale, mask in itertools.product(subsets, norms, (True, False), MASKS):
        out[variant_key(disabled, norm, scale, mask)] = api.trace(with_toggles(spec, disabled, norm, scale, mask))
    return out


def swapped_source(units: list[str]) -> str | None:
    """The source with the two units of examples.SWAP_PAIR exchanged, joined by ／ (as the page builds it)."""
    a, b = examples.SWAP_PAIR
    if a not in units or b not in units:
        return None
    i, j = units.index(a), units.index(b)
    swapped = list(units)
    swapped[i], swapped[j] = b, a
    return examples.in_units(swapped)


def export_data(api: LabAPI) -> dict:
    """Everything the four views show, computed once."""
    block = api.block()
    sentence = {}
    source = lesson_text(DEFAULT_SOURCE, api.lab_model.source)
    for positions in (True, False):
        flag = 1 if positions else 0
        original = api.sentence({"source": source, "target": DEFAULT_TARGET, "positions": positions})
        sentence[f"{flag}|0"] = original
        swapped = swapped_source(original["source"])
        if swapped is not None:
            sentence[f"{flag}|1"] = api.sentence({"source": swapped, "target": DEFAULT_TARGET,
                                                   "positions": positions})
    return {
        "info": api.info(),
        "block": block,
        "block_variants": {"block": block_variants(api, block["spec"]),
                           "exercise": block_variants(api, block["exercise"])},
        "sentence": sentence,
        "masks": api.masks(),
        "verify": api.verify(),
    }


def _script_safe(text: str, what: str) -> str:
    if "</script" in text.lower() or "</style" in text.lower():
        raise ValueError(f"{what} contains a closing tag and cannot be inlined")
    return text


def _static_text(static: Path, name: str) -> str:
    path = (static / name).resolve()
    if not path.is_relative_to(static.resolve()):
        raise ValueError(f"index.html loads {name!r}, which is outside the static folder")
    return _script_safe(path.read_text(encoding="utf-8"), name)


def inline_scripts(page: str, static: Path, data: str) -> str:
    """Every `<script src=... defer>` of index.html replaced by the file's text, in the page's own order.

    The embedded data goes just before app.js (which reads it); the view files (views/*.js) share one
    script element, each marked with its name. Inline scripts run in document order, as deferred ones do,
    so index.html's order is kept as it is.
    """
    names = [match.group(1) for match in SCRIPT_TAG.finditer(page)]
    if len(re.findall(r"<script\b[^>]*\ssrc\s*=", page)) != len(names):
        raise ValueError("index.html loads a script in a form the export does not recognise")
    if "app.js" not in names:
        raise ValueError("index.html no longer loads app.js; the export cannot inline it")
    views = [name for name in names if name.startswith(VIEWS_DIR)]

    def inline(match: re.Match) -> str:
        name = match.group(1)
        if name in views:                              # all of them at the first one's place
            if name != views[0]:
                return ""
            joined = "\n".join(f"// {view}\n{_static_text(static, view)}" for view in views)
            return f"<script>\n{joined}\n</script>\n"
        script = f"<script>\n{_static_text(static, name)}\n</script>\n"
        return f"<script>window.LAB_EMBED = {data};</script>\n{script}" if name == "app.js" else script

    return SCRIPT_TAG.sub(inline, page)


def build_html(api: LabAPI, static_dir: str | Path = STATIC_DIR) -> str:
    """The page with its CSS, scripts and embedded data inlined (no external request at all)."""
    static = Path(static_dir)
    page = (static / "index.html").read_text(encoding="utf-8")
    css = _script_safe((static / "style.css").read_text(encoding="utf-8"), "style.css")
    data = json.dumps(export_data(api), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    data = data.replace("</", "<\\/").replace("<!--", "<\\!--")
    pieces = {
        '<meta charset="utf-8">':
            f'<meta charset="utf-8">\n<meta http-equiv="Content-Security-Policy" content="{OFFLINE_CSP}">',
        '<link rel="stylesheet" href="style.css">': f"<style>\n{css}\n</style>",
    }
    for old, new in pieces.items():
        if old not in page:
            raise ValueError(f"index.html no longer contains {old!r}; the export cannot inline it")
        page = page.replace(old, new)
    return inline_scripts(page, static, data)


def write_export(api: LabAPI, path: str | Path) -> int:
    """Write the offline page to `path`; returns its size in bytes."""
    html = build_html(api).encode("utf-8")
    Path(path).write_bytes(html)
    return len(html)
