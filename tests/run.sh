#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests in network namespaces
# (needs root). Does its own set-up on a fresh machine. Extra arguments go to pytest.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/netns-scripts/setup.sh"
cd "$repo"
exec "$repo/.venv/bin/pytest" "$@"
