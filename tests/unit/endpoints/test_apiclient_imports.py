"""kubernetes_asyncio is imported without its generated API classes and models (about 1,200
modules and tens of MiB of RSS the daemon never uses), and whole when that is not possible.
Each case runs in a fresh interpreter: an import is process-wide state."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import kubeport.endpoints.apiserver.client as apiclient
{prepare}
library = apiclient.auth_modules()
loaded = [name for name in sys.modules if name.startswith("kubernetes_asyncio")]
print(json.dumps({{
    "modules": len(loaded),
    "models": any(name.startswith("kubernetes_asyncio.client.models.") for name in loaded),
    "api_classes": any(name.startswith("kubernetes_asyncio.client.api.") for name in loaded),
    "api_client": "kubernetes_asyncio.client.api_client" in sys.modules,
    "usable": all(callable(x) for x in (library.Configuration, library.RESTClientObject,
                                         library.kube_config.load_kube_config,
                                         library.incluster_config.InClusterConfigLoader)),
}}))
"""

CASES = [
    # (what, set-up before auth_modules(), the models are loaded)
    ("bare: only the auth modules", "", False),
    ("already imported whole by someone else: used as it is", "import kubernetes_asyncio.client", True),
    ("the bare import fails: imported whole instead",
     "def broken():\n    raise ImportError('laid out differently')\napiclient._import_bare = broken", True),
]


@pytest.mark.parametrize(("what", "prepare", "models"), CASES, ids=[case[0] for case in CASES])
def test_auth_modules(what: str, prepare: str, models: bool) -> None:
    result = subprocess.run([sys.executable, "-c", PROBE.format(prepare=prepare)], capture_output=True,
                            text=True, timeout=120, check=True)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["usable"], what
    assert found["models"] is models and found["api_classes"] is models, (what, found)
    if not models:
        assert found["modules"] < 40, found
        assert not found["api_client"], found  # its imports (dateutil, multiprocessing.pool) too


def test_the_api_client_stand_in_builds_the_real_one() -> None:
    probe = """
import asyncio, kubeport.endpoints.apiserver.client as apiclient
library = apiclient.auth_modules()
async def main():
    client = library.kube_config.ApiClient(configuration=library.Configuration())
    print(type(client).__module__)
    await client.close()
asyncio.run(main())
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "kubernetes_asyncio.client.api_client"


SOURCE_PROBE = """
import json, sys
from kubeport import components
from kubeport.config import KubeportConfiguration
config = KubeportConfiguration.model_validate({config})
components.import_source_modules(config)
print(json.dumps({{"models": any(m.startswith("kubernetes_asyncio.client.models.") for m in sys.modules),
                  "loaded": sorted(m for m in ("kubeport.endpoints.apiserver.source",
                                               "kubeport.endpoints.manifests.source",
                                               "kubernetes_asyncio.config") if m in sys.modules)}}))
"""


@pytest.mark.parametrize(("config", "loaded"), [
    pytest.param("{}", ["kubeport.endpoints.manifests.source"], id="manifests"),
    pytest.param("{'clientConnection': {'kubeconfig': '/nonexistent'}}",
                 ["kubeport.endpoints.apiserver.source", "kubernetes_asyncio.config"], id="kubeconfig"),
])
def test_the_source_modules_imported_ahead_are_the_ones_it_uses_without_the_models(config, loaded):
    """What a start from the last applied state imports on a thread before building the source."""
    result = subprocess.run([sys.executable, "-c", SOURCE_PROBE.format(config=config)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found == {"models": False, "loaded": loaded}
