#!/usr/bin/env bash
# Run a script of this repo in a user namespace of its own when it lacks the privileges that
# network namespaces need, so that the demo and the tests work unchanged for a non-root user
# and in containers without CAP_NET_ADMIN and CAP_SYS_ADMIN (docker's defaults).
#
#   . netns-scripts/userns.sh "$0" "$@"      # sourced near the top of demo.sh and tests/run.sh
#
# Sourced, it returns when the caller may go on as it is: root with CAP_NET_ADMIN and
# CAP_SYS_ADMIN, or already inside the namespace this made. Otherwise it execs the caller
# again inside `unshare --user --map-root-user --net --mount`: root there (and the owner of
# every network namespace created there), the host's files seen as before, an empty network
# namespace of its own as the "root" one. The caller does its network set-up (pip, apt)
# before sourcing this: the new network namespace reaches nothing.
#
# Run (not sourced) as `userns.sh --inside SCRIPT ARGS...`, it is the first process in the
# namespaces: it prepares the mounts that `ip netns` needs, then execs SCRIPT.

# CAP_NET_ADMIN (12) and CAP_SYS_ADMIN (21) in the effective set, as uid 0.
_userns_capable() {
    local eff
    [ "$(id -u)" -eq 0 ] || return 1
    eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
    (( (16#$eff >> 12) & 1 && (16#$eff >> 21) & 1 ))
}

# DIR as a tmpfs of the namespace's root. Where DIR is missing and its parent belongs to the
# host's root (so it cannot be made), a tmpfs goes over the parent first, with what the parent
# held bound back in (directories and files, submounts included) or copied (symlinks).
_userns_own_dir() {
    local dir=$1 parent=${1%/*} stage entry name
    if [ ! -d "$dir" ] && ! mkdir "$dir" 2>/dev/null; then
        stage=$(mktemp -d)
        mount --rbind "$parent" "$stage"
        mount -t tmpfs -o mode=0755 tmpfs "$parent"
        shopt -s nullglob dotglob
        for entry in "$stage"/*; do
            name=${entry##*/}
            if [ -L "$entry" ]; then
                cp -P "$entry" "$parent/$name"
            elif [ -d "$entry" ]; then
                mkdir "$parent/$name" && mount --rbind "$entry" "$parent/$name"
            else
                : >"$parent/$name" && mount --bind "$entry" "$parent/$name"
            fi
        done
        shopt -u nullglob dotglob
        umount -l "$stage"
        rmdir "$stage"
        mkdir "$dir"
    fi
    mount -t tmpfs -o mode=0755 tmpfs "$dir"
}

# The mounts, as the namespace's root. `ip netns add` bind-mounts each network namespace on a
# file under /run/netns (ip makes that directory a shared mount itself, so that the mount
# namespaces of `ip netns exec` see namespaces added later); `ip netns exec NS` binds the
# files of /etc/netns/NS over /etc's (a pod's resolv.conf); a daemon started without
# --state-dir keeps its state in /var/lib/kubeport. Each must be the namespace's own.
_userns_prepare() {
    mount --make-rprivate /
    _userns_own_dir /run/netns
    _userns_own_dir /etc/netns
    _userns_own_dir /var/lib/kubeport
    # A new network namespace starts with lo down; the tests and the daemon use loopback.
    ip link set lo up
}

if [ "${1:-}" = --inside ]; then
    set -euo pipefail
    shift
    _userns_prepare
    # Root here, with a non-root user's PATH: the tools (nft, sysctl) are in the sbin directories.
    export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin KUBEPORT_USERNS=1
    exec "$@"
fi

if [ -z "${KUBEPORT_USERNS:-}" ] && ! _userns_capable; then
    _userns_err=$(mktemp)
    # exec only once unshare is known to work: where user namespaces are refused, name the
    # switches involved instead of failing later in the script.
    if unshare --user --map-root-user --net --mount true 2>"$_userns_err"; then
        rm -f "$_userns_err"
        # A temporary directory of this user's: /tmp's entries made by the host's root (such as
        # pytest's /tmp/pytest-of-root) are not owned by the namespace's root. A short name:
        # the daemon's socket paths under it must fit a Unix socket address (107 bytes).
        _userns_tmp=${TMPDIR:-/tmp}/kp-$(id -u)
        mkdir -p -m 0700 "$_userns_tmp" 2>/dev/null && [ -O "$_userns_tmp" ] \
            || _userns_tmp=$(mktemp -d "${TMPDIR:-/tmp}/kp.XXXXXX")
        export TMPDIR=$_userns_tmp
        echo "$(basename "$1"): not root with CAP_NET_ADMIN and CAP_SYS_ADMIN: running in a user" \
            "namespace (unshare --user --map-root-user --net --mount); no BPF, no host-wide settings" >&2
        exec unshare --user --map-root-user --net --mount -- \
            bash "$(dirname "${BASH_SOURCE[0]}")/userns.sh" --inside "$@"
    fi
    {
        echo "$(basename "$1"): cannot create a user namespace: $(cat "$_userns_err")"
        echo "  Run as root with CAP_NET_ADMIN and CAP_SYS_ADMIN, or allow unprivileged user namespaces:"
        echo "  sysctl user.max_user_namespaces (> 0), kernel.unprivileged_userns_clone (older Debian"
        echo "  kernels: 1), kernel.apparmor_restrict_unprivileged_userns (Ubuntu 23.10+: 0); in a"
        echo "  container, a seccomp profile that allows unshare (docker's default refuses CLONE_NEWUSER"
        echo "  without CAP_SYS_ADMIN)."
    } >&2
    rm -f "$_userns_err"
    exit 1
fi
unset _userns_err _userns_tmp
