"""`kubeport check` (names every problem of a broken directory) and the ownership rules
behind duplicate reports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeport.endpoints.manifests.holders import Holders
from kubeport.endpoints.manifests.check import check_directory

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
BROKEN = REPO / "tests" / "fixtures" / "broken"


def test_examples_pass_check():
    assert check_directory(EXAMPLES) == []
    assert check_directory(EXAMPLES, ["10.96.0.0/12", "fd00:10:96::/112"]) == []


#: file -> what its line says; every deliberately broken file is named.
BROKEN_FILES = {
    "yaml-syntax.yaml": "YAML syntax error at line 5, column 2",
    "json-syntax.json": "JSON syntax error at line 5, column 35: Expecting value",
    "missing-name.yaml": "document 1: Service: metadata.name: Required value",
    "invalid-port-name.yaml": 'Service "invalid-port-name" is invalid: spec.ports[0].name: Invalid value: "HTTP_Port"',
    "duplicate-b.yaml": 'Service "duplicate": declared also in duplicate-a.yaml, ignored',
    "bad-nodeport.yaml": 'Service "bad-nodeport" is invalid: spec.ports[0].nodePort: Invalid value: 8080: '
                         "provided port is not in the valid range. The range of valid ports is 30000-32767",
    "clusterip-out-of-range.yaml": "the provided IP (192.168.1.10) is not in the valid range. "
                                   "The range of valid IPs is 10.96.0.0/12",
    "endpoint-loopback.yaml": 'EndpointSlice.discovery.k8s.io "endpoint-loopback" is invalid: '
                              'endpoints[0].addresses[0]: Invalid value: "127.0.0.1": may not be in the loopback range',
    "unnamed-ports.yaml": 'Service "unnamed-ports" is invalid: spec.ports[1].name: Required value',
    "bad-traffic-distribution.yaml": 'Service "bad-traffic-distribution" is invalid: spec.trafficDistribution: '
                                     'Unsupported value: "Anywhere"',
    "wrong-type.yaml": 'Service "wrong-type": spec.ports[0].port: Input should be a valid integer',
}


@pytest.mark.parametrize("file, message", list(BROKEN_FILES.items()), ids=list(BROKEN_FILES))
def test_check_names_every_broken_file(file, message):
    """Each broken file named; invalid objects in the API server's words (apimachinery errors.NewInvalid)."""
    lines = check_directory(BROKEN)
    prefix = os.path.join(str(BROKEN), file) + ": "
    assert any(line.startswith(prefix) and message in line for line in lines), "\n".join(lines)


def test_check_reports_nothing_else():
    lines = check_directory(BROKEN)
    named = {line.split(": ", 1)[0] for line in lines}
    assert named == {os.path.join(str(BROKEN), file) for file in BROKEN_FILES}
    assert not any("unknown-kind.yaml" in line or "duplicate-a.yaml:" in line for line in lines)


def test_check_of_a_missing_directory(tmp_path):
    assert check_directory(tmp_path / "nope") == [f"{tmp_path / 'nope'}: not a directory"]


# --- who holds an object (pure) -------------------------------------------------------------------

KEY = ("Service", "default", "web")


@pytest.mark.parametrize(
    "steps, holder, waiting",
    [
        pytest.param([("hold", "a"), ("hold", "b")], "a", set(), id="first_declaration_wins"),
        pytest.param([("hold", "a"), ("hold", "b"), ("drop", "a")], None, {"b"}, id="dropped_waits_for_duplicate"),
        pytest.param([("hold", "a"), ("hold", "b"), ("drop", "a"), ("hold", "b")], "b", set(), id="duplicate_takes_over"),
        pytest.param([("hold", "a"), ("hold", "b"), ("drop", "b"), ("drop", "a")], None, set(),
                     id="withdrawn_duplicate_forgotten"),
        pytest.param([("hold", "a"), ("hold", "a")], "a", set(), id="holding_again_is_a_noop"),
    ],
)
def test_holders(steps, holder, waiting):
    holders = Holders()
    for action, path in steps:
        if action == "hold":
            holders.hold(path, KEY)
        else:
            holders.drop(path, [KEY])
    assert holders.holder(KEY) == holder
    assert holders.waiting([KEY]) == waiting
