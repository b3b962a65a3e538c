"""Build the Chinese notebooks and their English twins from one source per chapter.

    python notebooks/build.py             write notebooks/zh/*.ipynb and notebooks/en/*.ipynb
    python notebooks/build.py --check     exit 1 if a notebook on disk differs from what its source gives
    python notebooks/build.py --picture   run chapter 1 and save its cell tagged `picture` as docs/notebooks.png

A source (notebooks/source/NN_name.py) is a Python file cut into cells by `# %%` lines:

    # %% md zh          a Markdown cell of the Chinese notebook; its lines start with "# "
    # %% md en          its English twin: must come right after the Chinese cell
    # %% setup          the shared first code cell: LANG = "zh" / "en", then source/common.py
    # %%                a code cell, the same in both notebooks
    # %% tag:NAME       a code cell carrying the cell tag NAME

Code is never written twice: both notebooks run the same code, and text that a figure shows in
words goes through `T(zh, en)` of the setup cell. The notebooks carry no outputs.
"""

from __future__ import annotations

import argparse
import base64
import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "source"
LANGS = ("zh", "en")
PICTURE = HERE.parent / "docs" / "notebooks.png"
_HEADER = re.compile(r"^# %%(?P<words>( \S+)*)\s*$")


class SourceError(ValueError):
    """A chapter source that breaks the format above; the message names the file and line."""


def chapters() -> list[Path]:
    """The chapter sources, in order (common.py is the shared setup cell, not a chapter)."""
    return sorted(p for p in SOURCE.glob("[0-9][0-9]_*.py"))


def _cells(path: Path) -> list[dict]:
    """The raw cells of a source: {kind: md|code|setup, lang, tags, lines, line}."""
    cells: list[dict] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        header = _HEADER.match(line)
        if header is None:
            if not cells:
                if line.strip():
                    raise SourceError(f"{path.name}:{number}: text before the first '# %%' line")
                continue
            cells[-1]["lines"].append(line)
            continue
        words = header["words"].split()
        cell = {"kind": "code", "lang": None, "tags": [], "lines": [], "line": number}
        for word in words:
            if word in ("md", "setup"):
                cell["kind"] = word
            elif word in LANGS:
                cell["lang"] = word
            elif word.startswith("tag:") and len(word) > 4:
                cell["tags"].append(word[4:])
            else:
                raise SourceError(f"{path.name}:{number}: unknown word {word!r} after '# %%'")
        if (cell["kind"] == "md") != (cell["lang"] is not None):
            raise SourceError(f"{path.name}:{number}: a Markdown cell names its language (zh or en), "
                              "and only a Markdown cell does")
        cells.append(cell)
    for cell in cells:
        while cell["lines"] and not cell["lines"][-1].strip():
            cell["lines"].pop()
    _check_pairs(path, cells)
    return cells


def _check_pairs(path: Path, cells: list[dict]) -> None:
    """Every Chinese Markdown cell is followed by its English twin, and no English cell stands alone."""
    i = 0
    while i < len(cells):
        cell = cells[i]
        if cell["kind"] != "md":
            i += 1
            continue
        twin = cells[i + 1] if i + 1 < len(cells) else None
        if cell["lang"] != "zh" or twin is None or twin["kind"] != "md" or twin["lang"] != "en":
            raise SourceError(f"{path.name}:{cell['line']}: a '# %% md zh' cell must be followed directly by "
                              "its '# %% md en' twin")
        for c in (cell, twin):
            if not any(line.strip() for line in c["lines"]):
                raise SourceError(f"{path.name}:{c['line']}: empty Markdown cell")
        i += 2


def _markdown(lines: list[str], path: Path, line: int) -> str:
    out = []
    for k, text in enumerate(lines):
        if text == "#":
            out.append("")
        elif text.startswith("# "):
            out.append(text[2:])
        else:
            raise SourceError(f"{path.name}:{line + 1 + k}: a Markdown line starts with '# ' (or is '#')")
    return "\n".join(out)


def setup_code(lang: str) -> str:
    common = (SOURCE / "common.py").read_text(encoding="utf-8").strip()
    return f'LANG = "{lang}"  # "zh": 中文, "en": English\n' + common


def build(path: Path, lang: str) -> nbformat.NotebookNode:
    """The notebook of one chapter source in one language, without outputs."""
    cells = []
    for raw in _cells(path):
        if raw["kind"] == "md":
            if raw["lang"] != lang:
                continue
            cell = new_markdown_cell(_markdown(raw["lines"], path, raw["line"]))
        elif raw["kind"] == "setup":
            cell = new_code_cell(setup_code(lang))
        else:
            cell = new_code_cell("\n".join(raw["lines"]))
        if raw["tags"]:
            cell.metadata["tags"] = raw["tags"]
        cell.id = f"{path.stem}-{len(cells):02d}"                 # stable ids keep diffs small
        cells.append(cell)
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["glassformer"] = {"language": lang, "source": f"source/{path.name}"}
    nbformat.validate(nb)
    return nb


def text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb).rstrip("\n") + "\n"


def target(path: Path, lang: str) -> Path:
    return HERE / lang / f"{path.stem}.ipynb"


def write_all() -> list[Path]:
    written = []
    for path in chapters():
        for lang in LANGS:
            out = target(path, lang)
            out.parent.mkdir(exist_ok=True)
            out.write_text(text(build(path, lang)), encoding="utf-8")
            written.append(out)
    return written


def stale() -> list[str]:
    """Notebooks on disk that differ from their source, are missing, or have no source."""
    problems = []
    expected = set()
    for path in chapters():
        for lang in LANGS:
            out = target(path, lang)
            expected.add(out)
            if not out.exists():
                problems.append(f"{out.relative_to(HERE)}: missing")
            elif out.read_text(encoding="utf-8") != text(build(path, lang)):
                problems.append(f"{out.relative_to(HERE)}: differs from source/{path.name}")
    for lang in LANGS:
        for out in sorted((HERE / lang).glob("*.ipynb")):
            if out not in expected:
                problems.append(f"{out.relative_to(HERE)}: no source/{out.stem}.py")
    return problems


def picture(out: Path = PICTURE) -> Path:
    """Execute chapter 1 (Chinese) and save the PNG of its cell tagged `picture`."""
    from nbclient import NotebookClient

    nb = build(chapters()[0], "zh")
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(HERE / "zh")}}).execute()
    for cell in nb.cells:
        if "picture" in cell.metadata.get("tags", []):
            for output in cell.get("outputs", []):
                png = output.get("data", {}).get("image/png")
                if png:
                    out.write_bytes(base64.b64decode(png))
                    return out
    raise SystemExit("no cell tagged 'picture' drew a PNG")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the notebooks from notebooks/source/.")
    parser.add_argument("--check", action="store_true", help="only check that the notebooks match their source")
    parser.add_argument("--picture", action="store_true", help="also render docs/notebooks.png from chapter 1")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale()
            for p in problems:
                print(p, file=sys.stderr)
            if problems:
                print("run: python notebooks/build.py", file=sys.stderr)
            return 1 if problems else 0
        for out in write_all():
            print(out.relative_to(HERE.parent))
        if args.picture:
            print(picture().relative_to(HERE.parent))
    except SourceError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
