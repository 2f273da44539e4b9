"""hvd_lossy's modules import one another without a circle: the package reads top-down, and
any module can be imported first. The graph is read from the source (every import statement,
at module level and inside functions alike), so an import deferred into a function to dodge a
circle at load time still counts."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hvd_lossy"


def module_names():
    """Module name -> source path of every module of the package."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def is_extension(package, name, modules):
    """Whether `package.name` is a compiled module (hvd_lossy._C), which the graph leaves out."""
    folder = modules[package].parent
    return any(folder.glob(f"{name}.*.so")) or any(folder.glob(f"{name}.*.pyd"))


def with_parents(target, importer):
    """`target` and the packages above it that importing it runs, but for the importer's own
    (a package's __init__ importing its submodules is no circle)."""
    parts, mine = target.split("."), importer.split(".")
    return {target} | {".".join(parts[:i]) for i in range(1, len(parts))
                       if parts[:i] != mine[:i]}


def imported_modules(name, path, modules):
    """The package's modules that module `name` (at `path`) imports anywhere in its source,
    and the packages above them that the import runs. `from package import n` imports the
    submodule n where there is one, else a name of the package."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join(here + ([base] if base else []))
            targets = []
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules:
                    targets.append(sub)
                elif not (base in modules and is_extension(base, a.name, modules)):
                    targets.append(base)
        else:
            continue
        for target in targets:
            out.update(m for m in with_parents(target, name) if m in modules and m != name)
    return out


def import_graph():
    modules = module_names()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph):
    """A list of modules that import one another in a circle, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_imports_in_functions_and_relative_ones():
    graph = import_graph()
    assert "hvd_lossy.adaptive.controller" in graph["hvd_lossy.adaptive"]  # from .controller
    assert "hvd_lossy.backend" in graph["hvd_lossy.alltoall"]
    # only inside AdaptiveCompressor.from_config
    assert "hvd_lossy.adaptive.controller" in graph["hvd_lossy.adaptive.compressor"]
    assert "hvd_lossy" in graph["hvd_lossy.compressor"]  # from hvd_lossy import <a name>
    assert "hvd_lossy" in graph["hvd_lossy.alltoall"]  # ... and every import runs the package
    assert "hvd_lossy" not in graph["hvd_lossy._codec"]  # from . import _C: the extension
    assert "hvd_lossy.adaptive" not in graph["hvd_lossy.adaptive.controller"]  # its own package
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_of_the_package_imports_itself_back_through_others():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)
