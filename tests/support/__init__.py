"""What the tests share; pytest puts tests/ on sys.path, so tests import it as ``support``.

Waiting
    wait            until / until_sync: wait on a condition with a deadline, the only way
                    tests wait

Object builders, by layer (each names its builders service, endpoint_slice, endpoint,
node, namespace, as fits)
    slim            the slim frozen types the proxy and DNS read, and snapshots of them
    api             API objects as manifest-like dicts, their models, a ClusterState of them
    manifests       manifest files as YAML text, and the manifest-source harness
    netns.manifests manifests placed on the netns topology (its nodes' addresses, its pods)
    apiserver.objects
                    objects as a real kube-apiserver serves them (managedFields and all)

Per subject
    zonetext        DNS questions, and replies and records read back as zone text
    dns_loopback    a DNS port on loopback answering as a test says (fake upstreams)
    dns_answers     the cluster and the checks of the cluster-zone answer tables
    hints           the topology-hint tables' slices by zone and hint checks
    registry        the registry tests' registry
    proxy_loopback  the proxy on loopback: relay, started Proxier, backends, clients, uvloop
    proxy_table     the forwarding-table tests' node, slices and rule summary
    fake_host       in-memory stand-ins for the proxy's address and nftables reconcilers

Fakes and harnesses
    apiserver       an in-process kube-apiserver (list/watch, TLS, faults) and the source's
                    harness; bench/apiserver.py serves it too
    netns           the network-namespace topology of netns-scripts: processes, the daemon,
                    clients, the fake API server inside a node, DNS, policy and operating
                    helpers, and the scripts run inside namespaces (client_loop.py,
                    fake_upstream_dns.py)
"""
