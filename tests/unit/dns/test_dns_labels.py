"""CoreDNS `labels EXPRESSION`: only the Services the label selector matches are served
(plugin/kubernetes/setup.go `labels`, the informers' LabelSelector; the syntax is
k8s.io/apimachinery labels.Parse's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeport.dns.config import DnsConfig, DnsConfigError
from kubeport.dns.selectors import SelectorError, parse_selector

from support.api import namespace, service
from support.dns_answers import case, check, make_answerer
from support.zonetext import question, read_reply

LABELLED = [
    namespace("shop"),
    service("web", "shop", clusterIP="10.96.0.20", ports=[{"port": 80}]),
    service("cache", "shop", clusterIP="10.96.0.21", ports=[{"port": 80}]),
    service("legacy", "shop", clusterIP="10.96.0.22", ports=[{"port": 80}]),
]
LABELLED[1]["metadata"]["labels"] = {"app": "web", "tier": "front"}
LABELLED[2]["metadata"]["labels"] = {"app": "cache", "tier": "back"}


@pytest.mark.parametrize("text, labels, matches", [
    ("", {}, True),
    ("app=web", {"app": "web"}, True),
    ("app==web", {"app": "cache"}, False),
    ("app!=web", {}, True),  # != matches an object without the key
    ("app!=web", {"app": "web"}, False),
    ("tier in (front, back)", {"tier": "back"}, True),
    ("tier notin (front)", {}, True),
    ("tier notin (front)", {"tier": "front"}, False),
    ("app", {"app": ""}, True),
    ("!app", {"app": "x"}, False),
    ("app=web,tier in (front)", {"app": "web", "tier": "front"}, True),
    ("app=web,tier in (front)", {"app": "web", "tier": "back"}, False),
])
def test_label_selector(text, labels, matches) -> None:
    assert parse_selector(text).matches(labels) is matches


@pytest.mark.parametrize("text", ["app=web,", "tier in (a,)", "tier in a", "=web", "app=web)"])
def test_not_a_label_selector(text) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)
    with pytest.raises(DnsConfigError, match="DnsConfig.labels"):
        DnsConfig(upstreams=(), labels=text)


@pytest.mark.parametrize("c", [
    case("labels_serves_a_matching_service", "web.shop.svc.cluster.local.", "A",
         answer=["web.shop.svc.cluster.local. 5 IN A 10.96.0.20"], labels="tier in (front)"),
    case("labels_hides_a_service_that_does_not_match", "cache.shop.svc.cluster.local.", "A", "NXDOMAIN",
         labels="tier in (front)"),
    case("labels_hides_a_service_without_labels", "legacy.shop.svc.cluster.local.", "A", "NXDOMAIN",
         labels="tier"),
    case("not_equal_matches_a_service_without_the_label", "legacy.shop.svc.cluster.local.", "A",
         answer=["legacy.shop.svc.cluster.local. 5 IN A 10.96.0.22"], labels="app!=cache"),
])
def test_labels_option(c) -> None:
    check(make_answerer(LABELLED, **c.config), replace(c, config={}))


def test_labels_hides_the_ptr_of_a_service_that_does_not_match() -> None:
    answerer = make_answerer(LABELLED, labels="tier", fallthrough=())
    assert read_reply(answerer.answer(question("22.0.96.10.in-addr.arpa.", "PTR"))).rcode == "NXDOMAIN"
    assert read_reply(answerer.answer(question("20.0.96.10.in-addr.arpa.", "PTR"))).answer == (
        "20.0.96.10.in-addr.arpa. 5 IN PTR web.shop.svc.cluster.local.",)


async def test_a_reload_with_a_new_selector_rebuilds_the_index() -> None:
    from kubeport.dns.server import DnsServer

    from support.api import cluster_state

    server = DnsServer(DnsConfig(upstreams=(), addresses=("10.96.0.10",)))
    server.apply(cluster_state(LABELLED).commit())
    name = question("cache.shop.svc.cluster.local.")
    assert read_reply(server.answerer.answer(name)).rcode == "NOERROR"
    await server.reconfigure(server.config.with_changes(labels="tier=front"))
    assert read_reply(server.answerer.answer(name)).rcode == "NXDOMAIN"
    await server.reconfigure(server.config.with_changes(labels=""))
    assert read_reply(server.answerer.answer(name)).rcode == "NOERROR"


TEAMS = [
    {**namespace("shop"), "metadata": {"name": "shop", "labels": {"team": "a"}}},
    {**namespace("bank"), "metadata": {"name": "bank", "labels": {"team": "b"}}},
    service("web", "shop", clusterIP="10.96.0.20", ports=[{"port": 80}]),
    service("vault", "bank", clusterIP="10.96.0.30", ports=[{"port": 80}]),
]


@pytest.mark.parametrize("c", [
    case("namespace_labels_serves_a_matching_namespace", "web.shop.svc.cluster.local.", "A",
         answer=["web.shop.svc.cluster.local. 5 IN A 10.96.0.20"], namespace_labels="team=a"),
    case("namespace_labels_hides_the_services_of_the_others", "vault.bank.svc.cluster.local.", "A", "NXDOMAIN",
         namespace_labels="team=a"),
    case("namespace_labels_hides_the_namespace_itself", "bank.svc.cluster.local.", "A", "NXDOMAIN",
         namespace_labels="team=a"),
    case("namespace_labels_with_namespaces_serves_both", "web.shop.svc.cluster.local.", "A",
         answer=["web.shop.svc.cluster.local. 5 IN A 10.96.0.20"], namespace_labels="team in (a,b)",
         namespaces=("shop",)),
])
def test_namespace_labels_option(c) -> None:
    check(make_answerer(TEAMS, **c.config), replace(c, config={}))


async def test_a_namespace_relabelled_comes_into_view() -> None:
    from kubeport.dns.server import DnsServer
    from kubeport.endpoints import model

    from support.api import cluster_state

    state = cluster_state(TEAMS)
    server = DnsServer(DnsConfig(upstreams=(), addresses=("10.96.0.10",), namespace_labels="team=a"))
    server.apply(state.commit())
    name = question("vault.bank.svc.cluster.local.")
    assert read_reply(server.answerer.answer(name)).rcode == "NXDOMAIN"
    state.upsert(model.Namespace.model_validate({"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": "bank", "labels": {"team": "a"}}}))
    snapshot = state.commit()
    assert snapshot is not None and snapshot.namespace_labels["bank"] == (("team", "a"),)
    server.apply(snapshot)
    assert read_reply(server.answerer.answer(name)).rcode == "NOERROR"
