"""A restart serves what the daemon served before it: the last good version of invalid
objects, the valid changes made beside them, and the same holder of each duplicated object
(the README's promise: "this holds across restarts")."""

from __future__ import annotations

import json

import pytest

from kubeport.endpoints.registry.store import AllocationStore
from kubeport.endpoints.manifests.holders import Holders
from kubeport.endpoints.manifests.lastgood import DIRECTORY_NAME, HOLDERS_NAME, INDEX_NAME, LastGoodFiles, merged_copy
from kubeport.endpoints.manifests.read import content_digest
from kubeport.endpoints.types import ServiceName

from support.manifests import Harness, manifests, running, service  # noqa: F401  (a fixture)
from support.wait import DEADLINE, until

API = ServiceName("default", "api")
INVALID_NAME = "HTTP"  # a port name the API server refuses
BROKEN = "  oops: [\n"


class Node:
    """One daemon's life after another on the same manifests and state directory."""

    def __init__(self, manifests, state_dir) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.manifests, self.state_dir = manifests, state_dir
        self.store = AllocationStore(state_dir / "allocations.db")

    def start(self) -> Harness:
        return Harness(self.manifests, self.store, last_good=LastGoodFiles.in_state_dir(self.state_dir))

    def load(self) -> Harness:
        harness = self.start()
        harness.source.load()  # the first load, then the copies are saved (as at a stop)
        return harness

    def served(self, harness: Harness) -> dict[str, tuple]:
        return {str(name): (state.service.cluster_ips, tuple(p.port for p in state.service.ports))
                for name, state in harness.state.snapshot.services.items()}


MARKER = ServiceName("default", "marker")


async def run_through(node: Node, *versions: str) -> dict[str, tuple]:
    """Start, write each version of a.yaml in turn and wait until it is read and its copy
    saved, stop; what was served last. Each version carries a marker Service whose port says
    which version was read. (A version replaced before its copy was saved, within the quiet
    moment the copies wait for, is not kept: see manifest_lastgood.)"""
    harness = node.start()
    async with running(harness):
        for number, text in enumerate(versions, start=1):
            text += "---\n" + service("marker", 1000 + number)
            harness.write("a.yaml", text)
            if BROKEN in text:
                await harness.until(lambda: any("YAML syntax error" in line for line in harness.source.problems))
                continue
            await harness.until(lambda: MARKER in harness.state.snapshot.services
                                and harness.ports(MARKER) == [1000 + number])
            await until_saved(node.state_dir, "a.yaml", text)
        served = node.served(harness)
    return served


async def until_saved(state_dir, path: str, text: str) -> None:
    """Wait (deadline: DEADLINE) until the copy of ``path`` is the one of this version."""
    index = state_dir / DIRECTORY_NAME / INDEX_NAME
    digest = content_digest(text.encode()).hex()

    def saved() -> bool:
        copies = json.loads(index.read_text()).get(path) if index.exists() else None
        return digest in (copies if isinstance(copies, list) else [copies])

    # polling a file another task writes: no event to wait on
    await until(saved, f"the copy of this version of {path}", DEADLINE, interval=0.01)


def two(web_port: int | str = 80, api_port: int = 90, web_port_name: str = "http", api_port_name: str = "http") -> str:
    return service("web", web_port, port_name=web_port_name) + "---\n" + service("api", api_port, port_name=api_port_name)


