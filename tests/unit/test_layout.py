"""The layout stays what the docs say it is (docs/develop/packages.md): federation/ as packages by
concern, each with a docstring, every module named in the package map, few modules left at the top, no hub class.

The import rules between the packages are import-linter's (pyproject.toml); this test checks
what a linter of imports cannot: that the map people read matches the tree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FEDERATION = ROOT / "federation"
MOST_TOP_MODULES = 8
MOST_CLASS_LINES = 350


def _map_rows() -> dict[str, str]:
    """The package map: package folder (or "" for the top-level modules) -> its row."""
    page = (ROOT / "docs" / "develop" / "packages.md").read_text()
    table = page[page.index("## The packages of federation/") :]
    rows = {}
    for line in table.splitlines()[4:]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1].strip()
        match = re.fullmatch(r"`(?:federation/)?(\w*)/?`(?: \(modules\))?", first)
        assert match, f"package map row not understood: {line}"
        rows[match.group(1)] = line
    return rows


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__" and not p.stem.endswith(("_pb2", "_pb2_grpc"))}


def test_every_package_and_module_of_federation_is_on_the_package_map() -> None:
    rows = _map_rows()
    packages = {p.name for p in FEDERATION.iterdir() if (p / "__init__.py").exists()}
    assert set(rows) - {""} == packages
    for folder, row in rows.items():
        named = set(re.findall(r"`(\w+)`", row.split("|")[2]))
        modules = _modules(FEDERATION / folder)
        assert modules <= named, f"federation/{folder}: {sorted(modules - named)} missing from the package map"


def test_each_package_says_what_it_owns_and_what_it_may_import() -> None:
    for init in FEDERATION.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.splitlines()) >= 3, f"{init.parent.name}: no docstring saying what it owns"
    for init in FEDERATION.glob("*/__init__.py"):
        if init.parent.name == "agent":
            continue  # one feature, one contract (capacity.proto): its docstring says so
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc and "Must not import" in doc, init.parent.name


def test_few_modules_at_the_top_and_no_hub_class() -> None:
    assert len(_modules(FEDERATION)) <= MOST_TOP_MODULES
    big = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in [*FEDERATION.rglob("*.py"), *(ROOT / "vkprovider").rglob("*.py")]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and (node.end_lineno or node.lineno) - node.lineno > MOST_CLASS_LINES
    ]
    assert big == []
