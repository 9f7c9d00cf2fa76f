"""The shape of the package: no import cycle anywhere in plugin/ (imports inside functions count: a lazy import
is still a dependency; imports only for type checkers do not), and the layers stay apart: the planner and the
record states touch no backend, the netfilter package imports nothing of the layers above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "plugin" / "cni_reaper"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str) -> set[str]:
    """The package's modules that `name` names in an import statement (a package means its __init__)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (base if node.level else node.module)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_graph_is_read():
    assert "cni_reaper.sweep" in GRAPH["cni_reaper.commands.delete"]
    assert "cni_reaper.netfilter.rules" in GRAPH["cni_reaper.plan"]
    assert "cni_reaper.cleanup" in GRAPH["cni_reaper.sweep"]  # a lazy import counts


def test_no_import_cycle():
    seen: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for dep in sorted(GRAPH[node]):
            if seen.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in seen:
                visit(dep, stack + [dep])
        seen[node] = 2

    for name in sorted(GRAPH):
        if name not in seen:
            visit(name, [name])


def closure(name: str) -> set[str]:
    out, todo = set(), [name]
    while todo:
        for dep in GRAPH[todo.pop()]:
            if dep not in out:
                out.add(dep)
                todo.append(dep)
    return out


@pytest.mark.parametrize("module,forbidden", [
    ("cni_reaper.plan", ("cni_reaper.netfilter.restore", "cni_reaper.netfilter.iptc_backend", "cni_reaper.store",
                         "cni_reaper.cleanup", "cni_reaper.sweep")),
    ("cni_reaper.states", ("cni_reaper.cleanup", "cni_reaper.sweep", "cni_reaper.plan", "cni_reaper.netfilter")),
    ("cni_reaper.netfilter.rules", ("cni_reaper.plan", "cni_reaper.cleanup", "cni_reaper.sweep")),
    ("cni_reaper.netfilter.interface", ("cni_reaper.plan", "cni_reaper.cleanup", "cni_reaper.sweep")),
    ("cni_reaper.cleanup", ("cni_reaper.sweep", "cni_reaper.store", "cni_reaper.commands")),
])
def test_layers(module, forbidden):
    assert not closure(module) & set(forbidden), closure(module) & set(forbidden)
