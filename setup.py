"""The package list, found rather than written down.

pyproject.toml maps the repository's top-level folders into one import package
(``endpoints/`` installs as ``kubeport.endpoints``); setuptools' own ``packages.find`` cannot
follow such a mapping, so the sub-packages are found here, walking each mapped folder: a
hand-kept list silently ships a wheel without the sub-package it forgot. The unit test
``tests/unit/test_packaging_wheel.py`` builds the wheel and compares it with the tree.
"""

from setuptools import find_packages, setup

PACKAGE_DIRS = {
    "kubeport": "kubeport",
    "kubeport.endpoints": "endpoints",
    "kubeport.proxy": "proxy",
    "kubeport.dns": "dns",
}


def mapped_packages() -> list[str]:
    found = []
    for package, folder in PACKAGE_DIRS.items():
        found.append(package)
        found += [f"{package}.{sub}" for sub in find_packages(folder)]
    return sorted(set(found))


setup(packages=mapped_packages(), package_dir=PACKAGE_DIRS)
