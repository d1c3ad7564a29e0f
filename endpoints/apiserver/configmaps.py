"""One ConfigMap followed by name, its ``data`` handed to a callback whenever it changes.

The DNS server's kube-dns ConfigMap (``stubDomains``, ``upstreamNameservers``) is read the
way kube-dns reads it (kubernetes/dns pkg/dns/config/sync_configmap.go NewConfigMapSync: an
informer on the ConfigMaps of kube-system), through the same :class:`~.informer.Informer`
as every other resource: list then watch, with a field selector on ``metadata.name`` so
that RBAC can grant this one object by ``resourceNames`` (the API server authorizes a list
or watch so restricted as a request for that name: k8s.io/apiserver
pkg/endpoints/request/requestinfo.go). The sink is not the ClusterState: a ConfigMap is no
part of a snapshot, and the source's readiness does not wait for it.
"""

from __future__ import annotations

from typing import Callable, Literal, Mapping

from pydantic import Field, field_validator

from kubeport.endpoints.apiserver.resources import Resource
from kubeport.endpoints.model import ApiModel, ObjectMeta

OnData = Callable[[Mapping[str, str] | None], None]


class ConfigMap(ApiModel):
    """The part of a core/v1 ConfigMap read: its string ``data`` (``binaryData`` is not)."""

    api_version: str = "v1"
    kind: Literal["ConfigMap"] = "ConfigMap"
    metadata: ObjectMeta
    data: dict[str, str] = Field(default_factory=dict)

    @field_validator("data", mode="before")
    @classmethod
    def _null_is_empty(cls, value: object) -> object:
        return {} if value is None else value


def config_map_resource(namespace: str, name: str) -> Resource:
    return Resource("ConfigMap", "", "v1", "configmaps", ConfigMap, field_selector=f"metadata.name={name}",
                    namespace=namespace)


class ConfigMapSink:
    """The informer's sink for one named ConfigMap: ``on_data(data)`` after a commit that
    changed it, ``on_data(None)`` once it is found absent (the first list) or deleted."""

    def __init__(self, name: str, on_data: OnData) -> None:
        self._name = name
        self._on_data = on_data
        self._key: tuple[str, str] | None = None
        self._data: dict[str, str] | None = None
        self._dirty = False
        self._synced = False

    def upsert(self, obj: object) -> None:
        assert isinstance(obj, ConfigMap)
        if obj.metadata.name != self._name:  # the field selector keeps others out
            return
        self._key = (obj.metadata.namespace, obj.metadata.name)
        if obj.data != self._data:
            self._data = dict(obj.data)
            self._dirty = True

    def delete(self, kind: str, namespace: str, name: str) -> None:
        if (namespace, name) == self._key:
            self._key = self._data = None
            self._dirty = True

    def keys(self, kind: str) -> set[tuple[str, str]]:
        return {self._key} if self._key is not None else set()

    def mark_synced(self, kind: str) -> None:
        if not self._synced:
            self._synced = self._dirty = True  # absent at the first list is news too

    def commit(self) -> None:
        if self._dirty:
            self._dirty = False
            self._on_data(self._data)
