"""The HTTP endpoint on the metrics port: /metrics, and the pages served beside it (/status).

The Prometheus client library and the collector load only when the metrics port is on (the daemon
loads them before it builds its state, see service/daemon.py): with `metrics.listen = ""` they are
never loaded (1.1 MiB). Loading them at the first scrape instead was measured and rejected: a
scraped daemon, the usual one, then grew by 0.6 MiB.
"""

from __future__ import annotations

import logging
import resource
from typing import Callable, Mapping

from trainguard.config.web import WebConfig
from trainguard.surfaces.access import Access
from trainguard.surfaces.httpserver import HttpServer
from trainguard.surfaces.pages import with_pages
from trainguard.surfaces.readings import Readings

log = logging.getLogger(__name__)


class MetricsServer:
    """The /metrics HTTP endpoint in its own threads; start() binds, stop() releases the port."""

    def __init__(self, source: Callable[[], Readings | None], address: tuple[str, int], *,
                 pages: Mapping[str, Callable[[], str]] | None = None, web: WebConfig | None = None,
                 max_connections: int = 16):
        self.source = source
        self.address = address
        self.pages = dict(pages or {})  # path -> HTML (surfaces/pages.py), e.g. the daemon's /status
        self.web = web  # TLS, users and headers (config/web.py); None: plain HTTP, open to all
        self.max_connections = max_connections
        self._httpd: HttpServer | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0 in tests)."""
        return self._httpd.port if self._httpd is not None else self.address[1]

    def start(self) -> None:
        """Bind and serve; OSError when the port cannot be bound, ValueError when a TLS file cannot be loaded."""
        from trainguard.surfaces.exporter import ReadingsCollector
        from trainguard.surfaces.exposition import MetricsApp

        app = MetricsApp(ReadingsCollector(self.source).collect, self.source)
        host, port = self.address
        access = Access(self.web)
        self._httpd = HttpServer(host, port, with_pages(app, self.pages), access, self.max_connections)
        self._httpd.start()
        self._check_fd_limit()
        scheme = "https" if access.context is not None else "http"
        log.info("serving metrics on %s://%s:%d/metrics%s", scheme, f"[{host}]" if ":" in host else host, self.port,
                 " (basic auth)" if access.users else "")

    def configure(self, web: WebConfig | None, max_connections: int) -> None:
        """Take a reloaded web config and connection cap without closing the port (ValueError: kept as it was)."""
        access = Access(web)
        if self._httpd is not None:
            self._httpd.configure(access, max_connections)
        self.web, self.max_connections = web, max_connections
        self._check_fd_limit()

    def _check_fd_limit(self) -> None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and self.max_connections > soft // 4:
            log.warning("metrics.max_connections = %d is more than a quarter of the open-file limit (%d): "
                        "connections could leave cleanup and the state database without file descriptors; "
                        "lower it or raise LimitNOFILE", self.max_connections, soft)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.stop()
        self._httpd = None
