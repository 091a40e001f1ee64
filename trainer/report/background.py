"""One daemon thread that runs submitted calls in order, off the training
loop: the plots, the TensorBoard events and the trackers each have one.
The loop only queues; a call that fails is one warning line, never a
stopped run."""

from __future__ import annotations

import queue
import threading


class Background:
    """`submit(fn, *args)` queues a call; `wait()` runs what is queued and
    ends the thread (the next submit starts a new one). `name` names the
    thread and the warnings."""

    def __init__(self, name: str = "plots"):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn, *args) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put((fn, args))

    def wait(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, args = item
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - what runs beside the loop must never stop training
                print(f"hpcyolo: warning: {self.name}: {getattr(fn, '__name__', 'call')} failed "
                      f"({type(e).__name__}: {e})", flush=True)
