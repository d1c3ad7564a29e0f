"""`kubeport` command line: run, get, check, version. Exit codes are chosen here only.

A kube-proxy command line works as it is: without a subcommand the flags are `run`'s
(``kubeport --config=/var/lib/kube-proxy/config.conf --hostname-override=$(NODE_NAME)``), and
``--cleanup`` removes what kubeport leaves on the host and exits, as kube-proxy's does;
``--init-only`` sets the node's sysctls and exits, as kube-proxy's does (kubeport.nodesettings)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from kubeport import config as config_module
from kubeport.config import ConfigError, KubeportConfiguration
from kubeport.lib.logformat import configure_logging
from kubeport.lib.version import __version__

log = logging.getLogger("kubeport")


class _Verbosity(argparse.Action):
    """klog's ``-v``/``--v LEVEL`` (``-v=2``, ``--v=2``, ``-v 2``, ``-v2``) as kube-proxy takes it,
    and the counting ``-v``, ``-vv``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", default=None, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 value: Any, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest) or 0
        if value is None:
            level = current + 1
        elif value and value.strip("v") == "":  # -vv: argparse hands over the "v"
            level = current + 1 + len(value)
        elif value.isascii() and value.isdigit():
            level = int(value)
        else:
            parser.error(f"argument {option_string}: expected a level (-v=2, --v=2, -v 2) or -v/-vv, "
                         f"got {value!r}")
        setattr(namespace, self.dest, level)


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run the daemon (service proxy + cluster DNS)")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--manifests", metavar="DIR", help="directory of manifests (default source)")
    source.add_argument("--kubeconfig", metavar="FILE", help="read a kube-apiserver through this kubeconfig")
    source.add_argument("--in-cluster", action="store_true", help="read the kube-apiserver as a pod")
    run.add_argument("--config", metavar="FILE",
                     help="configuration file: KubeportConfiguration, or kube-proxy's KubeProxyConfiguration")
    run.add_argument("--cleanup", action="store_true",
                     help="remove the service addresses, nftables table and routing rule kubeport leaves on "
                          "this host, and the state directory's leftovers; then exit")
    run.add_argument("--init-only", action="store_true",
                     help="set the node's kernel settings kubeport relies on (net.ipv4.tcp_migrate_req; "
                          "ip_local_reserved_ports where the NodePort range overlaps the ephemeral ports), which "
                          "needs full root privileges, and exit (kube-proxy's; a privileged init container)")
    run.add_argument("--proxy-mode", metavar="MODE",
                     help="kube-proxy's; ignored (with a line): kubeport is its own userspace proxy")
    run.add_argument("--bind-address", metavar="IP",
                     help="an IPv6 one moves the healthz/metrics defaults to [::] and [::1] (kube-proxy's)")
    run.add_argument("--config-sync-period", metavar="DURATION", help="kube-proxy's informer resync period")
    run.add_argument("--hostname-override", metavar="NODE", help="this node's name (default: hostname)")
    run.add_argument("--cluster-domain", metavar="ZONE")
    run.add_argument("--service-cluster-ip-range", metavar="CIDR[,CIDR]")
    run.add_argument("--service-node-port-range", metavar="LOW-HIGH")
    run.add_argument("--nodeport-addresses", metavar="primary|localhost|all|CIDR,...")
    run.add_argument("--cluster-cidr", metavar="CIDR[,CIDR]", help="pod CIDRs (in-cluster traffic sources)")
    run.add_argument("--dns-address", metavar="IP", action="append", help="DNS listen address (repeatable)")
    run.add_argument("--dns-port", type=int, metavar="PORT")
    run.add_argument("--dns-ttl", type=int, metavar="SECONDS")
    run.add_argument("--pods", choices=["disabled", "insecure", "verified"], help="DNS pod records mode")
    run.add_argument("--endpoint-pod-names", action=argparse.BooleanOptionalAction, default=None,
                     help="name an endpoint without hostname after its Pod (CoreDNS endpoint_pod_names)")
    run.add_argument("--dns-namespaces", metavar="NS,...",
                     help="serve only these namespaces (CoreDNS namespaces; default all)")
    run.add_argument("--ignore-empty-service", action=argparse.BooleanOptionalAction, default=None,
                     help="NXDOMAIN for a ClusterIP Service without ready endpoints (CoreDNS ignore empty_service)")
    run.add_argument("--noendpoints", action=argparse.BooleanOptionalAction, default=None,
                     help="no endpoint records: headless Services and endpoint names NXDOMAIN (CoreDNS noendpoints)")
    run.add_argument("--dns-labels", metavar="SELECTOR",
                     help="serve only the Services this label selector matches (CoreDNS labels)")
    run.add_argument("--dns-namespace-labels", metavar="SELECTOR",
                     help="serve only the namespaces whose Namespace this label selector matches "
                     "(CoreDNS namespace_labels)")
    run.add_argument("--dns-autopath", action=argparse.BooleanOptionalAction, default=None,
                     help="complete a pod's search path server-side, the querying pod found among this node's "
                     "Pods (CoreDNS autopath @kubernetes)")
    run.add_argument("--dns-reverse-zones", metavar="ZONE|CIDR,...",
                     help="reverse zones answered (default in-addr.arpa,ip6.arpa; empty: none)")
    run.add_argument("--dns-fallthrough", metavar="ZONE,...",
                     help="zones whose unknown names are forwarded, not NXDOMAIN (CoreDNS fallthrough; "
                          "default in-addr.arpa,ip6.arpa; '.': every zone; empty: none)")
    run.add_argument("--dns-serve-stale", metavar="DURATION",
                     help="answer from upstream answers expired up to this long while upstreams fail "
                          "(CoreDNS cache serve_stale; default 0: never)")
    run.add_argument("--dns-serve-stale-refresh-mode", choices=["immediate", "verify"],
                     help="serve_stale's REFRESH_MODE (default immediate)")
    run.add_argument("--dns-prefetch", type=int, metavar="AMOUNT",
                     help="refresh upstream answers asked AMOUNT times in the last 10%% of their TTL "
                          "(CoreDNS cache prefetch; default 0: never)")
    run.add_argument("--upstream", metavar="IP[:PORT]", action="append", help="upstream resolver (repeatable)")
    run.add_argument("--dns-stub-domain", metavar="ZONE=IP[:PORT][;IP[:PORT]...][,ZONE=...]", action="append",
                     help="forward the names under ZONE to these servers instead of the upstreams, the longest "
                          "zone winning (kube-dns stubDomains; IPv6 as [ADDR]:PORT; repeatable)")
    run.add_argument("--dns-lame-duck", metavar="DURATION", help="keep answering this long after SIGTERM (5s)")
    run.add_argument("--dns-startup-timeout", metavar="DURATION",
                     help="without a restored state, wait up to this long for the first sync before DNS listens "
                          "(CoreDNS kubernetes startup_timeout; default 0: listen at once)")
    run.add_argument("--state-dir", metavar="DIR")
    run.add_argument("--hold-sockets", action="store_const", const=True, default=None,
                     help="a supervisor holds the listening sockets and restarts a killed daemon at once")
    run.add_argument("--fd-store", metavar="DIR",
                     help="with --hold-sockets: the directory of a `kubeport fd-store` sidecar that keeps the "
                          "held sockets while this container restarts")
    run.add_argument("--last-state-max-age", metavar="DURATION",
                     help="serve the last applied state kept in the state dir at start, until the source has "
                          "synced, if it is younger than this (default 1h; 0: never)")
    run.add_argument("--healthz-bind-address", metavar="IP[:PORT]",
                     help="/healthz, /livez, /readyz (default 0.0.0.0:10256). Set empty to disable.")
    run.add_argument("--metrics-bind-address", metavar="IP[:PORT]",
                     help="/metrics, /healthz, /proxyMode, /readyz (default 127.0.0.1:10249). Set empty to disable.")
    run.add_argument("--status-bind-address", metavar="IP:PORT",
                     help="serve the status API (`kubeport get --server`) over TCP too, readable by whoever "
                          "reaches it (default: only the owner-only Unix socket in the state directory)")
    run.add_argument("--dns-metrics-bind-address", metavar="IP[:PORT]",
                     help="the DNS server's /metrics, CoreDNS's series only (default 0.0.0.0:9253, NodeLocal "
                          "DNSCache's). Set empty to disable.")
    run.add_argument("--vip-interface", metavar="LINK",
                     help="link the service addresses' local routes go through (default lo)")
    run.add_argument("--conntrack-udp-timeout", metavar="DURATION",
                     help="idle timeout of a UDP flow (default 30s)")
    run.add_argument("--udp-idle-timeout", metavar="DURATION", help="alias of --conntrack-udp-timeout")
    run.add_argument("--conntrack-udp-timeout-stream", metavar="DURATION",
                     help="idle timeout of a UDP flow the endpoint answered, in use past 2 s (default 2m)")
    run.add_argument("--shutdown-grace-period", metavar="DURATION", help="connection drain time on SIGTERM")
    run.add_argument("--workers", type=int, metavar="N", help="relay processes sharing the listeners (default 1)")
    run.add_argument("--tcp-relay", choices=["auto", "sockmap", "splice"],
                     help="bulk TCP bytes: spliced through pipes (default splice), in the kernel through a BPF "
                          "sockmap (experimental), or auto: the sockmap when it loads")
    run.add_argument("--keep-client-address", action=argparse.BooleanOptionalAction, default=None,
                     help="endpoints see the client's address where kube-proxy keeps it (default on); "
                          "--no-keep-client-address: always the node's")
    run.add_argument("--connect-balancing", action=argparse.BooleanOptionalAction, default=None,
                     help="the node's pods reach Services straight at an endpoint, translated by BPF programs "
                          "inside connect() (default on); --no-connect-balancing: through the relay")
    run.add_argument("--connect-balancing-cgroup", metavar="PATH",
                     help="the cgroup v2 whose processes are balanced at connect() (default /: every process)")
    run.add_argument("--bpf-root", metavar="DIR", help="the bpffs for the pinned programs and maps "
                     "(default /sys/fs/bpf; mounted there if it is not one)")
    run.add_argument("--after-handover", choices=["exit", "wait"],
                     help="once a new instance took over: exit (default), or wait for SIGTERM (a DaemonSet pod)")
    run.add_argument("--handover-generation", metavar="N",
                     help="never take the node over from an instance of a later generation (default 0; "
                          "empty: 0, as a missing pod label reads through the downward API)")
    run.add_argument("--ready-file", metavar="FILE",
                     help="present while this process serves the node and is ready (a pod's exec readiness probe)")
    run.add_argument("--live-file", metavar="FILE",
                     help="renewed every 5 s while this process is live, with the second until which it "
                          "vouches (a pod's exec liveness probe)")
    run.add_argument("--log-format", choices=["text", "json"])
    run.add_argument("--write-config-to", metavar="FILE", help="write the effective configuration and exit")
    run.add_argument("-v", "--v", "--verbose", dest="v", action=_Verbosity, metavar="LEVEL",
                     help="log verbosity: -v=N / --v=N as kube-proxy (1+: debug), or -v, -vv")


