"""The kubeport.io/proxy-protocol annotation, as the conversion reads it: "v2" asks for the
header; any other value is one problem naming the Service, the annotation and the value."""

from __future__ import annotations

import pytest

from kubeport.endpoints import convert, model

from support import api

PROBLEM = ('Service shop/web: annotation kubeport.io/proxy-protocol: "{}" is not supported (only "v2"); '
           "served without a PROXY protocol header")


def _info(annotations: dict[str, str] | None):
    obj = api.service("web", "shop", clusterIP="10.96.0.20", ports=[{"port": 80}])
    if annotations is not None:
        obj["metadata"]["annotations"] = annotations
    return convert.service_info(api.to_model(obj))


@pytest.mark.parametrize(
    ("annotations", "proxy_protocol", "problems"),
    [
        pytest.param(None, False, (), id="no_annotations"),
        pytest.param({"other.example/x": "v2"}, False, (), id="another_annotation"),
        pytest.param({"kubeport.io/proxy-protocol": "v2"}, True, (), id="v2"),
        pytest.param({"kubeport.io/proxy-protocol": ""}, False, (), id="empty__as_absent"),
        pytest.param({"kubeport.io/proxy-protocol": "v1"}, False, (PROBLEM.format("v1"),), id="v1__reported"),
        pytest.param({"kubeport.io/proxy-protocol": "V2"}, False, (PROBLEM.format("V2"),), id="wrong_case__reported"),
        pytest.param({"kubeport.io/proxy-protocol": "true"}, False, (PROBLEM.format("true"),), id="true__reported"),
    ],
)
def test_proxy_protocol_annotation(annotations, proxy_protocol, problems):
    info = _info(annotations)
    assert (info.proxy_protocol, info.problems) == (proxy_protocol, problems)
    assert info.proxied  # a bad value never stops the Service being served


def test_the_annotation_name():
    assert model.ANNOTATION_PROXY_PROTOCOL == "kubeport.io/proxy-protocol"
