#!/usr/bin/env bash
# One-time set-up on a fresh Debian/Ubuntu machine: the system tools the demo and the
# tests drive (ip, dig, curl, nft) and a virtualenv at .venv with kubeport installed.
# Safe to run again: it installs only what is missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

# The interpreter of .venv, which runs the daemon, the tests and the benchmarks. The
# distribution's python3 (Debian, Ubuntu) is built with profile-guided and link-time
# optimisation, libpython linked into the executable; one built from source with the
# defaults (pyenv's: no --enable-optimizations, a shared libpython) is slower at every
# call. Here the Python part of a cached DNS answer took 1.1-1.3 us against 1.5-1.8, and
# a cold start at 10,000 services 8.0-8.6 CPU seconds against 9.6-10.1. The image
# (Dockerfile, python:3.11-slim) is an optimised build too. KUBEPORT_PYTHON names another.
if [ -n "${KUBEPORT_PYTHON:-}" ]; then
    python=$KUBEPORT_PYTHON
elif [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    python=/usr/bin/python3
else
    python=python3
fi
found=$(command -v "$python") || { echo "setup: no Python interpreter $python" >&2; exit 1; }
python=$(readlink -f "$found")

# A non-root user's PATH on Debian lacks the sbin directories, where nft and sysctl live.
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v dig >/dev/null || need_apt+=(bind9-dnsutils)
command -v curl >/dev/null || need_apt+=(curl)
command -v nft >/dev/null || need_apt+=(nftables)
command -v getent >/dev/null || need_apt+=(libc-bin)
command -v pkill >/dev/null || need_apt+=(procps)
command -v nsenter >/dev/null || need_apt+=(util-linux)
# deploy/kubeport.service is tested under a real systemd, PID 1 of a namespace of the test's.
[ -x /lib/systemd/systemd ] || need_apt+=(systemd)
"$python" -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        why=$([ "$(id -u)" -ne 0 ] && echo "not root" || echo "no apt-get")
        echo "setup: missing Debian packages: ${need_apt[*]}; cannot install them ($why)." >&2
        echo "setup: install them (as root: apt-get install ${need_apt[*]}), then run this again." >&2
        exit 1
    fi
    echo "setup: installing ${need_apt[*]}" >&2
    "$repo/netns-scripts/apt-install.sh" "${need_apt[@]}"
fi

if [ ! -x "$repo/.venv/bin/kubeport" ] || [ "$repo/pyproject.toml" -nt "$repo/.venv/.installed" ] \
        || [ "$(cat "$repo/.venv/.installed" 2>/dev/null)" != "$python" ]; then
    echo "setup: creating $repo/.venv with $python" >&2
    "$python" -m venv --clear "$repo/.venv"
    log="$repo/.venv/install.log"
    if ! { "$repo/.venv/bin/pip" install --upgrade pip && "$repo/.venv/bin/pip" install -e "$repo[test]"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "setup: installing kubeport into $repo/.venv failed (full log: $log)" >&2
        exit 1
    fi
    echo "$python" >"$repo/.venv/.installed"
fi
# An editable install is not byte-compiled, and where PYTHONDONTWRITEBYTECODE is set (CI
# images often set it) every daemon start would compile its ~130 modules again: ~0.1 s of a
# restart that should answer within 0.5 s. Stale files are recompiled, never trusted. A user
# who may not write the checkout (another's, read-only) runs without: slower starts, same code.
if [ -w "$repo/kubeport" ]; then
    "$repo/.venv/bin/python" -m compileall -q "$repo/kubeport" "$repo/proxy" "$repo/dns" "$repo/endpoints" >/dev/null
fi