#: Configuration field (file path, camelCase) -> the flags of `kubeport run` that set it,
#: kube-proxy's name first: it wins when both are given.
FIELD_FLAGS: dict[str, tuple[str, ...]] = {
    "manifests": ("--manifests",),
    "clientConnection.kubeconfig": ("--kubeconfig",),
    "inCluster": ("--in-cluster",),
    "hostnameOverride": ("--hostname-override",),
    "bindAddress": ("--bind-address",),
    "configSyncPeriod": ("--config-sync-period",),
    "stateDir": ("--state-dir",),
    "lastStateMaxAge": ("--last-state-max-age",),
    "holdSockets": ("--hold-sockets",),
    "fdStore": ("--fd-store",),
    "healthzBindAddress": ("--healthz-bind-address",),
    "metricsBindAddress": ("--metrics-bind-address",),
    "statusBindAddress": ("--status-bind-address",),
    "dnsMetricsBindAddress": ("--dns-metrics-bind-address",),
    "vipInterface": ("--vip-interface",),
    "conntrack.udpTimeout": ("--conntrack-udp-timeout", "--udp-idle-timeout"),
    "conntrack.udpStreamTimeout": ("--conntrack-udp-timeout-stream",),
    "serviceClusterIPRange": ("--service-cluster-ip-range",),
    "serviceNodePortRange": ("--service-node-port-range",),
    "nodePortAddresses": ("--nodeport-addresses",),
    "clusterCIDR": ("--cluster-cidr",),
    "shutdownGracePeriod": ("--shutdown-grace-period",),
    "logFormat": ("--log-format",),
    "workers": ("--workers",),
    "tcpRelay": ("--tcp-relay",),
    "keepClientAddress": ("--keep-client-address",),
    "connectBalancing": ("--connect-balancing",),
    "connectBalancingCgroup": ("--connect-balancing-cgroup",),
    "bpfRoot": ("--bpf-root",),
    "afterHandover": ("--after-handover",),
    "readyFile": ("--ready-file",),
    "liveFile": ("--live-file",),
    "handoverGeneration": ("--handover-generation",),
    "verbosity": ("--v",),
    "dns.clusterDomain": ("--cluster-domain",),
    "dns.addresses": ("--dns-address",),
    "dns.port": ("--dns-port",),
    "dns.ttl": ("--dns-ttl",),
    "dns.pods": ("--pods",),
    "dns.upstreams": ("--upstream",),
    "dns.stubDomains": ("--dns-stub-domain",),
    "dns.endpointPodNames": ("--endpoint-pod-names",),
    "dns.namespaces": ("--dns-namespaces",),
    "dns.ignoreEmptyService": ("--ignore-empty-service",),
    "dns.noendpoints": ("--noendpoints",),
    "dns.autopath": ("--dns-autopath",),
    "dns.labels": ("--dns-labels",),
    "dns.namespaceLabels": ("--dns-namespace-labels",),
    "dns.reverseZones": ("--dns-reverse-zones",),
    "dns.fallthrough": ("--dns-fallthrough",),
    "dns.serveStale": ("--dns-serve-stale",),
    "dns.prefetch": ("--dns-prefetch",),
    "dns.serveStaleRefreshMode": ("--dns-serve-stale-refresh-mode",),
    "dns.lameDuck": ("--dns-lame-duck",),
    "dns.startupTimeout": ("--dns-startup-timeout",),
}

