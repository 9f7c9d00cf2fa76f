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
    assert "cni_reaper.reap.engine" in GRAPH["cni_reaper.verbs.delete"]
    assert "cni_reaper.reap.netfilter.iptables.rules" in GRAPH["cni_reaper.reap.netfilter.iptables.plan"]
    assert "cni_reaper.reap.cleanup" in GRAPH["cni_reaper.reap.sweep"]  # a lazy import counts


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


def in_package(prefix: str) -> list[str]:
    return sorted(m for m in MODULES if m == prefix or m.startswith(prefix + "."))


# (package, what none of its modules may depend on, directly or through others)
LAYERS = [
    # the judgement, pure (issue 42): facts in, a verdict out; nothing of the host, the state or the protocol
    ("cni_reaper.judge", ("cni_reaper.cni", "cni_reaper.state", "cni_reaper.reap", "cni_reaper.verbs",
                          "cni_reaper.tools", "cni_reaper.wrap", "cni_reaper.log", "cni_reaper.files")),
    ("cni_reaper.cni", ("cni_reaper.verbs", "cni_reaper.state", "cni_reaper.reap", "cni_reaper.tools")),
    ("cni_reaper.state", ("cni_reaper.verbs", "cni_reaper.reap", "cni_reaper.tools", "cni_reaper.cni.shell")),
    ("cni_reaper.reap", ("cni_reaper.verbs", "cni_reaper.tools", "cni_reaper.cni.shell")),
    ("cni_reaper.reap.netfilter", ("cni_reaper.state", "cni_reaper.reap.sweep", "cni_reaper.reap.cleanup",
                                   "cni_reaper.reap.evidence")),
    ("cni_reaper.verbs", ("cni_reaper.tools", "cni_reaper.wrap")),
    ("cni_reaper.wrap", ("cni_reaper.tools",)),
    ("cni_reaper.reap.netfilter.iptables.plan", ("cni_reaper.reap.netfilter.iptables.restore",
                                                 "cni_reaper.reap.netfilter.iptables.iptc",
                                                 "cni_reaper.reap.netfilter.nftables.backend")),
    ("cni_reaper.reap.netfilter.nftables.plan", ("cni_reaper.reap.netfilter.nftables.backend",
                                                 "cni_reaper.reap.netfilter.iptables")),
]


def _hits(deps: set[str], forbidden: tuple[str, ...]) -> set[str]:
    return {d for d in deps if any(d == f or d.startswith(f + ".") for f in forbidden)}


@pytest.mark.parametrize("package,forbidden", LAYERS, ids=[p for p, _ in LAYERS])
def test_layers(package, forbidden):
    modules = in_package(package)
    assert modules, package
    bad = {m: _hits(closure(m), forbidden) for m in modules}
    assert not any(bad.values()), {m: sorted(v) for m, v in bad.items() if v}


def test_the_verbs_reach_the_pipeline_through_the_engine_alone():
    """Issue 42: every verb runs the one engine (reap/engine.py); besides it, a verb reads the host's identities
    at ADD, CHECK and DEL (reap/probes.py) and nothing else of reap/: no verb assembles a pass of its own."""
    reached = {d for m in in_package("cni_reaper.verbs") for d in GRAPH[m] if d.startswith("cni_reaper.reap")}
    assert reached == {"cni_reaper.reap.engine", "cni_reaper.reap.probes"}, reached


def test_the_commands_and_the_wrapper_reach_reap_through_the_same_two_modules():
    """Issue 42: a command of tools/ runs the engine (judging, cleaning, putting back, the scheduler's word) and
    reads the host through reap/probes.py, as the verbs do; wrap/ runs the verbs; neither assembles a piece of a
    pass. verbs/, tools/ and wrap/ together reach two modules of reap/."""
    reached = {d for m in in_package("cni_reaper.tools") for d in GRAPH[m] if d.startswith("cni_reaper.reap")}
    assert reached == {"cni_reaper.reap.engine", "cni_reaper.reap.probes"}, reached
    assert not {d for m in in_package("cni_reaper.wrap") for d in GRAPH[m] if d.startswith("cni_reaper.reap")}


