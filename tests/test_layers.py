"""The import graph of statekit/ and kernel_ext/ against the layer table of docs/ARCHITECTURE.md:
no import circles, no import from a lower layer to a higher one, every module in exactly one row.

The table is parsed from the doc, so the doc and this test cannot disagree. Every import counts,
an import inside a function too: a lazy import is still a dependency, and hiding a circle behind
one only moves the failure from import time to run time."""
from __future__ import annotations

import ast
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
PACKAGES = ("statekit", "kernel_ext")

# KNOWN EXCEPTIONS: imports in files other engineers were editing when this test was written, each
# with the change that removes it. Empty this dict as they are fixed; the test fails on any other
# circle or upward import, and on an entry here that no longer exists.
KNOWN_EXCEPTIONS: dict = {
    # (importer, imported): why it is allowed for now, and the fix. Empty: every import follows the
    # layer table.
}


# ---------------------------------------------------------------------------------------- the graph
def project_modules() -> dict:
    """{dotted module name: file path} of every module of the project's packages."""
    out = {}
    for top in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    out[mod[: -len(".__init__")] if mod.endswith(".__init__") else mod] = path
    return out


def imports_of(module: str, source: str, is_package: bool, known) -> dict:
    """{imported project module: first line} for every import statement anywhere in ``source``.
    ``from pkg import name`` is an import of ``pkg.name`` when that is a module, else of ``pkg``;
    ``import a.b.c`` of the longest prefix that is a module. Importing a submodule is not counted
    as importing its package's ``__init__`` (Python runs it, but it is not a dependency the code
    states)."""
    found: dict = {}

    def add(name: str, line: int) -> None:
        parts = name.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        target = ".".join(parts)
        if parts and target != module:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            if prefix.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                full = f"{prefix}.{alias.name}"
                add(full if full in known else prefix, node.lineno)
    return found


def import_graph() -> dict:
    """{module: {imported module: line}} over the project."""
    modules = project_modules()
    graph = {}
    for mod, path in modules.items():
        with open(path, encoding="utf-8") as f:
            graph[mod] = imports_of(mod, f.read(), path.endswith("__init__.py"), modules)
    return graph


def circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


