#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests in network namespaces
# (as root, or else in a user namespace of its own: netns-scripts/userns.sh). Does its own
# set-up on a fresh machine. Extra arguments go to pytest.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# Set-up first: it may need the network (pip, apt), which a new user namespace's has not.
[ -n "${KUBEPORT_USERNS:-}" ] || "$repo/netns-scripts/setup.sh"
. "$repo/netns-scripts/userns.sh" "$0" "$@"
cd "$repo"
exec "$repo/.venv/bin/pytest" "$@"
