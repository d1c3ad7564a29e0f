"""The layout's rules, checked on the source: every module is named in docs/architecture.md,
and imports go the way that page says (the parts never import the shell or each other
sideways, kubeport/lib is a leaf, no private name crosses a package)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ARCHITECTURE = REPO / "docs" / "architecture.md"
#: repository folder -> the package it is installed as (pyproject's package-dir)
FOLDERS = {"kubeport": "kubeport", "endpoints": "kubeport.endpoints", "proxy": "kubeport.proxy", "dns": "kubeport.dns"}
PARTS = ("kubeport.endpoints", "kubeport.proxy", "kubeport.dns")
#: the leaf every part may import besides kubeport.lib
LEAVES = ("kubeport.lib",)
#: a line that opens the page's region of one folder: "### `proxy/` — ..." or "`proxy/relay/` — ..."
FOLDER_MARKER = re.compile(r"^(?:#+\s+)?`([a-z_/]+/)`")


def modules() -> list[Path]:
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and path.name != "__init__.py":
                found.append(path.relative_to(REPO))
    return found


def module_name(path: Path) -> str:
    folder, *rest = path.with_suffix("").parts
    return ".".join([FOLDERS[folder], *rest])


def regions(text: str) -> dict[str, str]:
    """Folder ("proxy/relay/") -> the page's text from its marker to the next one."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        marker = FOLDER_MARKER.match(line)
        if marker:
            current = found.setdefault(marker.group(1), [])
        if current is not None:
            current.append(line)
    return {folder: "\n".join(lines) for folder, lines in found.items()}


def unnamed(paths: list[Path], text: str) -> list[str]:
    """The modules the page names neither by their whole path nor in their folder's region."""
    by_folder = regions(text)
    missing = []
    for path in paths:
        whole = f"`{path.as_posix()}`"
        region = by_folder.get(path.parent.as_posix() + "/", "")
        if whole not in text and not re.search(rf"`{re.escape(path.name)}`", region):
            missing.append(path.as_posix())
    return missing


def test_every_module_is_named_in_the_architecture_page():
    missing = unnamed(modules(), ARCHITECTURE.read_text())
    assert not missing, f"docs/architecture.md does not name {len(missing)} module(s): {missing}"


@pytest.mark.parametrize(("page", "missing"), [
    ("### `proxy/` — x\n| `table.py` | t |\n", []),
    ("### `proxy/` — x\n| `tables.py` | t |\n", ["proxy/table.py"]),
    ("### `dns/` — x\n| `table.py` | t |\n", ["proxy/table.py"]),  # named, but in another folder's region
    ("see `proxy/table.py`\n", []),
])
def test_the_check_itself(page, missing):
    assert unnamed([Path("proxy/table.py")], page) == missing


def imports_of(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import of ``path``, lazy ones included."""
    tree = ast.parse((REPO / path).read_text(), str(path))
    package = module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def import_violations() -> list[str]:
    found = []
    for path in modules():
        own = module_name(path)
        own_part = next((part for part in PARTS if within(own, part)), None)
        for imported, names in imports_of(path):
            if not within(imported, "kubeport"):
                continue
            target_part = next((part for part in PARTS if within(imported, part)), None)
            if within(own, "kubeport.lib") and not within(imported, "kubeport.lib"):
                found.append(f"{path}: kubeport/lib is a leaf, imports {imported}")
            elif own_part is not None:
                if target_part is None and not any(within(imported, leaf) for leaf in LEAVES):
                    found.append(f"{path}: a part imports the shell's {imported}")
                elif target_part is not None and target_part != own_part and target_part != "kubeport.endpoints":
                    found.append(f"{path}: {own_part} imports {target_part} sideways ({imported})")
            # A private name is its package's own: a module beside it may use it, no other.
            private = [name for name in names if name.startswith("_") and not name.startswith("__")]
            if private and imported.rpartition(".")[0] != own.rpartition(".")[0]:
                found.append(f"{path}: imports the private {', '.join(private)} of {imported}")
    return found


def test_imports_go_one_way_and_no_private_name_crosses_a_package():
    violations = import_violations()
    assert not violations, "\n".join(violations)
