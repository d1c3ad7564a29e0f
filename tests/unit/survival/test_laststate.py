"""The last applied state: what a ClusterState holds, kept in a directory as it changes, read
back by the next process, served until the source's first sync confirms or replaces it."""

from __future__ import annotations

import asyncio
import errno
import gc
import pickle

import pytest

from kubeport.survival import laststate
from kubeport.survival.laststate import LastState
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName

from support import api
from support.api import endpoint as ep
from support.wait import until

WEB, DB = ServiceName("default", "web"), ServiceName("default", "db")


def service(name, ip):
    return api.to_model(api.service(name, "default", clusterIP=ip,
                                    ports=[{"name": "http", "port": 80, "targetPort": 8080}]))


def slice_(name, service_name, *addresses):
    return api.to_model(api.endpoint_slice(service_name, "default", name=name,
                                           endpoints=[ep(a) for a in addresses],
                                           ports=[{"name": "http", "port": 8080}]))


def node(name="node-a", zone="zone-a"):
    return api.to_model({"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}})


def namespace(name):
    return api.to_model({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture
async def kept(tmp_path):
    """``kept(state)``: ``state`` keeps its changes in tmp_path/last-state; ``kept.written()``
    waits until everything recorded so far is on disk."""
    tasks = []
    journals = []

    def keep(state: ClusterState) -> LastState:
        journal = LastState(tmp_path / "last-state")
        state.keep_in(journal)
        journals.append(journal)
        tasks.append(asyncio.create_task(journal.run()))
        return journal

    async def written():
        journal = journals[-1]
        await until(lambda: journal.settled, "the last state written", 5.0)

    keep.written = written
    keep.directory = tmp_path / "last-state"
    yield keep
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def cluster(state: ClusterState) -> None:
    for obj in (namespace("default"), node(), service("web", "10.96.0.20"), slice_("web-1", "web", "10.244.1.1"),
                service("db", "10.96.0.30"), slice_("db-1", "db", "10.244.1.2", "10.244.1.3")):
        state.upsert(obj)
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    state.commit()


async def test_a_new_process_restores_what_the_last_one_held_and_serves_it_before_the_sync(kept):
    before = ClusterState("node-a")
    kept(before)
    cluster(before)
    await kept.written()
    before.upsert(slice_("web-1", "web", "10.244.1.9"))      # a change after the base: the journal
    before.commit()
    await kept.written()

    saved = LastState(kept.directory).load()
    assert saved is not None and saved.age() < 5
    after = ClusterState("node-a")
    after.restore(saved)
    snapshot = after.commit()
    assert snapshot is not None and not snapshot.synced and snapshot.servable
    assert snapshot.restored_at == saved.saved_at
    assert snapshot.services == before.snapshot.services
    assert snapshot.node == before.snapshot.node and "default" in snapshot.namespaces


async def test_pods_are_kept_with_their_labels(kept):
    """Manifest mode's Pods (labels and all) and the API server's slim ones."""
    from support.apiserver import objects as k8s

    from kubeport.endpoints import model

    before = ClusterState("node-a")
    kept(before)
    cluster(before)
    before.upsert(api.to_model(api.pod("web-0", ips=["10.244.1.1"], labels={"app": "web"})))
    before.upsert(model.PodAddresses.model_validate(k8s.pod("api-5d-x", "shop", ip="10.244.1.7")))
    before.commit()
    await kept.written()
    saved = LastState(kept.directory).load()
    assert saved is not None
    after = ClusterState("node-a")
    after.restore(saved)
    snapshot = after.commit()
    assert snapshot is not None and snapshot.pods == before.snapshot.pods
    assert snapshot.pods[("default", "web-0")].labels == {"app": "web"}


async def test_the_first_sync_deletes_what_the_source_no_longer_has(kept):
    before = ClusterState("node-a")
    kept(before)
    cluster(before)
    await kept.written()
    after = ClusterState("node-a")
    after.restore(LastState(kept.directory).load())
    after.commit()
    # The source's first list: web only (db was deleted while no process watched).
    after.upsert(service("web", "10.96.0.20"))
    after.mark_synced("Service")
    snapshot = after.commit()
    assert set(snapshot.services) == {WEB} and not snapshot.synced and snapshot.servable
    after.upsert(slice_("web-1", "web", "10.244.1.1"))
    after.mark_synced("EndpointSlice")
    snapshot = after.commit()
    assert snapshot.synced and snapshot.restored_at is None
    assert snapshot.services[WEB] == before.snapshot.services[WEB]


async def test_the_first_sync_keeps_the_node_and_namespaces_it_lists_again(kept):
    """Cluster-scoped objects confirmed by the source's first list stay: the model gives them
    metadata.namespace "default", but they are held (and restored) under ""."""
    before = ClusterState("node-a", required_kinds={"Service", "EndpointSlice", "Node", "Namespace"})
    kept(before)
    cluster(before)
    before.mark_synced("Node")
    before.mark_synced("Namespace")
    before.commit()
    await kept.written()
    after = ClusterState("node-a", required_kinds={"Service", "EndpointSlice", "Node", "Namespace"})
    after.restore(LastState(kept.directory).load())
    after.commit()
    cluster(after)  # the source lists the same objects again
    after.mark_synced("Node")
    after.mark_synced("Namespace")
    snapshot = after.commit() or after.snapshot
    assert snapshot.synced
    assert "default" in snapshot.namespaces
    assert snapshot.node is not None and snapshot.node.zone == "zone-a"


async def kept_with_a_late_change(kept) -> ClusterState:
    """The cluster kept as a base, then Service ``late`` in its journal."""
    state = ClusterState("node-a")
    kept(state)
    cluster(state)
    await kept.written()
    state.upsert(service("late", "10.96.0.50"))
    state.commit()
    await kept.written()
    return state


@pytest.mark.parametrize("damage, expected", [
    ("none", "loaded"),
    ("truncated last journal record", "loaded"),     # the process died writing it
    ("garbage base", "none"),
    ("another format", "none"),
    ("no base", "none"),
])
async def test_a_damaged_or_foreign_state_is_never_served_half(kept, damage, expected):
    await kept_with_a_late_change(kept)
    base = kept.directory / laststate.BASE
    (journal,) = kept.directory.glob(f"{laststate.JOURNAL}.*")
    if damage == "truncated last journal record":
        journal.write_bytes(journal.read_bytes()[:-3])
    elif damage == "garbage base":
        base.write_bytes(b"not a pickle")
    elif damage == "another format":
        data = base.read_bytes()
        (length,) = laststate._LENGTH.unpack_from(data)
        header, generation, at = pickle.loads(data[4:4 + length])
        other = pickle.dumps(((laststate.FORMAT + 1, header[1]), generation, at))
        base.write_bytes(laststate._LENGTH.pack(len(other)) + other + data[4 + length:])
    elif damage == "no base":
        base.unlink()
    saved = LastState(kept.directory).load()
    assert (saved is not None) == (expected == "loaded")
    if saved is not None:
        late = ("Service", ("default", "late"))
        assert (late in saved.entries) == (damage == "none")
        assert ("Service", ("default", "web")) in saved.entries


async def test_a_change_appends_about_its_own_size_and_the_journal_folds_into_the_base(kept, monkeypatch):
    state = ClusterState("node-a")
    for i in range(1000):
        state.upsert(service(f"s{i}", f"10.96.{i // 250}.{i % 250 + 1}"))
        state.upsert(slice_(f"s{i}-1", f"s{i}", f"10.244.{i // 250}.{i % 250 + 1}"))
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    state.commit()
    journal = kept(state)                                  # as the daemon: from the first whole view on
    await kept.written()
    base_bytes = (kept.directory / laststate.BASE).stat().st_size
    state.upsert(slice_("s7-1", "s7", "10.244.9.9"))
    state.commit()
    await kept.written()
    (first_journal,) = kept.directory.glob(f"{laststate.JOURNAL}.*")
    grown = first_journal.stat().st_size
    assert 0 < grown < base_bytes / 200                    # one slice's worth, not the cluster's
    monkeypatch.setattr(laststate, "MIN_FOLD_BYTES", 0)
    journal._base_bytes = grown - 1                        # the journal is now larger than the base
    state.upsert(slice_("s8-1", "s8", "10.244.9.8"))
    state.commit()
    await kept.written()
    assert not first_journal.exists()                      # folded: a new base, a journal of its own
    saved = LastState(kept.directory).load()
    assert len([k for k in saved.entries if k[0] == "Service"]) == 1000
    owner, info = saved.entries[("EndpointSlice", ("default", "s8-1"))]
    assert owner == "s8" and [e.address for e in info.endpoints] == ["10.244.9.8"]


async def test_a_base_begun_and_not_finished_leaves_the_previous_one_whole(kept, monkeypatch):
    """A crash while a new base is written: the previous base and its journal are served."""
    await kept_with_a_late_change(kept)
    (kept.directory / (laststate.BASE + ".tmp")).write_bytes(b"half a base")
    (kept.directory / laststate.journal_name(99)).write_bytes(b"\0\0\0\5junk!")
    saved = LastState(kept.directory).load()
    assert ("Service", ("default", "late")) in saved.entries and ("Service", ("default", "db")) in saved.entries


async def test_pods_and_their_labels_are_kept(kept):
    state = ClusterState("node-a")
    cluster(state)
    state.upsert(api.to_model(api.pod("web-1", labels={"app": "web"}, ips=["10.244.1.1"], node="node-a")))
    state.commit()
    kept(state)
    await kept.written()
    saved = LastState(kept.directory).load()
    pod = saved.entries[("Pod", ("default", "web-1"))]
    assert dict(pod.labels) == {"app": "web"}


async def test_a_write_that_fails_is_a_problem_line_and_is_tried_again(kept, monkeypatch):
    state = ClusterState("node-a")
    cluster(state)
    journal = LastState(kept.directory)
    state.keep_in(journal)
    failures = iter([TypeError("cannot pickle this"), None])

    real = laststate._write_record

    def flaky(fd, data):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real(fd, data)

    monkeypatch.setattr(laststate, "_write_record", flaky)
    task = asyncio.create_task(journal.run())
    try:
        await until(lambda: journal.problem, "the problem line", 5.0)
        assert "cannot pickle this" in journal.problem
        await until(lambda: journal.settled and journal.problem is None, "written after all", 10.0)
        assert LastState(kept.directory).load() is not None
    finally:
        task.cancel()


async def test_a_base_refused_a_descriptor_is_a_problem_at_once_and_a_stop_leaves_nothing_unretrieved(
        tmp_path, monkeypatch):
    """EMFILE on the base's file, the writer stopped right after: the error is logged and kept
    as the problem line, never "Task exception was never retrieved"."""
    unhandled = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
    state = ClusterState("node-a")
    cluster(state)
    journal = LastState(tmp_path / "last-state")
    state.keep_in(journal)

    refused = []

    def no_descriptor(*args, **kwargs):
        refused.append(args)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(laststate.os, "open", no_descriptor)
    task = asyncio.create_task(journal.run())
    for _ in range(100):  # turns, not time: the stop comes before the writer's next wake-up
        await asyncio.sleep(0)
        if refused:
            break
    await asyncio.sleep(0)  # the base's task ends with the error; its callbacks run
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    problem = journal.problem
    del task, journal, state
    gc.collect()
    assert [context["message"] for context in unhandled] == []
    assert "Too many open files" in problem
