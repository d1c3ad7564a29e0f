"""The DNS server's configuration is the ``dns`` settings copied field by field
(DnsConfig.from_settings): every setting reaches the server under its name or its one
renaming, and the values arrive as the old hand-written copy made them."""

from __future__ import annotations

import dataclasses

from kubeport.components import dns_config
from kubeport.config import DnsSettings, KubeportConfiguration
from kubeport.dns.config import NOT_SERVER_SETTINGS, SETTING_FIELDS, DnsConfig


def test_every_setting_has_a_server_field():
    fields = {f.name for f in dataclasses.fields(DnsConfig)}
    for name in DnsSettings.model_fields:
        if name not in NOT_SERVER_SETTINGS:
            assert SETTING_FIELDS.get(name, name) in fields, name


def test_settings_reach_the_server():
    config = KubeportConfiguration(dns=DnsSettings(
        cluster_domain="Example.Org.", addresses=["10.0.0.53"], port=5353, upstreams=["10.1.1.1", "[fd00::1]:5300"],
        ttl=30, pods="verified", endpoint_pod_names=True, namespaces=["a", "b"], noendpoints=True,
        ignore_empty_service=True, labels="app=web", namespace_labels="env in (a,b)", autopath=True,
        reverse_zones=["10.0.0.0/8"], fallthrough=["."], cache_size=10, cache_max_ttl="90s",
        cache_max_denial_ttl="45s", serve_stale="1h", serve_stale_refresh_mode="verify", prefetch=3,
        prefetch_duration="2m", prefetch_percentage=20, lame_duck="1s", forward_expire="3s",
        max_concurrent_forwards=7))
    dns = dns_config(config)
    assert dns == DnsConfig(
        zone="example.org", ttl=30, pods="verified", endpoint_pod_names=True, namespaces=("a", "b"),
        noendpoints=True, ignore_empty_service=True, labels="app=web", namespace_labels="env in (a,b)",
        autopath=True, reverse_zones=("10.0.0.0/8",), fallthrough=(".",),
        upstreams=(("10.1.1.1", 53), ("fd00::1", 5300)), addresses=("10.0.0.53",), port=5353, cache_size=10,
        cache_max_ttl=90, cache_max_negative_ttl=45, serve_stale=3600.0, serve_stale_refresh="verify",
        prefetch=3, prefetch_duration=120.0, prefetch_percentage=20, upstream_expire=3.0,
        max_concurrent_forwards=7)
    assert isinstance(dns.cache_max_ttl, int) and dns.upstreams is not None


def test_no_upstreams_means_the_hosts():
    assert dns_config(KubeportConfiguration()).upstreams is None
