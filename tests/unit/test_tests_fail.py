"""The tests themselves can fail: none of them swallows a failure (issue 40).

Read from the tests' source with `ast`: a handler that catches everything (bare `except`,
`Exception`, `BaseException`) or a failed assertion (`AssertionError`) must raise again, and
`contextlib.suppress` may name only the one error a clean-up expects (`NotFound`, say), never
those. A failure collected to be raised later is allowed where named below, with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROAD = frozenset({"Exception", "BaseException", "AssertionError"})

#: Handlers that keep a failure to raise it later, by (file, function): why each is not a swallow.
DEFERRED = {
    # A watch callback's failed check is kept and raised by MemberWatch.check() in the test.
    ("tests/e2e/memberwatch.py", "_record"),
}


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"BaseException"}  # a bare except
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Name):
        return {node.id}
    return set()


def _swallows(tree: ast.AST, relative: str) -> list[str]:
    found = []
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    owner = {id(child): f.name for f in functions for child in ast.walk(f)}
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ExceptHandler) and _names(node.type) & BROAD:
            reraises = any(isinstance(n, ast.Raise) for n in ast.walk(node))
            if not reraises and (relative, owner.get(id(node), "")) not in DEFERRED:
                found.append(f"{where}: except {sorted(_names(node.type) & BROAD)} without raise")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            caught = set().union(*(_names(a) for a in node.args)) if node.args else set()
            if called == "suppress" and caught & BROAD:
                found.append(f"{where}: suppress({', '.join(sorted(caught & BROAD))})")
    return found


def test_no_test_swallows_a_failure() -> None:
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        found += _swallows(ast.parse(path.read_text()), relative)
    assert found == []


def test_the_check_sees_what_it_forbids() -> None:
    source = """
import contextlib
def a():
    try:
        f()
    except Exception:
        pass
def b():
    with contextlib.suppress(AssertionError):
        f()
def c():
    try:
        f()
    except (NotFound, AssertionError) as exc:
        raise RuntimeError("named") from exc
def d():
    with contextlib.suppress(NotFound):
        f()
def e():
    try:
        f()
    except:
        log()
"""
    found = _swallows(ast.parse(source), "t.py")
    assert sorted(int(line.split(":")[1]) for line in found) == [6, 9, 22], found


def test_every_test_the_docs_name_for_a_claim_exists() -> None:
    """The table of claims and their tests (docs/develop/tests.md) names files and tests that exist."""
    page = (ROOT / "docs" / "develop" / "tests.md").read_text()
    start = page.index("## Claims and their tests")
    table = page[start : page.index("\n## ", start)]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 20
    for row in rows:
        named = re.findall(r"`([^`]+)`", row.split("|")[2])
        assert named, row
        path = None
        for ref in named:
            file, _, test = ref.partition("::")
            path = ROOT / "tests" / file if file else path
            assert path is not None and path.is_file(), ref
            if test:
                assert re.search(rf"^(async )?def {re.escape(test)}\(", path.read_text(), re.MULTILINE), ref