@pytest.mark.parametrize(
    "versions, web, api",
    [
        pytest.param([two(80, 91, web_port_name=INVALID_NAME)], 80, 91,
                     id="newly_invalid_object_beside_a_valid_change"),
        pytest.param([two(80, 91, web_port_name=INVALID_NAME), two(82, 91, web_port_name=INVALID_NAME)], 80, 91,
                     id="still_invalid_after_another_edit"),
        pytest.param([two(80, 91, web_port_name=INVALID_NAME), two(82, 92, api_port_name=INVALID_NAME)], 82, 91,
                     id="alternating_breakage"),
        pytest.param([two(80, 91, web_port_name=INVALID_NAME), two(80, 91) + BROKEN], 80, 91,
                     id="then_a_syntax_error"),
        pytest.param([two(81, 91).replace("kind: Service\nmetadata:\n  name: web", "kind: Servce\nmetadata:\n  name: web")],
                     80, 91, id="kind_typo"),
        pytest.param([two(81, 91).replace("apiVersion: v1\nkind: Service\nmetadata:\n  name: web",
                                          "apiVersion: v2\nkind: Service\nmetadata:\n  name: web")],
                     80, 91, id="api_version_v2"),
    ],
)
async def test_a_restart_serves_what_was_served(manifests, tmp_path, versions, web, api):
    node = Node(manifests, tmp_path / "state")
    node.load().write("a.yaml", two(80, 90))
    first = node.load()
    before = await run_through(node, *versions)
    assert (before["default/web"][1], before["default/api"][1]) == ((web,), (api,))
    restarted = node.load()
    assert node.served(restarted) == before  # same ports, same ClusterIPs
    assert node.served(first)["default/web"][0] == before["default/web"][0]
    assert restarted.source.problems  # and the problem is still said


def test_an_invalid_object_written_while_the_daemon_was_down(manifests, tmp_path):
    """The file's copy is the version before: the new version is applied as an edit of it."""
    node = Node(manifests, tmp_path / "state")
    node.load().write("a.yaml", two(80, 90))
    ips = node.served(node.load())
    node.load().write("a.yaml", two(81, 91, web_port_name=INVALID_NAME))
    restarted = node.load()
    assert node.served(restarted) == {"default/web": (ips["default/web"][0], (80,)),
                                      "default/api": (ips["default/api"][0], (91,))}
    [problem] = restarted.source.problems
    assert problem.startswith('a.yaml: Service "web" is invalid: spec.ports[0].name: Invalid value: "HTTP"')


def test_a_fully_valid_file_is_copied_as_it_is(manifests, tmp_path):
    node = Node(manifests, tmp_path / "state")
    node.load().write("a.yaml", two(80, 90))
    node.load()
    copy = tmp_path / "state" / DIRECTORY_NAME / "files" / "a.yaml"
    assert copy.read_text() == two(80, 90)
    node.load().write("a.yaml", two(80, 91, web_port_name=INVALID_NAME))
    node.load()
    lines = [json.loads(line) for line in copy.read_text().splitlines()]  # merged: as served
    assert sorted((o["metadata"]["name"], o["spec"]["ports"][0]["port"]) for o in lines) == [("api", 91), ("web", 80)]


# --- duplicates ---------------------------------------------------------------------------------


async def test_the_holder_of_a_duplicate_holds_it_across_a_restart(manifests, tmp_path):
    node = Node(manifests, tmp_path / "state")
    node.load().write("z.yaml", service(port=80))
    node.load()
    before = await run_through(node, service(port=81))  # a.yaml: later in time, first in path order
    assert before["default/web"][1] == (80,)
    restarted = node.load()
    assert node.served(restarted) == before
    assert restarted.source.problems == ['a.yaml: Service "web": declared also in z.yaml, ignored']


async def test_the_waiting_file_takes_over_when_the_holder_dropped_it_while_down(manifests, tmp_path):
    node = Node(manifests, tmp_path / "state")
    node.load().write("z.yaml", service(port=80) + "---\n" + service("api"))
    node.load()
    before = await run_through(node, service(port=81))
    node.load().write("z.yaml", service("api"))  # while down
    restarted = node.load()
    assert node.served(restarted)["default/web"] == (before["default/web"][0], (81,))  # same ClusterIP
    assert restarted.source.problems == []