#: Flag values that are not the field's value as given.
_CONVERT = {
    "--in-cluster": lambda given: True if given else None,
    "--nodeport-addresses": lambda text: _csv(text),
    "--dns-namespaces": lambda text: _csv(text),
    "--dns-reverse-zones": lambda text: _csv(text),
    "--dns-fallthrough": lambda text: _csv(text),
    # The configuration validates the number (the error names the flag); empty is unset.
    "--handover-generation": lambda text: text.strip() or None if text is not None else None,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeport", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    get = sub.add_parser("get", help="show what the running daemon holds")
    get.add_argument("resource", choices=["services", "svc", "endpointslices", "endpointslice", "eps", "pods", "pod",
                                          "po", "status"],
                     help="status: the source's progress (list/watch counters) and what is served")
    scope = get.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default="default")
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    get.add_argument("-o", "--output", choices=["wide", "json", "yaml"])
    _add_status_address(get)
    env = sub.add_parser("env", help="the service environment variables the kubelet gives a pod of a namespace")
    env.add_argument("-n", "--namespace", default="default")
    env.add_argument("-o", "--output", choices=["json"], help="json: a list of {name, value}, as a container's env")
    _add_status_address(env)
    check = sub.add_parser("check", help="validate a directory of manifests")
    check.add_argument("directory")
    check.add_argument("--service-cluster-ip-range", default="10.96.0.0/12")
    check.add_argument("--service-node-port-range", default="30000-32767")
    store = sub.add_parser("fd-store", help="keep the held sockets of a pod's kubeport container while it "
                                            "restarts (a sidecar; see --fd-store)")
    store.add_argument("directory", help="shared with the kubeport container (an emptyDir)")
    store.add_argument("--max", type=int, default=65536, help="descriptors kept at most (65536)")
    sub.add_parser("version", help="print the version")
    return parser


