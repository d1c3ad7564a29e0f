"""What test_proxy_table.py and test_proxy_table_sources.py share: the node, two slices, the
rule summary and its words."""

from __future__ import annotations

from kubeport.proxy.table import TableContext

from support.slim import endpoint, endpoint_slice

CTX = TableContext(node_name="node-a", zone="zone-a", nodeport_addresses=("192.168.1.10", "fd00:1::10"))

WEB_SLICE = endpoint_slice(
    "web-a", [endpoint("10.244.1.5", node="node-a"), endpoint("10.244.2.5", node="node-b")], [("", "TCP", 8080)]
)
REMOTE_SLICE = endpoint_slice("web-b", [endpoint("10.244.2.5", node="node-b")], [("", "TCP", 8080)])


def summarize(rules) -> dict[str, tuple]:
    """frontend -> (action, kind, endpoint keys, local-client endpoint keys or None)."""
    out = {}
    for frontend, rule in rules.items():
        local = rule.local_client_endpoints
        out[str(frontend)] = (
            rule.action.value,
            rule.kind.value,
            [e.key for e in rule.endpoints],
            None if local is None else [e.key for e in local],
        )
    return out


FWD, DROP, REFUSE = "forward", "drop", "refuse"
CIP, EIP, LB, NP = "ClusterIP", "ExternalIP", "LoadBalancer", "NodePort"
BOTH = ["10.244.1.5:8080", "10.244.2.5:8080"]
LOCAL = ["10.244.1.5:8080"]
REMOTE = ["10.244.2.5:8080"]
