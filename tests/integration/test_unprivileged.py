"""The demo without the host's privileges: as uid 65534, and as root with only the
capabilities a docker container has by default (moby's oci/caps/defaults.go), demo.sh says
in one line that it re-enters itself in a user namespace (netns-scripts/userns.sh), then
serves DNS and HTTP from both nodes as it does for root. The integration suite's own run in
that state is .ci/unprivileged."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from support.netns import REPO, run_in

pytestmark = [
    pytest.mark.integration,
    # Switching to another uid, or dropping capabilities, is what the host's root does here.
    pytest.mark.host_privileges("switching to uid 65534 and dropping capabilities"),
]

DEMO = REPO / "netns-scripts" / "demo.sh"
DOCKER_CAPS = ("chown", "dac_override", "fsetid", "fowner", "mknod", "net_raw", "setgid", "setuid", "setfcap",
               "setpcap", "net_bind_service", "sys_chroot", "kill", "audit_write")
#: a non-root login's PATH: no sbin directories, where nft and sysctl are
USER_PATH = "/usr/local/bin:/usr/bin:/bin"
AS = {
    "uid-65534": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                  "env", "HOME=/nonexistent", "USER=nobody", "LOGNAME=nobody", f"PATH={USER_PATH}"],
    "docker-caps": ["setpriv", "--bounding-set", ",".join(["-all", *(f"+{cap}" for cap in DOCKER_CAPS)]),
                    "--inh-caps", "-all", "--"],
}


def readable_by_nobody() -> str | None:
    """Why uid 65534 cannot run the checkout's demo and .venv, or None."""
    done = run_in(None, *AS["uid-65534"], "sh", "-c", f'test -x "{DEMO}" && test -x "{REPO}/.venv/bin/kubeport"',
                  check=False)
    return None if done.returncode == 0 else f"uid 65534 cannot read {REPO} and its .venv"


@pytest.mark.parametrize("who", AS)
def test_the_demo_reenters_in_a_user_namespace_and_serves(who, tmp_path):
    if who == "uid-65534" and (why := readable_by_nobody()):
        pytest.skip(why)
    # The checkout's kubeport (an installed one, $KUBEPORT_BIN, is another test's), and the
    # demo deciding for itself whether to re-enter.
    env = {key: value for key, value in os.environ.items() if key not in ("KUBEPORT_BIN", "KUBEPORT_USERNS", "TMPDIR")}
    done = subprocess.run([*AS[who], str(DEMO)], cwd=tmp_path if who == "docker-caps" else "/", env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"demo.sh failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    reentered = [line for line in done.stderr.splitlines() if "running in a user namespace" in line]
    assert len(reentered) == 1 and reentered[0].startswith("demo.sh: "), done.stderr
    assert re.search(r"^10\.\d+\.\d+\.\d+$", done.stdout, re.M), "dig +short gave no ClusterIP"
    for node in "ab":
        assert re.search(rf"pod={node}[12] ", done.stdout), f"no answer from a pod of node-{node}:\n{done.stdout}"
