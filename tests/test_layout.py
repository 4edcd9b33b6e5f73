"""The house's layout, read from the source (no import runs): darknet_py's modules stand on
floors, each importing only from its own floor or lower ones; no import cycle, counting
the imports inside functions; layers never import a backend; no function over 100 lines.
A new module goes on a floor in FLOORS (the failure names it)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "darknet_py"
MAX_FUNCTION_LINES = 100

# Bottom to top. A name ending in ".*" covers a package's modules (the package's own
# __init__ too). A module may import from its floor and the floors below it.
FLOORS = [
    (
        "foundation",
        [
            "errors",
            "files",
            "processes",
            "cfg",
            "activations",
            "shapes",
            "draws",
            "optimizer",
            "adam",
            "image",
            "boxes",
            "tree",
            "names",
            "plots",
            "precision",
            "architectures",
            "plurals",
            "version",
        ],
    ),
    ("losses", ["losses.*"]),
    (
        "backend core",
        [
            "backends.errors",
            "backends.kernel_cache",
            "backends.kernel_signatures",
            "backends.prebuilt",
            "backends.cpu_threads",
            "backends.pinning",
            "backends.cuda_core",
            "backends.cuda_graph",
            "backends.cuda_transfer",
        ],
    ),
    ("ops", ["ops.*"]),
    ("backends", ["backends.*"]),
    ("layers", ["layers.*"]),
    (
        "model",
        [
            "data.*",
            "predictions",
            "fork_json",
            "weights",
            "graphs",
            "net_options",
            "delta_plan",
            "output_plan",
            "output_storage",
            "layout_plan",
            "network.*",
            "demo_data",
        ],
    ),
    (
        "applications",
        [
            "validate",
            "video",
            "bench",
            "distributed",
            "distributed.comm",
            "distributed.nccl",
            "distributed.data_parallel",
            "distributed.cluster",
            "distributed.buckets",
            "training.*",
            "train",
            "dataset_check",
            "map_plots",
            "export.*",
            "rnn_text",
        ],
    ),
    (
        "top",
        [
            "darknet_py",
            "__main__",
            "cli_options",
            "cli",
            "demo",
            "distributed.launcher",
            "darknet_forms",
        ],
    ),
]


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def floor_of(module):
    """(index, floor name) of a module; None where FLOORS does not place it."""
    short = module.removeprefix("darknet_py.") if module != "darknet_py" else module
    for index, (name, members) in enumerate(FLOORS):
        for member in members:
            if short == member or (
                member.endswith(".*") and (short == member[:-2] or short.startswith(member[:-1]))
            ):
                return index, name
    return None


def imported_modules(module):
    """The darknet_py modules `module` imports anywhere in its file (inside functions too),
    with the line of each import."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:  # a name inside a module
                target = target.rpartition(".")[0]
            if target in MODULES and target != module:
                found.append((target, node.lineno))
    return found


def test_every_module_stands_on_a_floor():
    unplaced = sorted(m for m in MODULES if floor_of(m) is None)
    assert not unplaced, f"put these modules on a floor in tests/test_layout.py FLOORS: {unplaced}"


def test_no_module_imports_from_a_higher_floor():
    wrong = []
    for module in sorted(MODULES):
        here = floor_of(module)
        for target, line in imported_modules(module):
            there = floor_of(target)
            if here and there and there[0] > here[0]:
                wrong.append(
                    f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {module} "
                    f"({here[1]}) imports {target} ({there[1]}), a higher floor"
                )
    assert not wrong, "\n".join(wrong)


def test_layers_never_import_a_backend():
    wrong = [
        f"{module} imports {target} (line {line})"
        for module in sorted(MODULES)
        if module.startswith("darknet_py.layers")
        for target, line in imported_modules(module)
        if target.startswith("darknet_py.backends")
    ]
    assert not wrong, "a layer calls the ops of the backend it is given: " + "; ".join(wrong)


def import_cycle(graph):
    """One cycle of the graph as a list of modules (first repeated last), or None."""
    state = {}  # module -> "open" while on the path, "done" after

    def visit(module, path):
        state[module] = "open"
        for target in graph[module]:
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_no_import_cycle():
    graph = {m: sorted({t for t, _ in imported_modules(m)}) for m in MODULES}
    cycle = import_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_no_function_is_over_100_lines():
    long = []
    for _module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                        f"{node.name} is {lines} lines"
                    )
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them into parts a "
        f"reader can hold):\n" + "\n".join(long)
    )
