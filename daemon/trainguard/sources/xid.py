"""XID events: NVML's event set, read at each cycle.

The driver queues the events of a set until they are asked for (on Linux every XID is delivered with
its data, however many came since), so the cycle takes what arrived with a zero timeout. A thread
blocked in nvmlEventSetWait with a 0.5 s timeout, as before, woke twice a second for nothing: on a
shared VM that was more CPU than the cycles themselves. An event is stamped when the cycle reads it,
at most one interval after it happened; the cycle that reports it is the same as before."""

from __future__ import annotations

import logging
from typing import Any, Callable

from trainguard.records import XidEvent
from trainguard.sources.nvml import TIMEOUT, XID_EVENT, code

log = logging.getLogger("trainguard.gpu")


class XidListener:
    """The XID events of the registered GPUs, taken from NVML's queue at drain()."""

    MAX_PER_DRAIN = 1000  # an event storm is counted up to this many per cycle; the rest waits in the queue

    def __init__(self, nvml: Any, handles: dict[int, Any], clock: Callable[[], float]):
        self.nvml = nvml
        self.clock = clock
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
        self._failed = float("-inf")  # when a failure to read the queue was last logged (once a minute at most)

    def _index_of(self, device: Any) -> int:
        for handle, index in self._handle_index:
            if handle is device or handle == device:
                return index
        try:
            return int(self.nvml.nvmlDeviceGetIndex(device))
        except Exception:  # noqa: BLE001 - an event for an unknown handle still counts
            return -1

    def drain(self) -> list[XidEvent]:
        """The events queued since the last call, without waiting."""
        events: list[XidEvent] = []
        if not self.supported:
            return events
        for _ in range(self.MAX_PER_DRAIN):
            try:
                data = self.nvml.nvmlEventSetWait(self.event_set, 0)
            except self.nvml.NVMLError as exc:
                now = self.clock()
                if code(exc) != TIMEOUT and now - self._failed >= 60:  # TIMEOUT: the queue is empty
                    log.warning("reading XID events failed: %s (tried again each cycle)", exc)
                    self._failed = now
                break
            if int(data.eventType) & XID_EVENT:
                events.append(XidEvent(self._index_of(data.device), int(data.eventData), self.clock()))
        return events

    def close(self) -> None:
        if self.event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self.event_set)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
