"""Bad input keeps the last good state (the running daemon): an object broken in any way,
before or during validation, or turned into a kind or API group kubeport does not read,
keeps its last good version, ClusterIP included, and a problem line names file, object and
field. Waits are on conditions with deadlines, never sleeps."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kubeport.endpoints.manifests.check import SKIPPED, check_manifests
from kubeport.endpoints.types import ServiceName

from support.manifests import WEB, Harness, endpoint_slice, manifests, running, service  # noqa: F401  (a fixture)

WEB_YAML = service() + "---\n" + endpoint_slice()
SERVICE_META = "metadata:\n  name: web\n  namespace: default\n"


def _service_only(edit: Callable[[str], str]) -> Callable[[str], str]:
    """``edit`` applied to the Service document only."""
    return lambda text: edit(service()) + "---\n" + endpoint_slice()


def _slice_only(edit: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: service() + "---\n" + edit(endpoint_slice())


BROKEN = [
    pytest.param(_service_only(lambda t: t.replace("apiVersion: v1", "apiVersion: v2")),
                 'web.yaml: Service "web": apiVersion "v2" is not supported for Service (use v1)',
                 id="service_api_version_v2"),
    pytest.param(_slice_only(lambda t: t.replace("discovery.k8s.io/v1", "discovery.k8s.io/v1beta1")),
                 'web.yaml: EndpointSlice "web-a": apiVersion "discovery.k8s.io/v1beta1" is not supported',
                 id="slice_api_version_v1beta1"),
    pytest.param(_service_only(lambda t: t.replace(SERVICE_META, "metadata: web\n")),
                 "web.yaml: document 1: Service: metadata: expected an object, got a string",
                 id="metadata_not_an_object"),
    pytest.param(_service_only(lambda t: t.replace("  name: web\n", "")),
                 "web.yaml: document 1: Service: metadata.name: Required value", id="name_removed"),
    pytest.param(_service_only(lambda t: t.replace("kind: Service", "kind: Servce")),
                 'web.yaml: Servce "web": no matches for kind "Servce" in version "v1"', id="kind_typo"),
    pytest.param(_slice_only(lambda t: t.replace("discovery.k8s.io/v1", "discovery.k8s.oi/v1")),
                 'web.yaml: EndpointSlice "web-a": last good version kept: document 2 declares it with apiVersion '
                 '"discovery.k8s.oi/v1", which kubeport does not read (it reads EndpointSlice from discovery.k8s.io/v1)',
                 id="group_typo"),
    pytest.param(_service_only(lambda t: t.replace("port: 80", "port: eighty")),
                 'web.yaml: Service "web": spec.ports[0].port: Input should be a valid integer', id="failed_validation"),
]


@pytest.mark.parametrize("broken, problem", BROKEN)
async def test_a_broken_object_keeps_its_last_good_version(manifests, broken, problem):
    harness = Harness(manifests)
    harness.write("web.yaml", WEB_YAML)
    async with running(harness):
        first = harness.state.snapshot
        cluster_ip = first.services[WEB].service.cluster_ips
        harness.write("web.yaml", broken(WEB_YAML))
        await harness.until(lambda: any(problem in line for line in harness.source.problems))
        assert harness.state.snapshot is first  # nothing deleted: no ClusterIP freed, no slice gone
        assert harness.registry.registry.service_cluster_ips() >= set(cluster_ip)
        # Fixed, with a change: applied, and the ClusterIP is the one it always had.
        harness.write("web.yaml", service(port=81) + "---\n" + endpoint_slice())
        await harness.until(lambda: harness.ports() == [81])
        assert harness.source.problems == []
        assert harness.state.snapshot.services[WEB].service.cluster_ips == cluster_ip


async def test_a_kind_typo_keeps_the_object_and_says_so(manifests):
    harness = Harness(manifests)
    harness.write("web.yaml", WEB_YAML)
    async with running(harness):
        harness.write("web.yaml", WEB_YAML.replace("kind: Service", "kind: Servce"))
        await harness.until(lambda: len(harness.source.problems) == 2)
        assert harness.source.problems == [
            'web.yaml: Servce "web": no matches for kind "Servce" in version "v1"',
            'web.yaml: Service "web": last good version kept: document 1 may declare it (see its problem)',
        ]


@pytest.mark.parametrize(
    "other",
    [
        pytest.param("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n", id="deployment_of_that_name"),
        pytest.param("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\n", id="configmap_of_that_name"),
    ],
)
async def test_a_removed_object_is_deleted_beside_other_kinds_of_its_name(manifests, other):
    """Only a document that may be the object keeps it: a Deployment named web does not keep
    the Service web the file no longer declares."""
    harness = Harness(manifests)
    harness.write("web.yaml", other + "---\n" + service() + "---\n" + service("api"))
    async with running(harness):
        harness.write("web.yaml", other + "---\n" + service("api"))
        await harness.until(lambda: WEB not in harness.state.snapshot.services)
        assert harness.source.problems == []


async def test_a_broken_document_keeps_only_what_it_may_be(manifests):
    """A Service without a name may be any Service the file dropped, not its slices."""
    harness = Harness(manifests)
    harness.write("web.yaml", WEB_YAML)
    async with running(harness):
        harness.write("web.yaml", service().replace("  name: web\n", ""))
        await harness.until(lambda: not harness.state.snapshot.services[WEB].slices)
        assert WEB in harness.state.snapshot.services


async def test_unknown_fields_are_warnings_while_they_last(manifests):
    harness = Harness(manifests)
    typo = WEB_YAML.replace("- addresses:", "- condition: {ready: false}\n  addresses:")
    harness.write("web.yaml", typo)
    async with running(harness):
        warning = 'web.yaml: EndpointSlice "web-a": warning: unknown field "endpoints[0].condition"'
        assert harness.source.problems == [warning]
        assert len(harness.state.snapshot.services[WEB].slices) == 1  # a warning, not a refusal
        # Another object of the file changes: the unchanged slice still has its warning.
        harness.write("web.yaml", typo.replace("port: 80", "port: 81"))
        await harness.until(lambda: harness.ports() == [81])
        assert harness.source.problems == [warning]
        harness.write("web.yaml", WEB_YAML)
        await harness.until(lambda: harness.source.problems == [])


def test_check_lists_skipped_objects(manifests):
    harness = Harness(manifests)
    harness.write("app.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\n"
                              "apiVersion: discovery.k8s.oi/v1\nkind: EndpointSlice\nmetadata: {name: web-a}\n---\n"
                              + service())
    result = check_manifests(manifests)
    assert result.problems == []
    assert result.skipped == [f"{manifests}/app.yaml: apps/v1 Deployment web: {SKIPPED}",
                              f"{manifests}/app.yaml: discovery.k8s.oi/v1 EndpointSlice web-a: {SKIPPED}"]
    assert ServiceName("default", "web") not in harness.state.snapshot.services  # check touches no daemon
