"""`kubeport` command line: run, get, check, version. Exit codes are chosen here only."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import urllib.error
import urllib.request
from pathlib import Path

from typing import Any

from . import __version__, printers
from . import config as config_module
from .config import ConfigError, KubeportConfiguration
from .logs import configure_logging

log = logging.getLogger("kubeport")


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run the daemon (service proxy + cluster DNS)")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--manifests", metavar="DIR", help="directory of manifests (default source)")
    source.add_argument("--kubeconfig", metavar="FILE", help="read a kube-apiserver through this kubeconfig")
    source.add_argument("--in-cluster", action="store_true", help="read the kube-apiserver as a pod")
    run.add_argument("--config", metavar="FILE", help="configuration file (KubeportConfiguration)")
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
    run.add_argument("--upstream", metavar="IP[:PORT]", action="append", help="upstream resolver (repeatable)")
    run.add_argument("--dns-lame-duck", metavar="DURATION", help="keep answering this long after SIGTERM (5s)")
    run.add_argument("--state-dir", metavar="DIR")
    run.add_argument("--healthz-bind-address", metavar="IP:PORT")
    run.add_argument("--metrics-bind-address", metavar="IP:PORT")
    run.add_argument("--vip-interface", metavar="LINK", help="link that carries service addresses (default lo)")
    run.add_argument("--udp-idle-timeout", metavar="DURATION", help="UDP flow idle timeout (e.g. 30s)")
    run.add_argument("--shutdown-grace-period", metavar="DURATION", help="connection drain time on SIGTERM")
    run.add_argument("--workers", type=int, metavar="N", help="relay processes sharing the listeners (default 1)")
    run.add_argument("--log-format", choices=["text", "json"])
    run.add_argument("--write-config-to", metavar="FILE", help="write the effective configuration and exit")
    run.add_argument("-v", "--verbose", action="count", default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeport", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    get = sub.add_parser("get", help="show what the running daemon holds")
    get.add_argument("resource", choices=["services", "svc", "endpointslices", "endpointslice", "eps", "status"],
                     help="status: the source's progress (list/watch counters) and what is served")
    scope = get.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default="default")
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    get.add_argument("-o", "--output", choices=["wide", "json", "yaml"])
    get.add_argument("--server", default="http://127.0.0.1:10249", help="the daemon's metrics/status address")
    check = sub.add_parser("check", help="validate a directory of manifests")
    check.add_argument("directory")
    check.add_argument("--service-cluster-ip-range", default="10.96.0.0/12")
    check.add_argument("--service-node-port-range", default="30000-32767")
    sub.add_parser("version", help="print the version")
    return parser


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, as configuration-file fields (camelCase, nested)."""
    values: dict[str, Any] = {}

    def put(path: str, value: Any) -> None:
        if value is None:
            return
        *parents, leaf = path.split(".")
        node = values
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value

    put("manifests", args.manifests)
    put("clientConnection.kubeconfig", args.kubeconfig)
    put("inCluster", True if args.in_cluster else None)
    put("hostnameOverride", args.hostname_override)
    put("stateDir", args.state_dir)
    put("healthzBindAddress", args.healthz_bind_address)
    put("metricsBindAddress", args.metrics_bind_address)
    put("vipInterface", args.vip_interface)
    put("conntrack.udpTimeout", args.udp_idle_timeout)
    put("serviceClusterIPRange", args.service_cluster_ip_range)
    put("serviceNodePortRange", args.service_node_port_range)
    put("nodePortAddresses", _csv(args.nodeport_addresses))
    put("clusterCIDR", args.cluster_cidr)
    put("shutdownGracePeriod", args.shutdown_grace_period)
    put("logFormat", args.log_format)
    put("workers", args.workers)
    put("verbosity", args.verbose or None)
    put("dns.clusterDomain", args.cluster_domain)
    put("dns.addresses", args.dns_address)
    put("dns.port", args.dns_port)
    put("dns.ttl", args.dns_ttl)
    put("dns.pods", args.pods)
    put("dns.upstreams", args.upstream)
    put("dns.lameDuck", args.dns_lame_duck)
    return values


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = build_configuration(args)
    except ConfigError as exc:
        print(f"kubeport: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    if args.write_config_to:
        Path(args.write_config_to).write_text(config.to_yaml())
        print(f"kubeport: wrote the effective configuration to {args.write_config_to}", file=sys.stderr)
        return 0
    configure_logging(config.log_format, config.verbosity)
    from .daemon import DaemonError, run

    try:
        return run(config, config_file=Path(args.config) if args.config else None, flags=flag_values(args))
    except DaemonError as exc:
        log.error("%s", exc)
        return 1


def build_configuration(args: argparse.Namespace) -> KubeportConfiguration:
    return config_module.build(Path(args.config) if args.config else None, flag_values(args))


def cmd_get(args: argparse.Namespace) -> int:
    kind = {"svc": "services", "endpointslice": "endpointslices", "eps": "endpointslices"}.get(
        args.resource, args.resource)
    if kind == "status":
        path = "/api/v1/status"
    elif args.all_namespaces:
        path = f"/api/v1/{kind}"
    else:
        path = f"/api/v1/namespaces/{args.namespace}/{kind}"
    try:
        with urllib.request.urlopen(args.server.rstrip("/") + path, timeout=10) as response:
            listing = json.load(response)
    except (urllib.error.URLError, OSError) as exc:
        print(f"kubeport: cannot reach the daemon at {args.server}: {exc}", file=sys.stderr)
        return 1
    if kind == "status":
        print(json.dumps(listing, indent=2) if args.output == "json" else printers.render_status(listing))
        return 0
    problems = listing.pop("problems", [])
    print(printers.render(kind, listing, args.output, args.all_namespaces))
    if problems and args.output not in ("json", "yaml"):
        print("\nProblems (the last good version of these objects is kept):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from kubeport.endpoints.manifest_check import check_directory

    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"kubeport: {directory}: not a directory", file=sys.stderr)
        return 2
    try:
        config = config_module.build(None, {"serviceClusterIPRange": args.service_cluster_ip_range,
                                            "serviceNodePortRange": args.service_node_port_range})
    except ConfigError as exc:
        print(f"kubeport: {exc}", file=sys.stderr)
        return 2
    problems = check_directory(directory, service_cidrs=list(config.service_cluster_ip_range),
                               node_port_range=config.service_node_port_range)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{directory}: ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"kubeport {__version__}")
        return 0
    handler = {"run": cmd_run, "get": cmd_get, "check": cmd_check}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
