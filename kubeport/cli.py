"""`kubeport` command line: run, get, check, version. Exit codes are chosen here only."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import urllib.error
import urllib.request
from pathlib import Path

from pydantic import ValidationError

from . import __version__, printers
from .config import ConfigError, KubeportConfiguration, parse_cidrs, parse_port_range

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
    run.add_argument("--state-dir", metavar="DIR")
    run.add_argument("--healthz-bind-address", metavar="IP:PORT")
    run.add_argument("--metrics-bind-address", metavar="IP:PORT")
    run.add_argument("--vip-interface", metavar="LINK", help="link that carries service addresses (default lo)")
    run.add_argument("--udp-idle-timeout", type=float, metavar="SECONDS")
    run.add_argument("-v", "--verbose", action="count", default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeport", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    get = sub.add_parser("get", help="show what the running daemon holds")
    get.add_argument("resource", choices=["services", "svc", "endpointslices", "endpointslice", "eps"])
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


def configuration_from_args(args: argparse.Namespace) -> KubeportConfiguration:
    """Flags -> configuration. Only flags that were given override the defaults."""
    values: dict = {}
    dns: dict = {}
    source: dict = {}
    if args.manifests:
        source["manifests"] = Path(args.manifests)
    if args.kubeconfig:
        source["kubeconfig"] = Path(args.kubeconfig)
    if args.in_cluster:
        source["in_cluster"] = True
    if source:
        values["source"] = source
    simple = {
        "hostname_override": args.hostname_override,
        "state_dir": args.state_dir,
        "healthz_bind_address": args.healthz_bind_address,
        "metrics_bind_address": args.metrics_bind_address,
        "vip_interface": args.vip_interface,
        "udp_idle_timeout": args.udp_idle_timeout,
    }
    values.update({k: v for k, v in simple.items() if v is not None})
    if args.service_cluster_ip_range:
        values["service_cluster_ip_range"] = parse_cidrs(args.service_cluster_ip_range, "--service-cluster-ip-range")
    if args.service_node_port_range:
        values["service_node_port_range"] = parse_port_range(args.service_node_port_range)
    if args.nodeport_addresses:
        values["node_port_addresses"] = [p.strip() for p in args.nodeport_addresses.split(",") if p.strip()]
    if args.cluster_cidr:
        values["cluster_cidr"] = parse_cidrs(args.cluster_cidr, "--cluster-cidr")
    for key, value in (("cluster_domain", args.cluster_domain), ("addresses", args.dns_address),
                       ("port", args.dns_port), ("ttl", args.dns_ttl), ("pods", args.pods),
                       ("upstreams", args.upstream)):
        if value is not None:
            dns[key] = value
    if dns:
        values["dns"] = dns
    return KubeportConfiguration.model_validate(values)


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"])
        lines.append(f"{field}: {error['msg']}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    _configure_logging(args.verbose)
    try:
        config = configuration_from_args(args)
    except ConfigError as exc:
        print(f"kubeport: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"kubeport: {_format_validation_error(exc)}", file=sys.stderr)
        return 2
    from .daemon import DaemonError, run

    try:
        return run(config)
    except DaemonError as exc:
        log.error("%s", exc)
        return 1


def cmd_get(args: argparse.Namespace) -> int:
    kind = {"svc": "services", "endpointslice": "endpointslices", "eps": "endpointslices"}.get(
        args.resource, args.resource)
    path = f"/api/v1/{kind}" if args.all_namespaces else f"/api/v1/namespaces/{args.namespace}/{kind}"
    try:
        with urllib.request.urlopen(args.server.rstrip("/") + path, timeout=10) as response:
            listing = json.load(response)
    except (urllib.error.URLError, OSError) as exc:
        print(f"kubeport: cannot reach the daemon at {args.server}: {exc}", file=sys.stderr)
        return 1
    problems = listing.pop("problems", [])
    print(printers.render(kind, listing, args.output, args.all_namespaces))
    if problems and args.output not in ("json", "yaml"):
        print("\nProblems (the last good version of these objects is kept):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from kubeport.endpoints.manifests import check_directory

    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"kubeport: {directory}: not a directory", file=sys.stderr)
        return 2
    try:
        cidrs = parse_cidrs(args.service_cluster_ip_range, "--service-cluster-ip-range")
        node_ports = parse_port_range(args.service_node_port_range)
    except ConfigError as exc:
        print(f"kubeport: {exc}", file=sys.stderr)
        return 2
    problems = check_directory(directory, service_cidrs=cidrs, node_port_range=node_ports)
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
