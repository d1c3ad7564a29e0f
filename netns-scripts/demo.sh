#!/usr/bin/env bash
# The kubeport demo: a two-node topology in network namespaces, kubeport on node-a serving
# the manifests in examples/, and dig and curl from a pod and from an outside client.
# Run as root on a fresh machine: it installs what it needs (netns-scripts/setup.sh). Without
# root's network privileges it runs in a user namespace of its own (netns-scripts/userns.sh).
# Everything lives in namespaces named kpdemo-*; they are removed when the demo ends.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${KUBEPORT_DEMO_PREFIX:-kpdemo}
keep=${KUBEPORT_DEMO_KEEP:-}          # set to 1 to leave the topology and daemon running

# Set-up first: it may need the network (pip, apt), which a new user namespace's has not.
[ -n "${KUBEPORT_USERNS:-}" ] || "$repo/netns-scripts/setup.sh"
. "$repo/netns-scripts/userns.sh" "$0" "$@"
kubeport=${KUBEPORT_BIN:-$repo/.venv/bin/kubeport}   # KUBEPORT_BIN: an installed kubeport instead
work=$(mktemp -d /tmp/kubeport-demo.XXXXXX)
pids=()
# node-a's pods' processes go in a cgroup of their own, as the kubelet puts a node's pods under
# kubepods.slice: kubeport balances their connects in the kernel (--connect-balancing-cgroup).
cgroup2=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") { print $5; exit } break } }' \
    /proc/self/mountinfo)
pods_cgroup=""
if [ -n "$cgroup2" ] && mkdir -p "$cgroup2/$prefix-node-a-pods" 2>/dev/null; then
    pods_cgroup="$cgroup2/$prefix-node-a-pods"
fi

cleanup() {
    [ -n "$keep" ] && { echo "left running: namespaces $prefix-*, state in $work"; return; }
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    "$repo/netns-scripts/topology.sh" down --prefix "$prefix" >/dev/null 2>&1 || true
    [ -z "$pods_cgroup" ] || rmdir "$pods_cgroup" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }
in_ns() { ip netns exec "$prefix-$1" "${@:2}"; }
# A process of node-a's pod $1: it joins the pods' cgroup, then enters the pod's namespace.
in_pod() {
    if [ -n "$pods_cgroup" ]; then
        # joining may be refused (a user namespace): then the relay serves it, as the status says
        sh -c 'echo $$ 2>/dev/null > "$0/cgroup.procs"; exec "$@"' "$pods_cgroup" ip netns exec "$prefix-$1" "${@:2}"
    else
        in_ns "$@"
    fi
}

step "Topology: node-a (zone-a) and node-b (zone-b), two pods each, a client outside the cluster"
"$repo/netns-scripts/topology.sh" up --prefix "$prefix" --pods-per-node 2 >/dev/null
for pod in a1 a2 b1 b2; do
    in_ns "$pod" python3 "$repo/netns-scripts/podserver.py" --name "$pod" >"$work/$pod.log" 2>&1 &
    pids+=($!)
done

step "kubeport on node-a with examples/"
in_ns node-a "$kubeport" run --manifests "$repo/examples" --hostname-override node-a \
    --state-dir "$work/state" --upstream 192.168.50.200 \
    --cluster-cidr 10.244.0.0/16,fd00:10:244::/56 \
    ${pods_cgroup:+--connect-balancing-cgroup "/${pods_cgroup#"$cgroup2"/}"} >"$work/kubeport.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    code=$(in_ns node-a curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:10256/readyz || true)
    [ "$code" = 200 ] && break
    sleep 0.1
done
[ "$code" = 200 ] || { echo "kubeport did not become ready:"; cat "$work/kubeport.log"; exit 1; }
for pod in a1 a2 b1 b2; do grep -q ready "$work/$pod.log" || sleep 0.2; done

step "What kubeport holds (kubectl's columns)"
show in_ns node-a "$kubeport" get services -A

step "The Pods it read, and the EndpointSlices it made of them for the Services' selectors"
show in_ns node-a "$kubeport" get pods -n demo
show in_ns node-a "$kubeport" get endpointslices -n demo
web_ip=$(in_ns node-a "$kubeport" get services -n demo -o json |
    python3 -c 'import json,sys; print(next(s["spec"]["clusterIP"] for s in json.load(sys.stdin)["items"] if s["metadata"]["name"]=="web"))')

step "DNS from pod a1: A, SRV and a headless service"
show in_ns a1 dig +short @10.96.0.10 web.demo.svc.cluster.local A
show in_ns a1 dig +short @10.96.0.10 _http._tcp.web.demo.svc.cluster.local SRV
show in_ns a1 dig +short @10.96.0.10 db.demo.svc.cluster.local A

step "curl the ClusterIP $web_ip from pod a1 (10.244.1.11): answered by different pods, who see a1"
for _ in 1 2 3 4 5 6; do show in_pod a1 curl -s --max-time 2 "http://$web_ip/"; done

step "Which path served them: a1's own connect() went straight to the pod (no relay), or the relay"
in_ns node-a "$kubeport" get status -o json |
    python3 -c 'import json,sys; print("podTraffic:", json.load(sys.stdin)["proxy"]["podTraffic"])'
show in_ns node-a sh -c "curl -s http://127.0.0.1:10249/metrics | grep '^kubeport_proxy_connects_balanced_total{service_port=\"demo/web:' || true"

step "curl the NodePort 192.168.50.11:30080 from the client outside the cluster: pods see node-a"
for _ in 1 2 3 4; do show in_ns client curl -s --max-time 2 http://192.168.50.11:30080/; done

step "curl the externalTrafficPolicy Local NodePort 192.168.50.11:30081: node-a's pods, who see the client"
for _ in 1 2 3 4; do show in_ns client curl -s --max-time 2 http://192.168.50.11:30081/; done

step "Done. kubeport's log:"
tail -n 5 "$work/kubeport.log"
