"""The house stays easy to change: no class over 250 lines and no function over 60 in `oospec_agents/` and
`integrations/` (argument parsers, which are declared tables of flags, excepted), and no module reads another
of our modules' private attributes. Read from the source with `ast`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "oospec_agents", ROOT / "integrations" / "langchain" / "langchain_oospec",
           ROOT / "integrations" / "llamaindex" / "llama_index"]
MAX_CLASS, MAX_FUNCTION = 250, 60
#: Functions that are declared tables: argparse parsers (one `add_argument` per flag).
PARSERS = {"add_parser", "build_parser", "_parser", "parser", "main_parser"}


def _files() -> list[Path]:
    return sorted(p for root in SOURCES for p in root.rglob("*.py") if "tests" not in p.parts)


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def _is_parser(fn: ast.FunctionDef) -> bool:
    """A function whose body is mostly `add_argument` calls: a declared table of flags."""
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in ("add_argument", "add_parser", "add_argument_group", "add_mutually_exclusive_group")]
    return fn.name in PARSERS or len(calls) * 3 >= _lines(fn)


def oversized() -> list[str]:
    out = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{node.lineno if hasattr(node, 'lineno') else 0}"
            if isinstance(node, ast.ClassDef) and _lines(node) > MAX_CLASS:
                out.append(f"{where} class {node.name}: {_lines(node)} lines")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _lines(node) > MAX_FUNCTION \
                    and not _is_parser(node):
                out.append(f"{where} def {node.name}: {_lines(node)} lines")
    return out



def private_reads() -> list[str]:
    """`x._name` where `x` is not `self`/`cls` and the attribute is ours (defined in our sources)."""
    ours = set()
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
                ours.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                ours.add(node.name)
    out = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "os"):
                continue
            if node.attr in ours:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_class_over_250_lines_and_no_function_over_60():
    assert oversized() == []


def test_no_module_reads_another_modules_private_attribute():
    assert private_reads() == []


def test_the_checks_find_what_they_look_for(tmp_path, monkeypatch):
    """The readers above are not vacuous: a long function and a private read are found."""
    src = tmp_path / "pkg"
    src.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    (src / "m.py").write_text(f"class A:\n    def __init__(self):\n        self._hidden = 1\n\n\ndef long():\n{body}\n"
                              "\n\ndef peek(a):\n    return a._hidden\n")
    monkeypatch.setattr(__import__(__name__), "SOURCES", [src])
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [o.split()[-3] for o in oversized()] == ["long:"]
    assert [r.split(": ", 1)[1] for r in private_reads()] == ["a._hidden"]
