"""The notebooks: built from one source per chapter, committed without outputs, Chinese and English in step,
and every cell of every notebook runs top to bottom against the seeded untrained model.

The notebooks of a language run in one kernel (imports are paid once), the two languages side by side;
before each notebook the namespace is wiped and the working directory moved to the notebook's folder, so no
notebook can lean on another's variables.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import nbclient
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LANGS = ("zh", "en")
HAN = re.compile(r"[\u4e00-\u9fff]")
KERNEL = "glassformer-tests"
EXECUTION_LIMIT_S = 120        # the whole set; it takes well under a minute on a quiet machine


def _builder():
    spec = importlib.util.spec_from_file_location("notebook_build", NOTEBOOKS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _committed() -> list[Path]:
    return sorted(p for lang in LANGS for p in (NOTEBOOKS / lang).glob("*.ipynb"))


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def test_every_chapter_has_both_languages_and_matches_its_source():
    build = _builder()
    chapters = build.chapters()
    assert len(chapters) >= 4
    assert build.stale() == []
    names = {lang: sorted(p.name for p in (NOTEBOOKS / lang).glob("*.ipynb")) for lang in LANGS}
    assert names["zh"] == names["en"] == sorted(f"{c.stem}.ipynb" for c in chapters)


def test_a_notebook_edited_by_hand_is_reported_stale(tmp_path, monkeypatch):
    build = _builder()
    for lang in LANGS:
        (tmp_path / lang).mkdir()
        for path in (NOTEBOOKS / lang).glob("*.ipynb"):
            (tmp_path / lang / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(build, "HERE", tmp_path)
    assert build.stale() == []
    victim = tmp_path / "en" / f"{build.chapters()[0].stem}.ipynb"
    nb = json.loads(victim.read_text(encoding="utf-8"))
    nb["cells"][0]["source"] = "# edited only in English\n"
    victim.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [p.split(":")[0] for p in build.stale()] == [f"en/{victim.name}"]


def test_a_chinese_cell_without_its_english_twin_is_refused(tmp_path):
    build = _builder()
    source = tmp_path / "99_orphan.py"
    source.write_text("# %% md zh\n# 只有中文\n# %%\nx = 1\n", encoding="utf-8")
    with pytest.raises(build.SourceError, match="twin"):
        build.build(source, "en")


def test_committed_notebooks_carry_no_outputs():
    notebooks = _committed()
    assert notebooks
    for path in notebooks:
        for cell in _read(path).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [], f"{path.name}: a cell keeps its outputs"
                assert cell.execution_count is None, f"{path.name}: a cell keeps its execution count"


def test_twins_run_the_same_code_and_speak_their_language():
    for zh_path in sorted((NOTEBOOKS / "zh").glob("*.ipynb")):
        zh, en = _read(zh_path), _read(NOTEBOOKS / "en" / zh_path.name)
        assert [c.cell_type for c in zh.cells] == [c.cell_type for c in en.cells], zh_path.name
        for a, b in zip(zh.cells, en.cells, strict=True):
            if a.cell_type == "code":
                assert a.source.replace('LANG = "zh"', 'LANG = "en"', 1) == b.source, zh_path.name
            else:
                assert HAN.search(a.source), f"{zh_path.name}: a Chinese Markdown cell has no Chinese"
                prose = HAN.sub("", b.source)
                assert len(HAN.findall(b.source)) < len(re.findall(r"[A-Za-z]", prose)) / 4, \
                    f"{zh_path.name}: an English Markdown cell reads mostly Chinese"


async def _run_in_one_kernel(paths: list[Path], env: dict[str, str], kernels: Path, done: dict) -> None:
    """Run notebooks one after another in one kernel; each starts with an empty namespace in its own folder."""
    km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    await km.start_kernel(cwd=str(paths[0].parent), env={**os.environ, **env})
    try:
        for path in paths:
            nb = _read(path)
            fresh = nbformat.v4.new_code_cell(
                f"%reset -f\nimport os\nos.chdir({str(path.parent)!r})\n"
                "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}")
            nb.cells.insert(0, fresh)
            client = nbclient.NotebookClient(nb, km=km, timeout=EXECUTION_LIMIT_S, allow_errors=False)
            await client.async_execute()                              # the kernel stays up for the next one
            client.kc.stop_channels()
            done[path] = nb
    finally:
        await km.shutdown_kernel(now=True)


def _execute_all(paths: list[Path], env: dict[str, str], kernels: Path) -> tuple[dict[Path, object], float]:
    """Execute the notebooks, one kernel per folder (language), the kernels side by side.

    The kernel is this interpreter (a kernelspec of its own, so a `python3` kernel installed elsewhere for the
    user cannot stand in for the environment glassformer is installed in).
    """
    (kernels / KERNEL).mkdir(parents=True, exist_ok=True)
    (kernels / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "glassformer tests", "language": "python"}), encoding="utf-8")
    by_folder: dict[Path, list[Path]] = {}
    for path in paths:
        by_folder.setdefault(path.parent, []).append(path)
    done: dict[Path, object] = {}

    async def run_all():
        await asyncio.gather(*(_run_in_one_kernel(group, env, kernels, done) for group in by_folder.values()))

    start = time.perf_counter()
    asyncio.run(run_all())
    return done, time.perf_counter() - start


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    env = {"GLASSFORMER_MODEL": str(tmp_path_factory.mktemp("no_model") / "runs" / "default"),
           "OMP_NUM_THREADS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    return _execute_all(_committed(), env, tmp_path_factory.mktemp("kernels"))


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            out.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


@pytest.mark.slow
def test_every_notebook_runs_to_the_end_in_both_languages(executed):
    notebooks, seconds = executed
    assert set(notebooks) == set(_committed())
    assert seconds < EXECUTION_LIMIT_S
    for path, nb in notebooks.items():
        last = [c for c in nb.cells if c.cell_type == "code"][-1]
        assert last.execution_count is not None, f"{path.name}: the last cell did not run"
        figures = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
        assert figures >= 1, f"{path}: no figure drawn"


@pytest.mark.slow
def test_the_notebooks_show_the_lessons_numbers(executed):
    notebooks, _ = executed
    for lang in LANGS:
        block = _text(notebooks[NOTEBOOKS / lang / "01_block.ipynb"])
        for printed in ("0.422319 0.155362 0.422319", "1.266956 1.466087", "0.707107", "0.401112"):
            assert printed in block, (lang, printed)
        gaps = [float(g) for g in re.findall(r"(?:差|gap) (\d\.\de[-+]\d\d)", block)]
        assert len(gaps) == 8 and max(gaps) <= 5e-7, gaps
        masks = _text(notebooks[NOTEBOOKS / lang / "02_masks.ipynb"])
        assert "[6, 3] = 9" in masks
        pad_weights = re.search(r"(?:cross\)|cross）)[:：] (\S+) (\S+)", masks)
        assert pad_weights and float(pad_weights[1]) == float(pad_weights[2]) == 0.0
        positions = _text(notebooks[NOTEBOOKS / lang / "03_positions.ipynb"])
        off, on = (float(x) for x in re.findall(r"max \|H' − PH\| = (\S+)", positions))
        assert off < 1e-5 < 1e-2 < on
        off, on = (float(x) for x in re.findall(r"max \|S' − PSPᵀ\| = (\S+)", positions))
        assert off < 1e-5 < 1e-3 < on
        translator = _text(notebooks[NOTEBOOKS / lang / "04_translator.ipynb"])
        future = re.search(r"(?:之和|future positions).*?[:：] (\S+)", translator)
        assert future and float(future[1]) == 0.0                     # the triangle hides the future
        p_clean, p_corrupt = (float(x) for x in re.findall(r"p\(him \| .\) = (\S+)", translator))
        assert 0 < p_clean < 1 and 0 < p_corrupt < 1 and p_clean != p_corrupt
        everything = re.search(r"(?:恢复 |patched at once: )(-?\d+\.\d+)", translator)
        assert everything and abs(float(everything[1]) - 1) < 1e-3     # cross-attention is the only way in
        agree = re.search(r"lesson_patching.*?[:：] (\S+)", translator)
        assert agree and float(agree[1]) < 1e-2                        # the hand-written scan = the library's
        decoding = _text(notebooks[NOTEBOOKS / lang / "05_decoding.ipynb"])
        assert decoding.count("True") >= 2 and "False" not in decoding


@pytest.mark.slow
def test_the_attribution_chapter_checks_itself(executed):
    notebooks, _ = executed
    for lang in LANGS:
        text = _text(notebooks[NOTEBOOKS / lang / "06_attribution.ipynb"])
        gap = re.search(r"(?:最大相对差|largest relative gap) (\S+)", text)
        assert gap and float(gap[1]) < 0.05                            # integrated gradients are complete
        future = re.search(r"(?:之和|cannot see) (\S+)", text)
        assert future and float(future[1]) == 0.0                     # the triangle: exactly nothing flows
        flips = [float(x) for x in re.findall(r"\+ a\(her,him\)\| = (\S+)", text)]
        assert len(flips) == 2 and max(flips) < 1e-9                  # him vs her = −(her vs him), both methods
        lens = re.search(r"\|Δp\| = (\S+)", text)
        assert lens and float(lens[1]) < 1e-6                         # the last reading is the model's own
        decoding = notebooks[NOTEBOOKS / lang / "05_decoding.ipynb"]
        pictures = sum("image/png" in o.get("data", {}) for c in decoding.cells for o in c.get("outputs", []))
        assert pictures >= 2                                           # the cache and the beams


@pytest.mark.slow
def test_a_cell_that_raises_fails_the_run(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("raise ValueError('broken cell')")])
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="broken cell"):
        _execute_all([path], {}, tmp_path / "kernels")
