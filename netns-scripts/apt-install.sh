#!/usr/bin/env bash
# apt-get update, then install the packages named, waiting for another apt or dpkg process
# (unattended-upgrades on a fresh cloud machine) to let go of its lock instead of failing.
# dpkg's lock is waited for by apt itself (DPkg::Lock::Timeout); the package lists' lock is
# not covered by that option, so `update` is tried again while another process holds it.
set -euo pipefail
wait_seconds=${KUBEPORT_APT_LOCK_TIMEOUT:-300}
retry_seconds=${KUBEPORT_APT_RETRY_SECONDS:-5}
export DEBIAN_FRONTEND=noninteractive

apt_get() {
    local deadline=$((SECONDS + wait_seconds)) err
    err=$(mktemp)
    until apt-get -o DPkg::Lock::Timeout="$wait_seconds" "$@" 2>"$err"; do
        if ! grep -q "Could not get lock" "$err" || [ "$SECONDS" -ge "$deadline" ]; then
            cat "$err" >&2
            rm -f "$err"
            return 1
        fi
        echo "apt-install: another apt process holds its lock; waiting" >&2
        sleep "$retry_seconds"
    done
    rm -f "$err"
}

apt_get update -qq
apt_get install -y -qq --no-install-recommends "$@" >/dev/null
