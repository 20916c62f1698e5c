"""XID events: NVML's event set, waited on in its own thread (nvmlEventSetWait blocks)."""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable

from trainguard.records import XidEvent
from trainguard.sources.nvml import TIMEOUT, XID_EVENT, code

log = logging.getLogger("trainguard.gpu")


class XidListener:
    """Waits for XID events in its own thread (nvmlEventSetWait blocks) and queues them."""

    def __init__(self, nvml: Any, handles: dict[int, Any], clock: Callable[[], float], wait_ms: int = 500):
        self.nvml = nvml
        self.clock = clock
        self.wait_ms = wait_ms
        self._queue: collections.deque[XidEvent] = collections.deque(maxlen=1000)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle_index: list[tuple[Any, int]] = []
        self.event_set = None
        self.supported: tuple[int, ...] = ()
        try:
            self.event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("XID events not available: %s", exc)
            return
        supported = []
        for index, handle in handles.items():
            try:
                if nvml.nvmlDeviceGetSupportedEventTypes(handle) & XID_EVENT:
                    nvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, self.event_set)
                    supported.append(index)
                    self._handle_index.append((handle, index))
            except nvml.NVMLError as exc:
                log.info("GPU %d: XID events not available: %s", index, exc)
        self.supported = tuple(supported)
        if supported:
            self._thread = threading.Thread(target=self._run, name="trainguard-xid", daemon=True)
            self._thread.start()

    def _index_of(self, device: Any) -> int:
        for handle, index in self._handle_index:
            if handle is device or handle == device:
                return index
        try:
            return int(self.nvml.nvmlDeviceGetIndex(device))
        except Exception:  # noqa: BLE001 - an event for an unknown handle still counts
            return -1

    def _run(self) -> None:
        delay = 1.0
        while not self._stop.is_set():
            try:
                data = self.nvml.nvmlEventSetWait(self.event_set, self.wait_ms)
            except self.nvml.NVMLError as exc:
                if code(exc) == TIMEOUT:
                    continue
                log.warning("waiting for XID events failed: %s (retrying in %.0fs)", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 60.0)
                continue
            delay = 1.0
            if int(data.eventType) & XID_EVENT:
                self._queue.append(XidEvent(self._index_of(data.device), int(data.eventData), self.clock()))

    def drain(self) -> list[XidEvent]:
        events = []
        while self._queue:
            events.append(self._queue.popleft())
        return events

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 2)
        if self.event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self.event_set)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
