#!/usr/bin/env python3
"""What keeping the last applied state costs, in one process: 10,000 services x 10 endpoints
(bench/generate.py's cluster) in a ClusterState, with and without a LastState attached.

    .venv/bin/python bench/laststate_cost.py [--services 10000] [--endpoints 10] [--changes 2000]

Reported, as medians over ``--changes`` endpoint changes (one slice upserted and committed):
- the change path: upsert + commit on the event loop, with the journal attached and without
  (the difference is what the record costs the change before the proxy and DNS see it);
- the journal append that follows on the loop (pickle + write), per change;
- the first write of the whole state (the base, in pieces in quiet moments), the event loop's
  longest pause meanwhile, and the sizes of base and journal.
The peer is the same ClusterState without the journal, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

from generate import endpoint_slice, http_service_objects

from kubeport.endpoints import model
from kubeport.survival import laststate
from kubeport.survival.laststate import LastState
from kubeport.endpoints.state import ClusterState

TARGET = [{"name": "http", "port": 8080, "protocol": "TCP"}]


def parse_object(raw: dict) -> model.KubeObject:
    return model.KIND_MODELS[raw["kind"]].model_validate(raw)


def objects(services: int, endpoints: int) -> list[model.KubeObject]:
    built = []
    for i in range(services):
        for raw in http_service_objects(i, endpoints):
            built.append(parse_object(raw))
    return built


def change(i: int, round_no: int, endpoints: int) -> model.KubeObject:
    addresses = [f"10.250.{(round_no + j) % 250}.{i % 250 + 1}" for j in range(endpoints)]
    return parse_object(endpoint_slice(f"svc-{i}", addresses, TARGET))


async def measure(services: int, endpoints: int, changes: int, journal_dir: Path | None) -> dict:
    state = ClusterState("node")
    journal = None
    task = None
    if journal_dir is not None:
        journal = LastState(journal_dir)
        state.keep_in(journal)
    for obj in objects(services, endpoints):
        state.upsert(obj)
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    t0 = time.perf_counter()
    state.commit()
    first = {"first_commit_ms": (time.perf_counter() - t0) * 1000}
    gc.freeze()  # as the daemon does once its first view is applied
    if journal is not None:
        task = asyncio.create_task(journal.run())  # as the daemon: from the first whole view on
        t0 = time.perf_counter()
        longest = 0.0
        while not journal.settled:
            tick = time.perf_counter()
            await asyncio.sleep(0.001)
            longest = max(longest, time.perf_counter() - tick)
        first["base_write_s"] = time.perf_counter() - t0
        first["loop_longest_pause_during_base_ms"] = longest * 1000
        first["base_bytes"] = (journal_dir / "base.pickle").stat().st_size
    path_us, write_cpu_us = [], []
    if journal is not None:
        append = journal._append

        def timed_append(changes, now):
            c0 = time.perf_counter()
            try:
                return append(changes, now)
            finally:
                write_cpu_us.append((time.perf_counter() - c0) * 1e6)

        journal._append = timed_append
    pending = [change(i * 7 % services, r, endpoints) for r, i in enumerate(range(changes))]
    for obj in pending:
        t0 = time.perf_counter()
        state.upsert(obj)
        state.commit()
        path_us.append((time.perf_counter() - t0) * 1e6)
        # Spaced as a cluster's changes are, and both runs alike: the journal writes each
        # change COALESCE after it.
        await asyncio.sleep(laststate.COALESCE + 0.01)
        if journal is not None:
            while not journal.settled:
                await asyncio.sleep(0.005)
    result = {**first, "change_path_us": statistics.median(path_us)}
    gc.unfreeze()
    if journal is not None:
        result["append_on_loop_us"] = statistics.median(write_cpu_us)
        result["append_on_loop_max_us"] = max(write_cpu_us)
        (journal_file,) = journal_dir.glob("journal.*")
        result["journal_bytes_per_change"] = journal_file.stat().st_size / changes
        task.cancel()
    return result


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        without = await measure(args.services, args.endpoints, args.changes, None)
        kept = await measure(args.services, args.endpoints, args.changes, Path(tmp) / "last-state")
    return {"services": args.services, "endpoints": args.endpoints, "changes": args.changes,
            "without": without, "kept": kept,
            "change_path_ratio": kept["change_path_us"] / without["change_path_us"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=2000)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
