"""The package's stages and the imports between them, read from the source (nothing is imported).

    python3 -m tests.layers            # the stages floor by floor, each with what it imports
    python3 -m tests.layers --modules  # every module and the modules of the package it imports

A stage is a top-level module or subpackage of `cutlass_tune` (space, render, compile, ...).
An import inside a function is lazy: the optional or heavy dependencies (torch through bench,
the tuner's store reader behind the runtime's table loader, the compiler behind its `Gemm`) are
taken that way. Floors stack
each stage above everything it imports at module level; `tests/test_layers.py` holds the rules.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cutlass_tune"


@dataclasses.dataclass
class Graph:
    modules: dict[str, set[str]]
    """Module (dotted, without the package name) -> modules of the package it imports anywhere."""
    eager: dict[str, set[str]]
    """Stage -> stages it imports at module level (inside `if TYPE_CHECKING:` excluded)."""
    lazy: dict[str, set[str]]
    """Stage -> stages it imports inside a function."""
    lines: dict[str, int]

    def floors(self) -> list[list[str]]:
        """Stages by floor, the ground first. Raises graphlib.CycleError on a circle."""
        sorter = graphlib.TopologicalSorter({s: self.eager.get(s, set()) for s in self.lines})
        sorter.prepare()
        out = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready())
            out.append(ready)
            sorter.done(*ready)
        return out


TOP = "cutlass_tune"
"""The stage name of the package's own `__init__` (its public face)."""


def _stage(module: str, package: Path = PACKAGE) -> str:
    """The stage of a module: its first part where that is a module or subpackage, else the
    package's face (`from . import __version__`)."""
    first = module.split(".")[0]
    if first and ((package / first).is_dir() or (package / f"{first}.py").is_file()):
        return first
    return TOP


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_package: bool) -> list[str]:
    """The package's modules `node` (in `module`) imports, dotted without the package name."""
    if isinstance(node, ast.Import):
        return [a.name.removeprefix("cutlass_tune.") for a in node.names
                if a.name == "cutlass_tune" or a.name.startswith("cutlass_tune.")]
    if node.level == 0:
        if not (node.module or "").startswith("cutlass_tune"):
            return []
        base = node.module.removeprefix("cutlass_tune").lstrip(".")
    else:
        parts = module.split(".")
        parts = parts if is_package else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    if base:
        return [base]
    return [a.name for a in node.names]  # `from . import settings`


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def read_graph(package: Path = PACKAGE) -> Graph:
    modules: dict[str, set[str]] = {}
    eager: dict[str, set[str]] = {}
    lazy: dict[str, set[str]] = {}
    lines: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        module = module or TOP
        text = path.read_text()
        tree = ast.parse(text)
        stage = _stage(module)
        lines[stage] = lines.get(stage, 0) + len(text.splitlines())
        modules.setdefault(module, set())

        def visit(node: ast.AST, in_function: bool, stage: str = stage, module: str = module,
                  is_package: bool = is_package) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node):
                return
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _resolve(module if module != TOP else "", node, is_package):
                    modules[module].add(target)
                    other = _stage(target)
                    if other != stage:
                        (lazy if in_function else eager).setdefault(stage, set()).add(other)
            inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, inside)

        visit(tree, False)
    return Graph(modules, eager, lazy, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="the stages of cutlass_tune and their imports")
    parser.add_argument("--modules", action="store_true", help="every module and what it imports")
    args = parser.parse_args()
    graph = read_graph()
    if args.modules:
        for module, imported in sorted(graph.modules.items()):
            print(f"{module}: {', '.join(sorted(imported)) or '-'}")
        return
    for floor, stages in reversed(list(enumerate(graph.floors(), start=1))):
        for stage in stages:
            eager = sorted(graph.eager.get(stage, set()))
            lazy = sorted(graph.lazy.get(stage, set()) - set(eager))
            arrows = ", ".join(eager + [f"{s} (lazy)" for s in lazy]) or "-"
            print(f"floor {floor}  {stage:<12} {graph.lines[stage]:5d} lines  -> {arrows}")


if __name__ == "__main__":
    main()