def test_the_judge_imports_nothing_that_touches_the_kernel_or_files():
    """judge/ is facts in, a verdict out (issue 42): it imports only itself (and typing, for the checker)."""
    found = {}
    for m in in_package("cni_reaper.judge"):
        tree = ast.parse(MODULES[m].read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        bad = {x for x in names if x not in ("__future__", "typing") and not x.startswith("cni_reaper.judge")}
        if bad:
            found[m] = sorted(bad)
    assert len(in_package("cni_reaper.judge")) >= 4 and found == {}


def test_every_package_init_imports_nothing():
    """The hot path imports a sub-package's __init__ for every module in it: each is empty, but judge/'s, which
    holds the judgement's vocabulary (Verdict and the states: what every module of judge/ and every pass uses;
    one module less on every call) and imports nothing."""
    inits = [p for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE]
    assert inits
    assert [str(p) for p in inits if p.read_text().strip() and p.parent.name != "judge"] == []
    judge = ast.parse((PACKAGE / "judge" / "__init__.py").read_text())
    imports = [n for n in ast.walk(judge) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.dump(n) for n in imports if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")] == []


def _definitions():
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assert node.end_lineno is not None
                yield name, node, node.end_lineno - node.lineno + 1


def test_no_function_over_fifty_lines_and_no_class_over_two_hundred():
    """Small units (ruff's C901 keeps each under a McCabe complexity of 10)."""
    long_functions = [f"{m}.{n.name}: {size}" for m, n, size in _definitions()
                      if not isinstance(n, ast.ClassDef) and size > 50]
    long_classes = [f"{m}.{n.name}: {size}" for m, n, size in _definitions() if isinstance(n, ast.ClassDef) and size > 200]
    assert long_functions == [] and long_classes == []


def test_a_handful_of_modules_at_the_top_and_the_layers_as_packages():
    top = sorted(m for m in MODULES if m.count(".") == 1)
    packages = sorted(m for m, p in MODULES.items() if p.name == "__init__.py" and m.count(".") == 1)
    assert len(top) - len(packages) <= 9, top
    assert packages == ["cni_reaper.cni", "cni_reaper.judge", "cni_reaper.reap", "cni_reaper.state", "cni_reaper.tools",
                        "cni_reaper.verbs", "cni_reaper.wrap"]


# Issue 42: no function of plugin/ above a cyclomatic complexity of 12 as radon counts it (36 were at 13-15 on
# 7f8b570, 24 after the judge moved out; none now).
BOUND = 12


def _complexities() -> dict[str, int]:
    from radon.complexity import cc_visit

    out = {}
    for module, path in MODULES.items():
        for block in cc_visit(path.read_text()):
            for f in [block, *getattr(block, "methods", [])]:
                if not hasattr(f, "methods") or f is not block:  # functions and methods, not classes
                    out[f"{module}.{f.fullname}"] = f.complexity
    return out


def test_no_function_is_past_a_cyclomatic_complexity_of_12():
    found = _complexities()
    assert len(found) > 500  # every function and method of plugin/ was read
    over = {name: n for name, n in found.items() if n > BOUND}
    assert not over, f"split these (radon cc over {BOUND}): {over}"


def test_no_function_is_over_50_lines():
    long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, long


# One judgement of who holds what (issue 32, item 2): a record's state comes from reap/sweep.judge, and what it
# holds from the sweep's selection (sweep.holdings for undo); no other module asks evidence.py's record-level
# judgement or tests a state against HOLDING itself. (A life's own evidence, judge_life, is asked where a single
# life is the question: the DEL's earlier lives, the scheduler's word about one namespace.)
ONE_JUDGEMENT = ("judge_record", "HOLDING", "judge_entry", "judge_tombstone", "judge_left")
JUDGES = {"cni_reaper.reap.evidence", "cni_reaper.reap.sweep", "cni_reaper.judge", "cni_reaper.judge.life"}


def _names_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return names


def test_who_holds_what_is_judged_in_one_place():
    users = {m: sorted(_names_used(p) & set(ONE_JUDGEMENT)) for m, p in MODULES.items() if m not in JUDGES}
    assert {m: u for m, u in users.items() if u} == {}
    assert "HOLDING" in _names_used(MODULES["cni_reaper.reap.sweep"])  # the check reads what it is to catch


# Who holds an address or a reservation (issue 32, item 2) is answered by reap/claims.Holdings alone: the sweep,
# GC, orphans and a DEL's clean-up ask it through Claims, undo through Holdings.others_than. No other module reads
# host-local's reservations whole (NetworkDir.all) but two that find candidates the claims then judge, nor keeps
# tables of holders of its own.
HOLDINGS_TABLES = {"by_ip", "holder_ips", "unread_ips", "by_container", "holder_containers"}
READ_WHOLE = {"cni_reaper.reap.claims", "cni_reaper.reap.hostlocal",  # the holdings; host-local's own reader
              "cni_reaper.reap.orphans"}  # GC's reservations its runtime does not name: targets for the claims


def _all_calls(path: Path) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "all" and not n.args]


def test_who_holds_an_address_or_a_reservation_is_answered_in_one_place():
    tables = {m: sorted(_names_used(p) & HOLDINGS_TABLES) for m, p in MODULES.items() if m != "cni_reaper.reap.claims"}
    assert {m: t for m, t in tables.items() if t} == {}
    readers = {m: _all_calls(p) for m, p in MODULES.items() if m not in READ_WHOLE}
    assert {m: lines for m, lines in readers.items() if lines} == {}
    assert _all_calls(MODULES["cni_reaper.reap.claims"]) and "by_ip" in _names_used(MODULES["cni_reaper.reap.claims"])


def test_an_attachments_key_is_read_by_name_never_by_position():
    """(network, container ID, ifname) crosses modules as values.Key: `x.key.network`, never `x.key[0]`."""
    found = []
    for m, p in MODULES.items():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "key":
                found.append(f"{m}:{n.lineno}")
    assert found == []
    from cni_reaper.values import Key

    k = Key("nomad", "alloc-1", "eth0")
    assert (k.network, k.container_id, k.ifname, k.owner) == ("nomad", "alloc-1", "eth0", ("nomad", "alloc-1"))
    assert k == ("nomad", "alloc-1", "eth0") and hash(k) == hash(("nomad", "alloc-1", "eth0"))
    import copy
    import pickle

    for again in (copy.copy(k), copy.deepcopy(k), pickle.loads(pickle.dumps(k))):
        assert type(again) is Key and again == k and again.container_id == "alloc-1"
