"""The import graph of the gtopk_hvd package, from its source (no import is run).

    python scripts/dev/import_graph.py                 # Mermaid graph of the packages, then circles
    python scripts/dev/import_graph.py --modules       # one node per module instead
    python scripts/dev/import_graph.py --root OTHER    # another checkout's gtopk_hvd/
    python scripts/dev/import_graph.py --check         # exit 1 if a circle or a framework import
                                                   # in the neutral core is found
    python scripts/dev/import_graph.py --doc           # the package graph as docs/architecture.md
                                                   # holds it, between its two marker comments
    python scripts/dev/import_graph.py --write-doc     # rewrite that block of docs/architecture.md

tests/packaging/test_architecture.py holds docs/architecture.md's block to what `--doc` prints.

Every `import gtopk_hvd.x` / `from gtopk_hvd.x import y` of a module counts, wherever it is
(functions and `if TYPE_CHECKING:` blocks included: a circle of types is a circle of design).
A package node is a folder of gtopk_hvd/ (its modules together) or a top-level module.
The neutral core (gtopk_hvd/core, backend.py, density.py, compression.py,
gtopk_hvd/schemes, gtopk_hvd/sparsifiers, gtopk_hvd/reductions) must not import torch,
tensorflow, keras or horovod at module level.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

NEUTRAL = ("core", "schemes", "sparsifiers", "reductions", "backend", "density", "compression")
FRAMEWORKS = ("torch", "tensorflow", "keras", "tf_keras", "horovod")
DOC = Path("docs") / "architecture.md"
BEGIN = "<!-- import_graph.py --doc: begin (python scripts/dev/import_graph.py --write-doc) -->"
END = "<!-- import_graph.py --doc: end -->"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> tuple[set[str], list[str]]:
    """(gtopk_hvd modules imported, framework modules imported at module level)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, frameworks = set(), []
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if target.split(".")[0] in FRAMEWORKS and id(node) in top_level:
                frameworks.append(target)
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found, frameworks


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def report(graph: dict[str, set[str]], problems: list[str], n_modules: int, n_circles: int,
           modules: bool) -> str:
    """The Mermaid graph (of modules, or of packages), its counts and the problems found."""
    node = (lambda m: m) if modules else package_of
    edges = sorted({(node(a), node(b)) for a, targets in graph.items() for b in targets
                    if node(a) != node(b) and not node(b) == "gtopk_hvd"})
    lines = ["```mermaid", "flowchart TD"]
    lines += [f"    {a.replace('gtopk_hvd.', '')} --> {b.replace('gtopk_hvd.', '')}"
              for a, b in edges]
    lines += ["```", "", f"{n_modules} modules, {len(edges)} arrows between "
              f"{'modules' if modules else 'packages'}, {n_circles} circle(s) between modules"]
    lines += [f"- {problem}" for problem in problems]
    return "\n".join(lines)


def write_doc(path: Path, block: str) -> bool:
    """Replace the block between BEGIN and END in `path` (markers included); True if it changed."""
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        sys.exit(f"{path}: no block between {BEGIN!r} and {END!r} to rewrite")
    new = text[:start] + block + text[end + len(END):]
    if new != text:
        path.write_text(new)
    return new != text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the checkout whose gtopk_hvd/ to read (default: this one)")
    parser.add_argument("--modules", action="store_true", help="one node per module")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 on a circle between modules or a framework import in the "
                             "neutral core")
    parser.add_argument("--doc", action="store_true",
                        help=f"print the package graph as {DOC} holds it, between its markers")
    parser.add_argument("--write-doc", action="store_true",
                        help=f"rewrite the block between the markers in the root's {DOC}")
    arguments = parser.parse_args()
    if arguments.modules and (arguments.doc or arguments.write_doc):
        parser.error(f"{DOC} shows the package graph: --doc and --write-doc take no --modules")
    root = arguments.root / "gtopk_hvd"
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))
             if "bench" not in path.parts}
    known = set(paths)
    graph, problems = {}, []
    for name, path in paths.items():
        graph[name], frameworks = imports_of(path, name, known)
        if name.split(".")[1:2] and name.split(".")[1] in NEUTRAL and frameworks:
            problems.append(f"{name} imports {sorted(set(frameworks))} at module level")
    module_circles = circles(graph)
    problems += [f"circle: {' -> '.join(c)}" for c in module_circles]

    text = report(graph, problems, len(paths), len(module_circles), arguments.modules)
    if arguments.doc or arguments.write_doc:
        text = f"{BEGIN}\n{text}\n{END}"
    if arguments.write_doc:
        changed = write_doc(arguments.root / DOC, text)
        print(f"{DOC}: {'rewritten' if changed else 'already up to date'}")
    else:
        print(text)
    return 1 if arguments.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
