"""bench/bulk_cpu.py's pure part: perf report rows -> CPU seconds per GB moved, by part."""

from __future__ import annotations

import pytest

from support.bench import bench_module

bulk_cpu = bench_module("bulk_cpu")

# What `perf report --no-children --sort comm,sym -g none -q --stdio` (perf 6.1) printed for a
# 4-stream iperf3 transfer through kubeport: its first rows and one of each kind, then a
# process name with a space (as a browser's "Web Content" would be) written here by hand.
REPORT = """\
    20.65%  iperf3           [k] _copy_from_iter
    10.83%  iperf3           [k] _raw_spin_unlock_irqrestore
     9.02%  iperf3           [k] _copy_to_iter
     7.36%  python           [k] _raw_spin_unlock_irqrestore
     1.77%  swapper          [k] pv_native_safe_halt
     0.85%  python           [.] _PyEval_EvalFrameDefault
     0.35%  ksoftirqd/1      [k] _raw_spin_unlock_irqrestore
     0.09%  ksoftirqd/0      [k] finish_task_switch.isra.0
     0.02%  Web Content      [k] do_syscall_64

"""


def test_report_rows_keep_comm_share_and_symbol():
    rows = bulk_cpu.parse_report(REPORT)
    assert rows[0] == pytest.approx((0.2065, "iperf3", "_copy_from_iter"))
    assert rows[5][1:] == ("python", "_PyEval_EvalFrameDefault")
    assert rows[6][1:] == ("ksoftirqd/1", "_raw_spin_unlock_irqrestore")
    assert rows[8][1:] == ("Web Content", "do_syscall_64")  # a comm may hold a space
    assert len(rows) == 9


@pytest.mark.parametrize("rows, cpus, gbytes_per_s, proxy_comms, expected", [
    # a proxy path: idle 10%, the load generator 50%, the proxy 30%, a kernel thread 10%
    ([(0.10, "swapper", "pv_native_safe_halt"), (0.40, "iperf3", "_copy_from_iter"),
      (0.10, "iperf3", "_copy_to_iter"), (0.30, "python", "splice_to_socket"),
      (0.10, "ksoftirqd/1", "net_rx_action")], 2, 1.0, {"python"},
     {"machine_busy": 1.8, "iperf3": 1.0, "proxy": 0.6, "other": 0.2, "copy_from_user": 0.8, "copy_to_user": 0.2}),
    # a kernel path: no proxy process; softirq run by the idle task is busy time, not idle
    ([(0.20, "swapper", "pv_native_safe_halt"), (0.05, "swapper", "net_rx_action"),
      (0.75, "iperf3", "_copy_from_iter")], 2, 2.5, set(),
     {"machine_busy": 0.64, "iperf3": 0.6, "proxy": 0.0, "other": 0.04, "copy_from_user": 0.6, "copy_to_user": 0.0}),
])
def test_bill_per_gb(rows, cpus, gbytes_per_s, proxy_comms, expected):
    result = bulk_cpu.bill(rows, cpus, gbytes_per_s, proxy_comms)
    assert {k: result[k] for k in expected} == pytest.approx(expected)


def test_no_bytes_moved_bills_nothing():
    assert bulk_cpu.bill([(1.0, "iperf3", "x")], 2, 0.0, set())["machine_busy"] == 0.0
