"""A relay worker process (``--workers N``): its channel to the socket holder, if it was
started with one, then the proxy's worker loop (kubeport/proxy/workers/worker.py).

The worker loop is the proxy's; the holder is kubeport's own (kubeport/survival): this entry
joins them, so that the proxy never imports the survival machinery.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from kubeport.proxy.workers.worker import main as worker_main
    from kubeport.survival.sockethold import SocketHold

    return worker_main(argv, SocketHold.from_environment())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
