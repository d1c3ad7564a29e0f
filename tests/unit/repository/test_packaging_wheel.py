"""The wheel a user installs holds every module of the tree, under the import names the
tree maps them to (pyproject's package-dir: ``endpoints/`` -> ``kubeport.endpoints``).

The wheel is built by pip from a copy of what ``git archive`` would give (the files the
build reads), the way a user's ``pip install .`` or the image's build makes it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# The tree's folders and the import package each installs as.
MAPPED = {"kubeport": "kubeport", "endpoints": "kubeport/endpoints", "proxy": "kubeport/proxy", "dns": "kubeport/dns"}
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", *MAPPED)


def tree_modules(repo: Path) -> set[str]:
    """Every .py file of the mapped folders, as the path it has inside the wheel."""
    found = set()
    for folder, package in MAPPED.items():
        for path in (repo / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            found.add(f"{package}/{path.relative_to(repo / folder).as_posix()}")
    return found


def wheel_modules(wheel: Path) -> set[str]:
    return {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the source copy it was built from)."""
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    # The build backend of the test venv (pyproject's test extra): no package index needed.
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(source)],
                           check=False, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    [wheel] = out.glob("kubeport-*.whl")
    return wheel, source


def test_wheel_holds_every_module_of_the_tree(built_wheel):
    wheel, source = built_wheel
    missing = sorted(tree_modules(source) - wheel_modules(wheel))
    assert not missing, f"{wheel.name} lacks {len(missing)} module(s) of the tree: {missing[:10]}"


def test_wheel_holds_nothing_but_the_tree(built_wheel):
    wheel, source = built_wheel
    extra = sorted(wheel_modules(wheel) - tree_modules(source))
    assert not extra, f"{wheel.name} has modules the tree does not: {extra[:10]}"


def test_every_package_folder_is_a_package():
    """A folder of modules without __init__.py would be left out of the wheel by the finder."""
    loose = sorted({path.parent.relative_to(REPO).as_posix()
                    for folder in MAPPED for path in (REPO / folder).rglob("*.py")
                    if "__pycache__" not in path.parts and not (path.parent / "__init__.py").exists()})
    assert not loose, f"folders of modules without __init__.py: {loose}"


def test_a_forgotten_subpackage_is_caught(tmp_path):
    """The comparison itself: a wheel missing one sub-package is reported."""
    source = tmp_path / "tree"
    (source / "endpoints" / "controllers").mkdir(parents=True)
    (source / "endpoints" / "__init__.py").write_text("")
    (source / "endpoints" / "controllers" / "__init__.py").write_text("")
    for folder in ("kubeport", "proxy", "dns"):
        (source / folder).mkdir()
        (source / folder / "__init__.py").write_text("")
    wheel = tmp_path / "kubeport-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("kubeport/__init__.py", "kubeport/endpoints/__init__.py",
                     "kubeport/proxy/__init__.py", "kubeport/dns/__init__.py"):
            archive.writestr(name, "")
    assert tree_modules(source) - wheel_modules(wheel) == {"kubeport/endpoints/controllers/__init__.py"}


def test_the_version_is_one_string():
    """pyproject.toml's version is the one kubeport.lib.version carries (`kubeport version`,
    coredns_build_info, the worker protocol and the last applied state's format)."""
    import tomllib

    from kubeport.lib.version import __version__

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert declared == __version__
