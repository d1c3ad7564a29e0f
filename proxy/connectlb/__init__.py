"""Connect-time load balancing (socket-level, as Cilium's for a node's own pods): Python
decides per Service port which endpoints this node may use and writes them into BPF maps
(maps.py); a cgroup sock_addr program assembled here (programs.py) picks one at connect()
and rewrites the address the socket connects to. Not yet attached by the daemon."""
