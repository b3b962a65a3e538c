"""`glassformer lab --export FILE`: the whole lab as one self-contained HTML file that works from file://.

The trained translator travels inside: its bundle (lab/bundle.py: config, vocabularies, and the float32 weights
packed losslessly by pack_weights) comes last, and the engine (static/engine/*.js, static/live.js) is inlined as one
module script, so every view computes in the page — any sentence translated, walked, patched, attributed (gradients
by the engine's backward pass), read by the lens and ALTI+, the BLOCK's switches, a toy trained in the Train view.
The page's Web Worker (static/worker.js and the engine) travels as the text of one script element that the page
starts from a Blob URL. CSS and the classic scripts are inlined; a Content-Security-Policy forbids any network
access and eval (workers from blob: URLs only).
"""

from __future__ import annotations

import base64
import itertools
import json
import posixpath
import re
from pathlib import Path

from ..lesson import examples
from .api import PAGE_DTYPE, LabAPI
from .bundle import DTYPES, pack_weights
from .server import STATIC_DIR

MASKS = ("none", "causal", "padding")
OFFLINE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "img-src data:; worker-src blob:; base-uri 'none'; form-action 'none'")
SCRIPT_TAG = re.compile(r'<script src="([^"<>]+)" defer></script>\n?')   # how index.html loads a script
MODULE_TAG = re.compile(r'<script type="module" src="([^"<>]+)"></script>\n?')   # ... and its one module
VIEWS_DIR = "views/"                 # where the view files are: inlined together, as one script element
WORKER = "worker.js"                 # the page's Web Worker: inlined with the engine as a text/plain script element


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
    """What the page does not compute itself, computed once: the claims table, the masks batch, the BLOCK."""
    return {
        "info": api.info(),
        "block": api.block(),
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


IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"(\.{1,2}/[^"]+)";[ \t]*$', re.M)
EXPORT_FROM = re.compile(r'^export\s*\{([^}]*)\}\s*from\s*"(\.{1,2}/[^"]+)";[ \t]*$', re.M)
EXPORT_LIST = re.compile(r'^export\s*\{([^}]*)\};?[ \t]*$', re.M)
EXPORT_DECL = re.compile(r'^export\s+((?:async\s+)?function\*?|class|const|let|var)\s+([A-Za-z_$][\w$]*)', re.M)


def _names(listing: str) -> list[tuple[str, str]]:
    """`a, b as c` -> [(a, a), (b, c)]: (local name, exported name)."""
    pairs = []
    for item in (x.strip() for x in listing.split(",")):
        if item:
            local, _, alias = item.partition(" as ")
            pairs.append((local.strip(), (alias or local).strip()))
    return pairs


def module_script(static: Path, entry: str = "live.js") -> str:
    """The ES modules `entry` imports (and theirs), as one inline module script's text.

    Each module becomes a function scope that returns its exports (`const __m3 = (() => {...; return {...};})()`),
    in dependency order; `import {a, b as c} from "./x.js"` becomes `const {a, b: c} = __m1;`. Only this
    import and export subset is allowed (no default export, no dynamic import): anything else is an error.
    """
    order: list[str] = []
    texts: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in texts:
            return
        if name in path:
            raise ValueError(f"{name}: an import cycle ({' -> '.join((*path, name))}) cannot be inlined")
        text = _static_text(static, name)
        for bad in ("export default", "import(", "import.meta", "import *"):
            if bad in text:
                raise ValueError(f"{name}: `{bad}` cannot be inlined into the offline page")
        deps = [posixpath.normpath(posixpath.join(posixpath.dirname(name), m.group(2)))
                for pattern in (IMPORT, EXPORT_FROM) for m in pattern.finditer(text)]
        for dep in deps:
            visit(dep, (*path, name))
        texts[name] = text
        order.append(name)

    visit(entry, ())
    var = {name: f"__m{i}" for i, name in enumerate(order)}
    return "\n".join(_scoped_module(name, texts[name], var) for name in order)


def _scoped_module(name: str, text: str, var: dict[str, str]) -> str:
    """One module as `const __mN = (() => { body; return {exports}; })();` (its imports read earlier ones)."""
    here = posixpath.dirname(name)

    def target(m: re.Match) -> str:
        return var[posixpath.normpath(posixpath.join(here, m.group(2)))]

    def imported(m: re.Match) -> str:
        names = ", ".join(local if local == alias else f"{local}: {alias}" for local, alias in _names(m.group(1)))
        return f"const {{ {names} }} = {target(m)};"

    exports: list[str] = []
    for m in EXPORT_FROM.finditer(text):
        exports += [f"{alias}: {target(m)}.{local}" for local, alias in _names(m.group(1))]
    text = IMPORT.sub(imported, EXPORT_FROM.sub("", text))
    for m in EXPORT_LIST.finditer(text):
        exports += [f"{alias}: {local}" for local, alias in _names(m.group(1))]
    text = EXPORT_LIST.sub("", text)
    exports += [m.group(2) for m in EXPORT_DECL.finditer(text)]
    text = EXPORT_DECL.sub(lambda m: f"{m.group(1)} {m.group(2)}", text)
    if re.search(r"^\s*(import|export)\b", text, re.M):
        raise ValueError(f"{name}: an import or export form the offline page cannot inline")
    return f"// {name}\nconst {var[name]} = (() => {{\n{text}\nreturn {{ {', '.join(exports)} }};\n}})();"


