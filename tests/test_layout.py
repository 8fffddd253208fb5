"""The house stays one a maintainer can hold: no source file over MAX_LINES lines, no
import circle among ctdsfs's modules, and no import that runs up the layers (imports
inside functions count: they only hide one; so do the format registry's importlib loads)."""

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "src" / "ctdsfs"
CHECKED = [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]
MAX_LINES = 800

# Files allowed over the limit for now (none: keep it so), each to be split soon.
# A file listed here that is already within the limit fails the test, so it cannot go stale.
SPLIT_PENDING = set()

# The layers, lowest first: a module imports its own layer and those below, never one above.
# Each is a set of module prefixes; the longest prefix that names a module decides its layer.
LAYERS = (
    {"ctdsfs", "ctdsfs.errors"},
    {"ctdsfs.container"},
    {"ctdsfs.io"},  # shared byte-level helpers: stores, buffers, CRC, journal, safe paths
    {"ctdsfs.remote"},  # S3 and HTTP: ranged reads, caches, the checks of every answer
    {"ctdsfs.formats"},  # the registry and one package per format family: pure codecs
    {"ctdsfs.sources"},  # the translating sources (directories, tables, columns, prefixes)
    {"ctdsfs.vfs"},  # POSIX semantics
    {"ctdsfs.fuse_adapter", "ctdsfs.fuse_workers", "ctdsfs.fsspec", "ctdsfs.dask_columns",
     "ctdsfs.xarray_backend", "ctdsfs.toolbox", "ctdsfs.blockmap"},  # the tops, side by side
    {"ctdsfs.mount"},
    {"ctdsfs.cli"},
)

# Circles allowed for now (none: keep it so), each as the sorted tuple of its modules.
# A listed circle that is gone fails the test.
CIRCLES_PENDING = set()


def line_count(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def test_no_source_file_is_over_the_limit():
    too_long = {str(p.relative_to(ROOT)): line_count(p) for p in CHECKED
                if line_count(p) > MAX_LINES}
    assert set(too_long) - SPLIT_PENDING == set(), too_long
    already_split = {name: line_count(ROOT / name) for name in SPLIT_PENDING - set(too_long)}
    assert already_split == {}, "within the limit now: take them out of SPLIT_PENDING"


def module_names():
    """{dotted module name: (path, is a package's __init__)} for every module of ctdsfs."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        names[".".join(parts[:-1] if package else parts)] = (path, package)
    return names


def registry_loads():
    """The modules the format registry loads with importlib: each ``Format(name, module)``."""
    tree = ast.parse((PACKAGE / "formats" / "__init__.py").read_text())
    return {f"ctdsfs.formats.{node.args[1].value}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Format"
            and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)}


def dynamic_imports(path):
    """The lines of ``path`` that load a module by a name computed at run time."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and (
                getattr(node.func, "attr", None) == "import_module"
                or getattr(node.func, "id", None) in ("import_module", "__import__"))]


def import_graph():
    """{module: the ctdsfs modules it imports anywhere in its text}. ``from P import N``
    names module P.N when there is one, else P. The registry imports each format it lists."""
    modules = module_names()
    graph = {"ctdsfs.formats": registry_loads()}
    for name, (path, package) in modules.items():
        here = name if package else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.add(submodule if submodule in modules else base)
        graph[name] = {t for t in targets | graph.get(name, set())
                       if t in modules and t != name}
    return graph


def layer(module):
    best = max((prefix for group in LAYERS for prefix in group
                if module == prefix or module.startswith(prefix + ".")), key=len)
    return next(i for i, group in enumerate(LAYERS) if best in group)


def circles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return set(found)


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert graph["ctdsfs.formats.multihdf5.container"] >= {"ctdsfs.formats.multihdf5.probe"}  # (it sees edges)
    found = circles(graph)
    assert found - CIRCLES_PENDING == set()
    assert CIRCLES_PENDING - found == set(), "gone now: take them out of CIRCLES_PENDING"


def test_no_import_runs_up_the_layers():
    graph = import_graph()
    assert graph["ctdsfs.formats"] >= {"ctdsfs.formats.tiledb.array"}  # (it sees the registry)
    upward = sorted(f"{source} -> {target}" for source, targets in graph.items()
                    for target in targets if layer(target) > layer(source))
    assert upward == []


def test_only_the_registry_loads_modules_by_computed_names():
    found = {str(p.relative_to(ROOT)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := dynamic_imports(p))}
    assert list(found) == ["src/ctdsfs/formats/__init__.py"], found


def test_no_private_name_is_imported_from_another_module():
    """A name with a leading underscore is its module's own: one another module needs is
    named as part of an interface."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                     .startswith("ctdsfs")):
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}"
                          for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set()}
    assert circles(graph) == {("a", "b", "c")}
