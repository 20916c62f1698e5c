"""The HTTP endpoint on the metrics port: /metrics, and the pages served beside it (/status).

The Prometheus client library and the collector load only when the metrics port is on (the daemon
loads them before it builds its state, see service/daemon.py): with `metrics.listen = ""` they are
never loaded (1.1 MiB). Loading them at the first scrape instead was measured and rejected: a
scraped daemon, the usual one, then grew by 0.6 MiB.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Mapping

from trainguard.surfaces.pages import serve, shut_down, with_pages
from trainguard.surfaces.readings import Readings

log = logging.getLogger(__name__)


class MetricsServer:
    """The /metrics HTTP endpoint in its own threads; start() binds, stop() releases the port."""

    def __init__(self, source: Callable[[], Readings | None], address: tuple[str, int], *,
                 pages: Mapping[str, Callable[[], str]] | None = None):
        self.source = source
        self.address = address
        self.pages = dict(pages or {})  # path -> HTML (surfaces/pages.py), e.g. the daemon's /status
        self._httpd = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0 in tests)."""
        return self._httpd.server_address[1] if self._httpd is not None else self.address[1]

    def start(self) -> None:
        from trainguard.surfaces.exporter import ReadingsCollector
        from trainguard.surfaces.exposition import MetricsApp

        app = MetricsApp(ReadingsCollector(self.source).collect, self.source)
        host, port = self.address
        self._httpd, self._thread = serve(host, port, with_pages(app, self.pages))
        self._thread.name = "metrics-http"
        log.info("serving metrics on http://%s:%d/metrics", f"[{host}]" if ":" in host else host, self.port)

    def stop(self) -> None:
        if self._httpd is not None and self._thread is not None:
            shut_down(self._httpd, self._thread)
        self._httpd = self._thread = None