def inline_scripts(page: str, static: Path, data: str) -> str:
    """Every `<script src=... defer>` of index.html replaced by the file's text, in the page's own order, and
    its one `<script type="module" src=...>` by the module and everything it imports (module_script), followed by
    the page's worker (worker.js and everything it imports) as the text of a `<script type="text/plain"
    id="lab-worker">`, which live.js starts from a Blob URL.

    The embedded data goes just before app.js (which reads it); the view files (views/*.js) share one
    script element, each marked with its name. Inline classic scripts run while the page is read, the module
    once it is read (as deferred ones do), before DOMContentLoaded, when app.js starts the views.
    """
    names = [match.group(1) for match in SCRIPT_TAG.finditer(page)]
    modules = [match.group(1) for match in MODULE_TAG.finditer(page)]
    if len(re.findall(r"<script\b[^>]*\ssrc\s*=", page)) != len(names) + len(modules) or len(modules) > 1:
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

    page = SCRIPT_TAG.sub(inline, page)

    def module(m: re.Match) -> str:
        worker = _script_safe(module_script(static, WORKER), WORKER)
        return (f'<script type="module">\n{_script_safe(module_script(static, m.group(1)), m.group(1))}\n</script>\n'
                f'<script type="text/plain" id="lab-worker">\n{worker}\n</script>\n')

    return MODULE_TAG.sub(module, page)


def _json_in_html(value) -> str:
    """JSON text safe inside a script element: no `<` at all (\\u003c within strings, where it only occurs)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def build_html(api: LabAPI, static_dir: str | Path = STATIC_DIR, dtype: str = PAGE_DTYPE) -> str:
    """The page with its CSS, scripts, embedded data and model inlined (no external request at all).

    The model comes last: its bundle without the weights (`<script type="application/json" id="lab-bundle"
    data-chars=N>`), then the weights, packed losslessly (lab/bundle.py pack_weights: about 0.96 of their bytes
    where base64 takes 4/3), in `<script type="text/plain" id="lab-weights" data-chars=N>`: a file cut short
    loses the end of the model first, and the page says so in one line (live.js)."""
    static = Path(static_dir)
    page = (static / "index.html").read_text(encoding="utf-8")
    css = _script_safe((static / "style.css").read_text(encoding="utf-8"), "style.css")
    data = json.dumps(export_data(api), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    data = data.replace("</", "<\\/").replace("<!--", "<\\!--")
    payload = api.page_payload(dtype)
    if "unsupported" in payload:
        raise ValueError(f"the offline page cannot hold this model: {payload['unsupported']}")
    bundle = payload["bundle"]                                    # its weights packed: lab/bundle.py pack_weights
    weights, packed = pack_weights(base64.b64decode(bundle["data"]), DTYPES[bundle["dtype"]].itemsize)
    payload = {**payload, "bundle": {**bundle, "data": "", "packed": packed}}
    model = _json_in_html(payload)
    units = len(model.encode("utf-16-le")) // 2                  # its length as the page counts (UTF-16 units)
    pieces = {
        '<meta charset="utf-8">':
            f'<meta charset="utf-8">\n<meta http-equiv="Content-Security-Policy" content="{OFFLINE_CSP}">',
        '<link rel="stylesheet" href="style.css">': f"<style>\n{css}\n</style>",
        "</body>":
            f'<script type="application/json" id="lab-bundle" data-chars="{units}">{model}</script>\n'
            f'<script type="text/plain" id="lab-weights" data-chars="{len(weights)}">{weights}</script>\n</body>',
    }
    for old, new in pieces.items():
        if old not in page:
            raise ValueError(f"index.html no longer contains {old!r}; the export cannot inline it")
        page = page.replace(old, new)
    return inline_scripts(page, static, data)


def write_export(api: LabAPI, path: str | Path, dtype: str = PAGE_DTYPE) -> int:
    """Write the offline page to `path`; returns its size in bytes."""
    html = build_html(api, dtype=dtype).encode("utf-8")
    Path(path).write_bytes(html)
    return len(html)
