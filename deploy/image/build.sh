#!/usr/bin/env bash
# kubeport's image, built without a container registry (docs/image.md):
#   1. the wheel, `pip wheel --no-deps` of the repository's files;
#   2. a Debian bookworm base made with mmdebstrap from Debian's packages (python3, its venv
#      module, nftables, iproute2, ca-certificates, netbase), imported into podman's storage;
#   3. the repository's Dockerfile built on that base (--build-arg BASE=...), the wheel handed
#      in as its "wheel" stage (--build-context wheel=...).
# The image is tagged localhost/kubeport:src-<hash of the files it is built from>; when that
# tag exists nothing is built again (--force builds anyway). The image's name is the last line
# on stdout; the rest goes to stderr. Needs root and the Debian packages podman, mmdebstrap
# (and runc where crun cannot run: below).
#
#   deploy/image/build.sh [--force] [--tag NAME]  build (or find) the image; print its name
#   deploy/image/build.sh --podman-args           podman's global options here, one a line
#   deploy/image/build.sh --run-args              options every `podman run` here needs, one a line
#
# Environment: KUBEPORT_DEBIAN_MIRROR, KUBEPORT_DEBIAN_SECURITY_MIRROR (Debian's by default),
# KUBEPORT_OCI_RUNTIME (crun or runc; chosen below if unset), KUBEPORT_STORAGE_DRIVER (podman's
# default if unset: overlay), KUBEPORT_PYTHON (the interpreter that builds the wheel).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)

SUITE=bookworm
# netbase: /etc/protocols, through which nft resolves the protocol names of kubeport's rules
# (python:3.11-slim-bookworm installs it for the same reason).
BASE_PACKAGES=(python3 python3-venv nftables iproute2 ca-certificates netbase)
# What the image is built from: the Dockerfile's COPYs and this script. Its hash names the image.
INPUTS=(Dockerfile pyproject.toml setup.py README.md kubeport endpoints proxy dns deploy/image/build.sh)
mirror=${KUBEPORT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${KUBEPORT_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

log() { echo "build.sh: $*" >&2; }

# crun (podman's default runtime) refuses a host with cgroup v1 and v2 both mounted while a
# controller is left on v2 ("cgroups in hybrid mode not supported"); runc runs there.
oci_runtime() {
    if [ -n "${KUBEPORT_OCI_RUNTIME:-}" ]; then
        echo "$KUBEPORT_OCI_RUNTIME"
    elif [ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ]; then
        echo runc
    fi
}

podman_args() {
    local runtime
    runtime=$(oci_runtime)
    [ -z "$runtime" ] || echo "--runtime=$runtime"
    [ -z "${KUBEPORT_STORAGE_DRIVER:-}" ] || echo "--storage-driver=$KUBEPORT_STORAGE_DRIVER"
}

# Rootful podman asks the runtime for RLIMIT_NOFILE and RLIMIT_NPROC of 1048576 and more;
# without CAP_SYS_RESOURCE (a VM's or CI runner's root may lack it) no limit can be raised,
# and the container fails to start. The limits of the caller are passed on instead, as a
# container under containerd inherits containerd's own. podman lowers its RLIMIT_NPROC to
# kernel.pid_max, so that is the most it can pass.
run_args() {
    local nofile nproc pid_max
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max)
    [ "$nofile" != unlimited ] || nofile=1048576
    if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; then nproc=$pid_max; fi
    echo "--ulimit=nofile=$nofile:$nofile"
    echo "--ulimit=nproc=$nproc:$nproc"
}

force=false
tag=
while [ $# -gt 0 ]; do
    case $1 in
        --podman-args) podman_args; exit 0 ;;
        --run-args) run_args; exit 0 ;;
        --force) force=true ;;
        --tag) tag=$2; shift ;;
        *) echo "usage: $0 [--force] [--tag NAME] | --podman-args | --run-args" >&2; exit 2 ;;
    esac
    shift
done

missing=()
for tool in podman mmdebstrap git; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "missing ${missing[*]}: apt-get install podman mmdebstrap git (and runc where crun fails)"
    exit 1
fi
[ "$(id -u)" = 0 ] || { log "needs root (podman's storage and mmdebstrap's chroot are root's)"; exit 1; }

mapfile -t podman_global < <(podman_args)
mapfile -t run_opts < <(run_args)
pm() { podman "${podman_global[@]}" "$@"; }

