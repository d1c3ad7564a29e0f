"""A small HTTP/1.1 server for the daemon's status, metrics and health-check ports.

Why not aiohttp.web: importing it costs the daemon ~9 MiB of RSS (its C parser and websocket
reader, multidict, yarl, attrs, and two SSL contexts with the CA store built when its
client connector is imported) and 0.18-0.20 s at every start. VmRSS of ``import uvloop,
kubeport.daemon`` then ``import aiohttp.web``: 52.7 MiB; with this package instead, 43.6 MiB.
With the status server's three ports and a health-check port started and answering: 54.2
MiB on aiohttp.web, 44.8 MiB here. Handlers answer probes, scrapes and `kubeport get`; none
reads a body.

Requests follow Go's net/http server, which kube-proxy's ports run on:

* Request line and headers: at most :data:`~kubeport.lib.http.request.MAX_HEAD_BYTES` (64 KiB, not Go's
  DefaultMaxHeaderBytes of 1 MiB: what a probe or a scraper sends is under 1 KiB, and every
  open connection may hold that much in its buffer). Larger: 431; malformed: 400; a major
  version other than 1: 505; a transfer coding other than chunked: 501. Each answer closes.
* Bodies are read and discarded, not used: a Content-Length body, and a chunked one (Go
  reads chunked requests, it does not answer 411). Like Go's ``chunkWriter.writeHeader``
  for a handler that ignores the body, up to 256 KiB (``maxPostHandlerReadBytes``) is read
  so the connection stays usable; a larger body is not read, and the answer closes.
  ``Expect: 100-continue`` is never answered with 100 (the handler never reads): the
  answer closes, as Go's.
* HTTP/1.1 keeps the connection unless ``Connection: close``; HTTP/1.0 closes unless
  ``Connection: keep-alive``. Pipelined requests are answered in order, one at a time.
* Timeouts. kube-proxy sets none (``pkg/proxy/healthcheck/common.go``
  ``stdHTTPServerFactory.New`` builds ``&http.Server{Handler: handler}``; the metrics
  port is ``http.ListenAndServe`` in ``cmd/kube-proxy/app/server.go serveMetrics``), so
  there a client sending a byte a second holds a goroutine forever. Here a request must be
  complete (head and the body read) within :data:`~kubeport.lib.http.server.REQUEST_TIMEOUT` (10 s) of its first
  byte (Go's ``ReadTimeout``), the first within that of the accept (Go's
  ``ReadHeaderTimeout`` applies from the accept too), and a kept connection may idle
  :data:`~kubeport.lib.http.server.IDLE_TIMEOUT` (60 s) between requests (Go's ``IdleTimeout``). A connection timed
  out is closed without an answer, as Go's. After a connection's last answer it is
  half-closed and waits :data:`~kubeport.lib.http.server.LINGER` for the peer's FIN, as Go's ``closeWriteAndWait``.
* Connections. Go's server (so kube-proxy's) accepts any number. Here one server holds at
  most :data:`~kubeport.lib.http.server.MAX_CONNECTIONS` (128),
  :data:`~kubeport.lib.http.server.MAX_CONNECTIONS_PER_CLIENT` (16) of them from one client
  address, with the rule TCP DNS follows (:mod:`kubeport.lib.admission`): at the global cap
  the connection idle longest (no request begun, no answer under way or unsent) is closed
  for the new one, at the per-client cap
  that client's own connection idle longest, and when none is idle the new one is reset at
  once. A probe or scrape opens one connection, or a few kept alive; the caps keep one
  client (or many slow ones) from spending the descriptors the daemon's other servers need.
  Counted in :class:`~kubeport.lib.http.server.ConnectionStats` (``kubeport_http_connections_*_total``).
* Every answer has ``Date`` (``http.TimeFormat``), ``Content-Length`` and, with a body, a
  ``Content-Type`` (``text/plain; charset=utf-8`` unless the handler sets one, what Go's
  sniffing says of text). HEAD gets the headers of GET and no body. An unknown path: 404
  ``404 page not found``; a known path with another method: 405 with ``Allow``.

Modules, by job:

* :mod:`kubeport.lib.http.request`: :class:`~kubeport.lib.http.request.RequestReader`,
  ``parse_head``, ``BadRequest``: the sans-IO request parser (bytes in, requests out).
* :mod:`kubeport.lib.http.response`: ``Response``, ``http_date``, ``encode_response``,
  ``error_response``: answers as bytes.
* :mod:`kubeport.lib.http.routes`: :class:`~kubeport.lib.http.routes.Routes`, the path
  and method matching.
* :mod:`kubeport.lib.http.server`: :class:`~kubeport.lib.http.server.HttpServer` and
  ``ConnectionStats``: the asyncio shell (listening, connections, timeouts, caps).

The first three are pure; ``server`` is the only one doing I/O.

Who uses it: the status server (``kubeport/status.py``: healthz, metrics, DNS metrics and the
status API behind ``kubeport get``), the proxy's health-check node ports
(``proxy/healthcheck/service_health.py``), and the proxy's metrics of these servers'
connection caps (``proxy/metrics.py``). It lives under ``kubeport/lib`` because ``proxy/``, a
part, uses it, and parts import only ``kubeport.lib``.
"""