# ---------------------------------------------------------------------------------------- the table
def layer_table(text: str) -> list:
    """[(layer name, [path entries])], highest layer first, from the doc's first table."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("layer", "") or set(cells[0]) <= set("-: "):
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def entry_matches(entry: str, module: str) -> bool:
    path = module.replace(".", "/")
    if entry.endswith("/"):
        return (path + "/").startswith(entry)
    if entry.endswith("/__init__.py"):
        return path == entry[: -len("/__init__.py")]
    return entry.endswith(".py") and path == entry[:-3]


@pytest.fixture(scope="module")
def table():
    with open(DOC, encoding="utf-8") as f:
        rows = layer_table(f.read())
    assert len(rows) >= 5, f"no layer table at the top of {DOC}"
    return rows


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def layer_of(table) -> dict:
    """{module: row index} (0 = the highest layer); a module in no row or two is left out."""
    out = {}
    for mod in project_modules():
        rows = [i for i, (_, entries) in enumerate(table) for e in entries if entry_matches(e, mod)]
        if len(rows) == 1:
            out[mod] = rows[0]
    return out


# ---------------------------------------------------------------------------------------- the tests
def test_every_module_is_in_exactly_one_row_and_every_entry_names_a_module(table):
    problems = []
    for mod in project_modules():
        hits = [(name, e) for name, entries in table for e in entries if entry_matches(e, mod)]
        if len(hits) != 1:
            problems.append(f"{mod}: in {len(hits)} rows {hits}")
    for name, entries in table:
        for e in entries:
            if not any(entry_matches(e, m) for m in project_modules()):
                problems.append(f"row {name!r}: `{e}` names no module")
    assert problems == [], "fix the layer table of docs/ARCHITECTURE.md:\n" + "\n".join(problems)


def test_no_import_circles(graph):
    cut = {a: {b: ln for b, ln in targets.items() if (a, b) not in KNOWN_EXCEPTIONS}
           for a, targets in graph.items()}
    found = []
    for comp in circles(cut):
        edges = [f"  {a} -> {b} (line {cut[a][b]})" for a in comp for b in cut[a] if b in comp]
        found.append(" <-> ".join(comp) + "\n" + "\n".join(edges))
    assert found == [], ("import circles: move what both sides need into a module below them "
                         "both\n" + "\n".join(found))


def test_no_import_from_a_lower_layer_to_a_higher_one(graph, table):
    layers = layer_of(table)
    names = [name for name, _ in table]
    upward = []
    for a, targets in sorted(graph.items()):
        for b, line in sorted(targets.items()):
            if a in layers and b in layers and layers[b] < layers[a] and (a, b) not in KNOWN_EXCEPTIONS:
                upward.append(f"{a}:{line} ({names[layers[a]]}) imports {b} ({names[layers[b]]})")
    assert upward == [], ("imports from a lower layer to a higher one (docs/ARCHITECTURE.md's "
                          "table):\n" + "\n".join(upward))


def test_known_exceptions_still_exist(graph):
    """An exception whose import is gone must leave the list, or it would hide a new one."""
    stale = [f"{a} -> {b}" for a, b in KNOWN_EXCEPTIONS if b not in graph.get(a, {})]
    assert stale == [], "remove from KNOWN_EXCEPTIONS in tests/test_layers.py: " + ", ".join(stale)


def test_the_rows_between_the_client_and_the_facade_reach_the_broker_through_the_client(graph, table):
    names = [name for name, _ in table]
    top, bottom = names.index("façade"), names.index("Kafka client layer")
    layers = layer_of(table)
    direct = [f"{a}:{line} imports {b}" for a, targets in sorted(graph.items())
              for b, line in sorted(targets.items())
              if b.startswith("statekit.broker") and top < layers.get(a, -1) < bottom]
    assert direct == [], "use statekit.kafka (log_figures, credentials_for):\n" + "\n".join(direct)


def test_the_library_never_imports_ipython_or_ipywidgets():
    found = []
    for mod, path in project_modules().items():
        if not mod.startswith("statekit"):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{mod}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("IPython", "ipywidgets")]
    assert found == []


# ---------------------------------------------------------------------------------------- the sizes
APP_CLASS_MAX_LINES = 500     # the App is a façade: its jobs live in statekit/runtime's parts
MODULE_MAX_LINES = 900


def test_the_app_class_is_a_facade():
    path = os.path.join(ROOT, "statekit", "app.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    (app,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "App"]
    lines = app.end_lineno - app.lineno + 1
    assert lines <= APP_CLASS_MAX_LINES, (f"class App is {lines} lines (at most {APP_CLASS_MAX_LINES}): "
                                          f"give the new job to a part in statekit/runtime/")
    methods = {n.name for n in app.body if isinstance(n, ast.FunctionDef)}
    assert "__getattr__" not in methods, "App declares what it offers: no __getattr__ forwarding"


def test_no_module_is_too_long():
    long = []
    for mod, path in sorted(project_modules().items()):
        with open(path, encoding="utf-8") as f:
            n = len(f.read().splitlines())
        if n > MODULE_MAX_LINES:
            long.append(f"{mod}: {n} lines")
    assert long == [], f"modules over {MODULE_MAX_LINES} lines (split them by job):\n" + "\n".join(long)


# -------------------------------------------------------------------- the scanner itself can fail
def test_the_scanner_sees_lazy_relative_and_from_imports():
    known = {"statekit", "statekit.a", "statekit.b", "statekit.pkg", "statekit.pkg.c",
             "statekit.pkg.d"}
    src = (
        "import os\n"
        "from statekit import a\n"                  # a module of a package: statekit.a
        "from statekit.pkg import helper\n"         # a name of a package: statekit.pkg
        "def f():\n"
        "    from . import d\n"                     # lazy and relative: statekit.pkg.d
        "    import statekit.b.thing\n"             # longest module prefix: statekit.b
    )
    got = imports_of("statekit.pkg.c", src, False, known)
    assert got == {"statekit.a": 2, "statekit.pkg": 3, "statekit.pkg.d": 5, "statekit.b": 6}


def test_circles_are_found():
    g = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}, "e": {}}
    assert circles(g) == [["a", "b", "c"]]
    assert circles({"a": {"b": 1}, "b": {}}) == []


def test_the_table_is_parsed():
    text = ("intro\n\n| layer | module(s) | knows about |\n|---|---|---|\n"
            "| top | `x/`, `y.py` | things |\n| bottom | `z/__init__.py` | more |\n\nafter\n| no | `w/` | x |\n")
    assert layer_table(text) == [("top", ["x/", "y.py"]), ("bottom", ["z/__init__.py"])]
    assert entry_matches("statekit/engine/", "statekit.engine.spark.engine")
    assert entry_matches("statekit/__init__.py", "statekit")
    assert not entry_matches("statekit/__init__.py", "statekit.app")
    assert not entry_matches("statekit/eng/", "statekit.engine")


if __name__ == "__main__":  # print the graph's circles and upward imports, exceptions included
    g = import_graph()
    with open(DOC, encoding="utf-8") as fh:
        t = layer_table(fh.read())
    lay, names = layer_of(t), [n for n, _ in t]
    for c in circles(g):
        print("circle:", " <-> ".join(c))
    for a, targets in sorted(g.items()):
        for b, ln in sorted(targets.items()):
            if a in lay and b in lay and lay[b] < lay[a]:
                print(f"upward: {a}:{ln} ({names[lay[a]]}) -> {b} ({names[lay[b]]})")
    sys.exit(0)