work=$(mktemp -d /tmp/kubeport-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The inputs as they are in the working tree (tracked or new, not ignored), copied to a
# context of their own: the hash covers exactly what is built, uncommitted edits included.
cd "$repo"
git ls-files -z --cached --others --exclude-standard -- "${INPUTS[@]}" \
    | while IFS= read -r -d '' path; do [ -f "$path" ] && printf '%s\0' "$path"; done >"$work/files"
mkdir "$work/context"
tar -C "$repo" --null -T "$work/files" -cf - | tar -C "$work/context" -xf -
key=$(cd "$work/context" && tr '\0' '\n' <"$work/files" | sort | while read -r path; do
        printf '%s %s\n' "$(git hash-object --no-filters "$path")" "$path"
      done | sha256sum | cut -c1-16)
image=localhost/kubeport:src-$key

if ! $force && pm image exists "$image"; then
    log "$image is up to date (its inputs are unchanged)"
else
    # The base: its name says what it holds; made once per machine (a fresh CI machine makes it).
    base_key=$(printf '%s\n' "$SUITE" "${BASE_PACKAGES[@]}" "$mirror" "$security_mirror" | sha256sum | cut -c1-12)
    base=localhost/kubeport-base:$SUITE-$base_key
    if ! pm image exists "$base"; then
        log "making the base $base with mmdebstrap"
        # minbase: Essential and apt; merged /usr as bookworm's own images have it (without the
        # hook the usrmerge package and Perl come along). Docs, manuals and translations are
        # not unpacked; mmdebstrap removes apt's lists and cache itself.
        mmdebstrap --variant=minbase --quiet \
            --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            --include="$(IFS=,; echo "${BASE_PACKAGES[*]}")" \
            --aptopt='APT::Install-Recommends "false"' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            --dpkgopt='path-exclude=/usr/share/info/*' \
            "$SUITE" "$work/base.tar" \
            "deb $mirror $SUITE main" "deb $mirror $SUITE-updates main" \
            "deb $security_mirror $SUITE-security main" >"$work/mmdebstrap.log" 2>&1 \
            || { tail -n 30 "$work/mmdebstrap.log" >&2; log "mmdebstrap failed"; exit 1; }
        pm import --quiet \
            --change 'ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD=["/bin/bash"]' \
            "$work/base.tar" "$base" >/dev/null
        rm -f "$work/base.tar"
        pm images --format '{{.Repository}}:{{.Tag}}' --filter reference=localhost/kubeport-base \
            | grep -vxF "$base" | xargs -r podman "${podman_global[@]}" rmi >/dev/null || true
    fi

    log "building the wheel"
    python=${KUBEPORT_PYTHON:-python3}
    if [ -x "$repo/.venv/bin/pip" ]; then
        pip=$repo/.venv/bin/pip
    else
        "$python" -m venv "$work/venv" >&2
        pip=$work/venv/bin/pip
    fi
    mkdir -p "$work/wheel/wheel"
    "$pip" wheel --quiet --no-deps --wheel-dir "$work/wheel/wheel" "$work/context" >&2
    rm -rf "$work/context/build" "$work/context"/*.egg-info

    log "building $image from the Dockerfile on $base"
    # pip in RUN trusts the CAs the host trusts (an egress proxy's own CA, where there is one):
    # the host's bundle is mounted over the base's for the build only (Debian's pip reads the
    # system bundle), over a file that exists, so the image keeps no trace of it. Host
    # network: no bridge, NAT or firewall needed on the host for pip to reach PyPI.
    ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
    trust=()
    [ ! -f "$ca" ] || trust=(--volume "$(readlink -f "$ca"):/etc/ssl/certs/ca-certificates.crt:ro")
    runtime=$(oci_runtime)
    pm build --quiet --layers=false --network=host ${runtime:+"--runtime=$runtime"} "${run_opts[@]}" "${trust[@]}" \
        --build-arg "BASE=$base" --build-context "wheel=$work/wheel" \
        --label "io.kubeport.inputs=$key" --label "io.kubeport.base=$base" \
        --file "$work/context/Dockerfile" --tag "$image" "$work/context" >/dev/null
    # Earlier builds from other inputs: a few hundred MB each, and nothing refers to them.
    pm images --format '{{.Repository}}:{{.Tag}}' --filter reference=localhost/kubeport \
        | grep -E '^localhost/kubeport:src-' | grep -vxF "$image" | xargs -r podman "${podman_global[@]}" rmi >/dev/null || true
fi
[ -z "$tag" ] || pm tag "$image" "$tag"
size=$(pm image inspect --format '{{.Size}}' "$image")
log "$image: $((size / 1000000)) MB"
echo "$image"
