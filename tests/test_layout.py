"""The house's floors: every import inside glassformer, found with `ast` (function-level and TYPE_CHECKING
imports included), must point to the same wing or one below it, and no modules may import each other in a
circle. The allowed order is written here, not derived from the code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "glassformer"

# Lowest first. A module may import its own wing and any wing listed before it, never one after it.
FLOORS: list[tuple[str, ...]] = [
    ("errors", "__init__"),             # __init__: the package's version only
    ("limits",),
    ("validation", "paths", "threads"),   # threads: the thread counts entry points set
    ("options",),                       # --model / --device / integer flags every command shares
    ("model",),
    ("inference",),                     # the speed layer over the model
    ("lesson",),
    ("data",),
    ("decoding",),
    ("training",),
    ("interpret",),
    ("interop",),
    ("lab",),
    ("cli", "train"),
]
RANK = {wing: floor for floor, wings in enumerate(FLOORS) for wing in wings}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def wing_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_graph() -> dict[str, set[str]]:
    """module -> the glassformer modules it imports (a name imported from a package counts as that
    package's module when there is one, else as the package)."""
    files = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    targets.add(sub if sub in files else target)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_finds_the_imports_it_should():
    graph = import_graph()
    assert "glassformer.model" in graph["glassformer.decoding.translator"]               # `from ..model import`
    assert "glassformer.data.checkpoint" in graph["glassformer.decoding.translator"]      # a function-level one
    assert "glassformer.limits" in graph["glassformer.interpret.attribution"]           # `from .. import limits`


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_planted_circle():
    graph = import_graph()
    graph["glassformer.model.masks"] = graph["glassformer.model.masks"] | {"glassformer.model.transformer"}
    assert any("glassformer.model.masks" in c for c in cycles(graph))


def test_every_module_has_a_floor():
    assert {wing_of(m) for m in import_graph()} <= set(RANK)


def test_no_wing_imports_one_above_it():
    upward = [f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
              if RANK[wing_of(b)] > RANK[wing_of(a)]]
    assert upward == []


@pytest.mark.parametrize("wing", ["model", "inference", "lesson", "data", "decoding", "training", "interpret",
                                  "interop", "lab"])
def test_each_wing_says_what_it_holds(wing):
    doc = ast.get_docstring(ast.parse((SRC / wing / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc.split()) >= 12


def test_no_module_over_400_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}


# ---- process-wide settings only where a program starts ----------------------------------------------------
# torch's thread count, the warnings filters and os.environ belong to the whole process: library code that
# changes them changes them for every caller. They may be set in a command function (`*_command`), a `main`,
# or one of these, each named with why it is a start (or a tool only starts use):
ENTRY_POINTS = {
    "training/loop.py:Trainer.__init__": "training's start (the thread count shared by DDP ranks)",
    "training/loop.py:train": "called only from train_command and the torchrun main: builds the Trainer",
    "training/runtime.py:compiled_step": "called only from Trainer.__init__: the inductor cache folder",
    "decoding/commands.py:_translator": "translate_command's and evaluate_command's start (--dtype, --compile)",
    "decoding/commands.py:_compile_cache": "called only from _translator: the inductor cache folder",
    "decoding/commands.py:_decoding_threads": "translate_command's and evaluate_command's thread count",
    "inference/compiler.py:use_compile_cache": "the one writer of TORCHINDUCTOR_CACHE_DIR, for entry points",
    "threads.py:use_threads": "a thread count given back on exit, for benchmark cases and tests",
    "decoding/workers.py:_serve": "a decoding worker process's start (one thread, the command's inductor cache)",
}
PROCESS_SETTERS = {"set_num_threads", "set_num_interop_threads", "filterwarnings", "simplefilter",
                   "resetwarnings", "putenv", "unsetenv"}
ENVIRON_WRITES = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def _is_environ(node: ast.AST) -> bool:
    """`os.environ` or a bare `environ`."""
    return ((isinstance(node, ast.Attribute) and node.attr == "environ") or
            (isinstance(node, ast.Name) and node.id == "environ"))


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def process_settings(tree: ast.AST, helpers: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(qualified function name, what) for every process-wide setting in `tree`, and every call of a function
    named in `helpers` by its bare name (as src imports them: `train(args)`, not `model.train()`); "<module>"
    when outside any function."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = [*scope, node.name]
        where = ".".join(scope) or "<module>"
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name in PROCESS_SETTERS or (isinstance(node.func, ast.Name) and name in helpers):
                found.append((where, f"{name}()"))
            elif (isinstance(node.func, ast.Attribute) and name in ENVIRON_WRITES
                  and _is_environ(node.func.value)):
                found.append((where, f"os.environ.{name}()"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
                found.append((where, "os.environ[...] write"))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, [])
    return found


def _entry_point(module: str, where: str) -> bool:
    last = where.rsplit(".", 1)[-1]
    return last.endswith("_command") or last == "main" or f"{module}:{where}" in ENTRY_POINTS


def test_process_wide_settings_only_at_entry_points():
    """No thread count, warnings filter or environment write in library code, and the allowed helpers that
    make one are themselves called only from entry points."""
    qualified = [key.split(":", 1)[1] for key in ENTRY_POINTS]
    helpers = frozenset(q.removesuffix(".__init__") for q in qualified)    # a class: its construction
    outside = [f"{module}:{where}: {what}"
               for path in sorted(SRC.rglob("*.py"))
               for module in [path.relative_to(SRC).as_posix()]
               for where, what in process_settings(ast.parse(path.read_text(encoding="utf-8")), helpers)
               if not _entry_point(module, where)]
    assert outside == []


def test_process_settings_finds_what_it_should():
    planted = ast.parse(
        "import os, warnings, torch\n"
        "def split_shares(args):\n"
        "    torch.set_num_threads(1)\n"
        "    os.environ['X'] = '1'\n"
        "    del os.environ['Y']\n"
        "    os.environ.setdefault('Z', '2')\n"
        "    warnings.simplefilter('ignore')\n"
        "    use_threads(2)\n"
        "    model.use_threads()\n"
        "def patch_command(args):\n"
        "    torch.set_num_threads(1)\n"
        "warnings.filterwarnings('ignore')\n"
        "x = os.environ.get('HOME')\n")
    found = process_settings(planted, frozenset({"use_threads"}))
    assert [w for w, _ in found] == ["split_shares"] * 6 + ["patch_command", "<module>"]
    assert [w for w, _ in found if not _entry_point("interpret/x.py", w)] == ["split_shares"] * 6 + ["<module>"]
