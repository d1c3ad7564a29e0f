"""Fields a manifest object carries that its Kubernetes type does not have.

The API models ignore unknown fields, as a client of a newer API server must. A hand-written
manifest is another matter: ``condition: {ready: false}`` (for ``conditions``) would send
traffic to an endpoint that is not ready, ``sessionAfinity: ClientIP`` would silently turn
affinity off. ``kubectl apply`` rejects such fields (server-side field validation, Strict),
and with ``--validate=warn`` prints ``Warning: unknown field "spec.sessionAfinity"``. kubeport
reports them the same way, as warnings: the object is still applied.

The field lists are those of k8s.io/api core/v1 (Service, Node, Namespace, ObjectMeta) and
discovery/v1 (EndpointSlice), the parts an operator writes or ``kubectl get -o yaml`` prints;
maps (labels, selector, capacity) and deeply nested status are not checked. Cheap by design:
one subset test per checked mapping, paths built only for what is reported.
"""

from __future__ import annotations

from typing import Any, Union

#: a checked mapping: each field -> its own schema (a mapping, a list of mappings) or None (not checked)
Schema = dict[str, Union["Schema", "ListOf", None]]


class ListOf:
    """A list whose items are mappings of ``schema``."""

    __slots__ = ("schema",)

    def __init__(self, schema: Schema) -> None:
        self.schema = schema


def _fields(*names: str, **nested: Schema | ListOf) -> Schema:
    schema: Schema = dict.fromkeys(names)
    schema.update(nested)
    return schema


OBJECT_META = _fields(
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
)

SERVICE_PORT = _fields("name", "protocol", "appProtocol", "port", "targetPort", "nodePort")
SERVICE_SPEC = _fields(
    "selector", "clusterIP", "clusterIPs", "type", "externalIPs", "sessionAffinity", "loadBalancerIP",
    "loadBalancerSourceRanges", "externalName", "externalTrafficPolicy", "healthCheckNodePort",
    "publishNotReadyAddresses", "ipFamilies", "ipFamilyPolicy", "allocateLoadBalancerNodePorts",
    "loadBalancerClass", "internalTrafficPolicy", "trafficDistribution",
    ports=ListOf(SERVICE_PORT),
    sessionAffinityConfig=_fields(clientIP=_fields("timeoutSeconds")),
)
SERVICE_STATUS = _fields(
    "conditions",
    loadBalancer=_fields(ingress=ListOf(_fields("ip", "hostname", "ipMode", "ports"))),
)

OBJECT_REFERENCE = _fields("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
ENDPOINT = _fields(
    "addresses", "hostname", "deprecatedTopology", "nodeName", "zone",
    conditions=_fields("ready", "serving", "terminating"),
    targetRef=OBJECT_REFERENCE,
    hints=_fields(forZones=ListOf(_fields("name")), forNodes=ListOf(_fields("name"))),
)
ENDPOINT_PORT = _fields("name", "protocol", "port", "appProtocol")

NODE_SPEC = _fields(
    "podCIDR", "podCIDRs", "providerID", "unschedulable", "configSource", "externalID",
    taints=ListOf(_fields("key", "value", "effect", "timeAdded")),
)
NODE_STATUS = _fields(
    "capacity", "allocatable", "phase", "conditions", "daemonEndpoints", "nodeInfo", "images", "volumesInUse",
    "volumesAttached", "config", "runtimeHandlers", "features", "declaredFeatures",
    addresses=ListOf(_fields("type", "address")),
)

#: per kind, the whole object
SCHEMAS: dict[str, Schema] = {
    "Service": _fields("apiVersion", "kind", metadata=OBJECT_META, spec=SERVICE_SPEC, status=SERVICE_STATUS),
    "EndpointSlice": _fields("apiVersion", "kind", "addressType", metadata=OBJECT_META,
                             endpoints=ListOf(ENDPOINT), ports=ListOf(ENDPOINT_PORT)),
    "Node": _fields("apiVersion", "kind", metadata=OBJECT_META, spec=NODE_SPEC, status=NODE_STATUS),
    "Namespace": _fields("apiVersion", "kind", metadata=OBJECT_META, spec=_fields("finalizers"),
                         status=_fields("phase", "conditions")),
    "ServiceCIDR": _fields("apiVersion", "kind", metadata=OBJECT_META, spec=_fields("cidrs"),
                           status=_fields(conditions=ListOf(_fields("type", "status", "observedGeneration",
                                                                    "lastTransitionTime", "reason", "message")))),
}

class _Node:
    """A schema compiled for the check: its field names, and the fields with a schema of their own."""

    __slots__ = ("keys", "nested")

    def __init__(self, schema: Schema) -> None:
        self.keys = frozenset(schema)
        self.nested = tuple(
            (name, _Node(sub.schema) if isinstance(sub, ListOf) else _Node(sub), isinstance(sub, ListOf))
            for name, sub in schema.items() if sub is not None
        )


_NODES = {kind: _Node(schema) for kind, schema in SCHEMAS.items()}

#: a field path as a chain of (parent, part): built into text only for a field that is reported
_Path = Union[tuple["_Path", Union[str, int]], None]


def unknown_fields(kind: str, value: Any) -> list[str]:
    """The paths (``spec.ports[0].nmae``) of the fields of ``value`` that ``kind`` does not have."""
    node = _NODES.get(kind)
    if node is None:
        return []
    try:
        if _clean(node, value):
            return []
    except (TypeError, AttributeError):
        pass  # a value of the wrong type somewhere: the walk below skips it
    found: list[_Path] = []
    _walk(node, value, None, found)
    return [_text(path) for path in found]


def _clean(node: _Node, value: Any) -> bool:
    """True when the mapping ``value`` has no field (at any depth) its schema lacks. False, or
    TypeError or AttributeError, also when a value has the wrong type: the walk sorts it out."""
    if not value.keys() <= node.keys:
        return False
    for name, sub, many in node.nested:
        child = value.get(name)
        if child is not None and not (_clean_items(sub, child) if many else _clean(sub, child)):
            return False
    return True


def _clean_items(node: _Node, items: list[Any]) -> bool:
    """:func:`_clean` for every mapping of a list at once: their fields are gathered in C
    (``set.union``) and tested together, not item by item in Python."""
    if not items:
        return True
    present = set().union(*items)
    if not present <= node.keys:
        return False
    for name, sub, many in node.nested:
        if name not in present:
            continue
        children = [child for item in items if (child := item.get(name)) is not None]
        if many:
            children = [each for child in children for each in child]
        if not _clean_items(sub, children):
            return False
    return True


def _walk(node: _Node, value: Any, path: _Path, found: list[_Path]) -> None:
    if not isinstance(value, dict):
        return  # a wrong type is the validation's to report
    if not value.keys() <= node.keys:
        found.extend((path, key) for key in value if key not in node.keys)
    for name, sub, many in node.nested:
        child = value.get(name)
        if child is None:
            continue
        if many:
            if isinstance(child, list):
                for index, item in enumerate(child):
                    _walk(sub, item, ((path, name), index), found)
        else:
            _walk(sub, child, (path, name), found)


def _text(path: _Path) -> str:
    parts: list[str | int] = []
    while path is not None:
        path, part = path
        parts.append(part)
    text = ""
    for part in reversed(parts):
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
