#!/usr/bin/env bash
# One-time set-up on a fresh Debian/Ubuntu machine: the system tools the demo and the
# tests drive (ip, dig, curl, nft) and a virtualenv at .venv with kubeport installed.
# Safe to run again: it installs only what is missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v dig >/dev/null || need_apt+=(bind9-dnsutils)
command -v curl >/dev/null || need_apt+=(curl)
command -v nft >/dev/null || need_apt+=(nftables)
command -v getent >/dev/null || need_apt+=(libc-bin)
command -v pkill >/dev/null || need_apt+=(procps)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$repo/.venv/bin/kubeport" ] || [ "$repo/pyproject.toml" -nt "$repo/.venv/.installed" ]; then
    echo "setup: creating $repo/.venv" >&2
    python3 -m venv "$repo/.venv"
    log="$repo/.venv/install.log"
    if ! { "$repo/.venv/bin/pip" install --upgrade pip && "$repo/.venv/bin/pip" install -e "$repo[test]"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "setup: installing kubeport into $repo/.venv failed (full log: $log)" >&2
        exit 1
    fi
    touch "$repo/.venv/.installed"
fi