def _given(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """{field path: (flag, value)} of the flags that were given."""
    given: dict[str, tuple[str, Any]] = {}
    for path, flags in FIELD_FLAGS.items():
        for flag in flags:
            value = getattr(args, flag.lstrip("-").replace("-", "_"))
            value = _CONVERT[flag](value) if flag in _CONVERT else value
            if value is not None:
                given[path] = (flag, value)
                break
    return given


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, as configuration-file fields (camelCase, nested)."""
    values: dict[str, Any] = {}
    for path, (_, value) in _given(args).items():
        *parents, leaf = path.split(".")
        node = values
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return values


def flag_names(args: argparse.Namespace) -> dict[str, str]:
    """{field path: the flag that set it}: errors in those fields name the flag."""
    return {path: flag for path, (flag, _) in _given(args).items()}


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = build_configuration(args)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"kubeport: invalid configuration: {line}", file=sys.stderr)
        return 2
    if args.write_config_to:
        Path(args.write_config_to).write_text(config.to_yaml())
        print(f"kubeport: wrote the effective configuration to {args.write_config_to}", file=sys.stderr)
        return 0
    configure_logging(config.log_format, config.verbosity)
    if args.proxy_mode is not None:
        log.info("--proxy-mode=%s ignored: kubeport is a userspace proxy of its own", args.proxy_mode)
    if args.config:
        ignored = config_module.ignored_fields(Path(args.config))
        if ignored:
            log.info("%s: not applicable to a userspace proxy, ignored: %s", args.config, ", ".join(ignored))
    if args.init_only:
        from kubeport.nodesettings import init_only

        return init_only(config)
    if args.cleanup:
        from kubeport.cleanup import CleanupRefused, cleanup_host

        try:
            cleanup_host(config, report=lambda line: print(f"kubeport: {line}"))
        except (CleanupRefused, OSError) as exc:
            print(f"kubeport: cleanup: {exc}", file=sys.stderr)
            return 1
        return 0
    from kubeport.survival.sockethold import ENV as SUPERVISED

    if config.hold_sockets and SUPERVISED not in os.environ:
        from kubeport.survival.supervisor import supervise

        # -P: the daemon's modules are the installed ones, never a kubeport/ folder that
        # happens to be in the working directory (a checkout's, beside an installed wheel).
        return supervise([sys.executable, "-P", "-m", "kubeport", *sys.argv[1:]], config.fd_store)
    from kubeport.daemon import DaemonError, run

    try:
        return run(config, config_file=Path(args.config) if args.config else None, flags=flag_values(args))
    except DaemonError as exc:
        log.error("%s", exc)
        return 1


def build_configuration(args: argparse.Namespace) -> KubeportConfiguration:
    return config_module.build(Path(args.config) if args.config else None, flag_values(args), flag_names(args))


def cmd_check(args: argparse.Namespace) -> int:
    from kubeport.endpoints.manifests.check import check_manifests

    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"kubeport: {directory}: not a directory", file=sys.stderr)
        return 2
    try:
        config = config_module.build(
            None,
            {"serviceClusterIPRange": args.service_cluster_ip_range,
             "serviceNodePortRange": args.service_node_port_range},
            {"serviceClusterIPRange": "--service-cluster-ip-range",
             "serviceNodePortRange": "--service-node-port-range"},
        )
    except ConfigError as exc:
        print(f"kubeport: {exc}", file=sys.stderr)
        return 2
    result = check_manifests(directory, service_cidrs=list(config.service_cluster_ip_range),
                             node_port_range=config.service_node_port_range)
    for problem in result.problems:
        print(problem)
    for skipped in result.skipped:  # a typo in a kind's API group looks like this: shown, never fatal
        print(skipped)
    if result.problems:
        return 1
    print(f"{directory}: ok")
    return 0


#: Words after which argv is not a kube-proxy command line.
_NOT_RUN = frozenset({"-h", "--help"})


# The client's modules (printers, urllib) are imported only by the commands that use them:
# a daemon's start is spent before its first answer.
def _add_status_address(command: argparse.ArgumentParser) -> None:
    where = command.add_mutually_exclusive_group()
    where.add_argument("--socket", metavar="PATH",
                       help="the daemon's status socket (default: the one listening in this network namespace)")
    where.add_argument("--server", metavar="HOST:PORT",
                       help="the daemon's --status-bind-address: http://HOST:PORT or HOST:PORT")


def _cmd_get(args: argparse.Namespace) -> int:
    from kubeport.get_client import cmd_get

    return cmd_get(args)


def _cmd_env(args: argparse.Namespace) -> int:
    from kubeport.get_client import cmd_env

    return cmd_env(args)


def _cmd_fd_store(args: argparse.Namespace) -> int:
    from kubeport.survival.fdstore import run

    return run(Path(args.directory), args.max)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:
        argv = ["version"]  # kube-proxy's --version
    elif argv and argv[0].startswith("-") and argv[0] not in _NOT_RUN:
        argv = ["run", *argv]  # kube-proxy's command line: its flags, no subcommand
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"kubeport {__version__}")
        return 0
    handler = {"run": cmd_run, "get": _cmd_get, "env": _cmd_env, "check": cmd_check, "fd-store": _cmd_fd_store}[
        args.command]
    try:
        return handler(args)
    except BrokenPipeError:
        # `kubeport get ... | head`: the reader left. Python's documented recipe (the "Note on
        # SIGPIPE" of the signal module): no traceback, and no second error at exit when the
        # interpreter flushes stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command a broken pipe ended


if __name__ == "__main__":
    sys.exit(main())
