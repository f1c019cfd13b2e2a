"""Imports run one way: no module of the package imports, at its top or inside a function, a module
that imports it back (directly or through others). Read from the source with `ast`, so a cycle that
only a late, function-level import closes is found too."""
from __future__ import annotations

import ast
from pathlib import Path

import oospec_agents

PACKAGE = Path(oospec_agents.__file__).parent


def _module(path: Path) -> str:
    parts = ("oospec_agents",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def _exists(name: str) -> bool:
    return _is_package(name) or (PACKAGE.parent / (name.replace(".", "/") + ".py")).exists()


def imports(path: Path) -> set[str]:
    """The package's modules that `path` imports, anywhere in it (typing-only imports too)."""
    me = _module(path)
    base = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` imports count too: they are a layering choice as well
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("oospec_agents")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                target = anchor + ("." + node.module if node.module else "")
            elif node.module and node.module.startswith("oospec_agents"):
                target = node.module
            else:
                continue
            subs = {f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")}
            out |= subs or {target}
            if subs and len(subs) < len(node.names):
                out.add(target)
    return {m for m in out if _exists(m) and m != me}


def graph() -> dict[str, set[str]]:
    return {_module(p): imports(p) for p in PACKAGE.rglob("*.py")}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of modules larger than one (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _without_package_inits(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's `__init__` re-exports what is below it; an edge from a submodule up to its own
    package's `__init__` is how Python runs it (the parent first), not a layering choice, so it is left out."""
    return {m: {t for t in ts if not (_is_package(t) and m.startswith(t + "."))} for m, ts in edges.items()}


def test_the_reader_finds_a_cycle_that_a_function_level_import_closes(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    found = cycles(_without_package_inits(graph()))
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_sidecar_hosts_are_imported_by_load_alone():
    edges = graph()
    users = sorted(m for m, ts in edges.items() if any(t.startswith("oospec_agents.sidecar.hosts") for t in ts)
                   and not m.startswith("oospec_agents.sidecar.hosts"))
    assert users == ["oospec_agents.sidecar.load"], users


def test_the_json_scanner_is_the_bottom_floor():
    if not _exists("oospec_agents.jsonscan"):
        return
    assert graph()["oospec_agents.jsonscan"] == set()