@pytest.mark.parametrize(
    "change_while_down",
    [
        pytest.param(lambda node: node.start().write("a.yaml", service(port=81)), id="new_file"),
        pytest.param(lambda node: node.start().write("a.yaml", service("api") + "---\n" + service(port=81)),
                     id="file_that_did_not_declare_it"),
    ],
)
def test_a_duplicate_declared_while_down_does_not_take_the_object(manifests, tmp_path, change_while_down):
    """Nothing recorded a contest, yet the copies say who declared it before the restart."""
    node = Node(manifests, tmp_path / "state")
    node.load().write("z.yaml", service(port=80))
    node.load().write("a.yaml", service("api"))
    before = node.served(node.load())
    change_while_down(node)
    restarted = node.load()
    assert node.served(restarted)["default/web"] == before["default/web"]
    assert restarted.source.problems == ['a.yaml: Service "web": declared also in z.yaml, ignored']
    assert node.served(node.load())["default/web"] == before["default/web"]  # and again: now it is saved


def test_without_history_the_first_file_in_path_order_wins(manifests, tmp_path):
    node = Node(manifests, tmp_path / "state")
    node.start().write("z.yaml", service(port=80))
    node.start().write("a.yaml", service(port=81))
    assert node.served(node.load())["default/web"][1] == (81,)


async def test_holders_are_saved_only_for_contested_objects(manifests, tmp_path):
    node = Node(manifests, tmp_path / "state")
    node.load().write("z.yaml", service(port=80) + "---\n" + service("api"))
    node.load()
    await run_through(node, service(port=81))
    saved = json.loads((tmp_path / "state" / DIRECTORY_NAME / HOLDERS_NAME).read_text())
    assert saved == [["Service", "default", "web", "z.yaml"]]


KEY = ("Service", "default", "web")


@pytest.mark.parametrize(
    "preferred, steps, holder, unclaimed",
    [
        pytest.param({KEY: "z"}, [("hold", "a"), ("hold", "z")], "z", set(), id="preferred_holder_wins_over_path_order"),
        pytest.param({KEY: "z"}, [("hold", "a")], "a", {KEY}, id="preferred_holder_gone__the_waiting_file_gets_it"),
        pytest.param({KEY: "z"}, [("hold", "z"), ("hold", "a")], "z", set(), id="preferred_holder_first_anyway"),
        pytest.param({}, [("hold", "a"), ("hold", "z")], "a", set(), id="no_preference__path_order"),
        pytest.param({}, [("tentative", "a"), ("hold", "z")], "z", set(), id="declared_before_the_restart_wins"),
        pytest.param({}, [("tentative", "a"), ("tentative", "z")], "a", set(), id="both_new__path_order"),
        pytest.param({}, [("hold", "a"), ("tentative", "z")], "a", set(), id="newcomer_later_in_path_order"),
    ],
)
def test_holders_with_preferences(preferred, steps, holder, unclaimed):
    holders = Holders(preferred)
    for how, path in steps:
        holders.hold(path, KEY, tentative=how == "tentative")
    assert holders.end_preferences() == unclaimed
    for path in holders.waiting(unclaimed):
        holders.hold(path, KEY)  # what the source does: it reads the waiting files again
    assert holders.holder(KEY) == holder
    assert holders.contested() == ({KEY: holder} if len({p for _, p in steps}) > 1 else {})


@pytest.mark.parametrize(
    "stale, unapplied, lines, missing",
    [
        pytest.param(set(), set(), ['{"v":"a2"}', '{"v":"b2"}'], set(), id="all_current"),
        pytest.param({"b"}, set(), ['{"v":"a2"}', '{"v":"b1"}'], set(), id="stale_from_previous"),
        pytest.param({"b"}, {"a"}, ['{"v":"b1"}'], set(), id="unapplied_left_out"),
        pytest.param({"c"}, set(), ['{"v":"a2"}', '{"v":"b2"}'], {"c"}, id="stale_without_a_saved_version"),
    ],
)
def test_merged_copy(stale, unapplied, lines, missing):
    current = [("a", {"v": "a2"}), ("b", {"v": "b2"})]
    previous = [("a", {"v": "a1"}), ("b", {"v": "b1"})]
    text, lacking = merged_copy(current, previous, frozenset(stale), frozenset(unapplied))
    assert text.splitlines() == lines and lacking == missing
