"""Programs compiled off the caller's thread, for a later call (`method="auto"`'s settings to try).

One daemon worker per model runs the jobs in order: XLA compiles outside Python's lock, so the
caller keeps decoding (and streaming) meanwhile. A job that fails is kept with its error
(`failed`), never raised into a caller that did not ask for it; its key is never tried again.

At exit: a daemon thread stopped inside XLA's C++ aborts the process ("terminate called ..."), so
an interpreter that exits drops the queued jobs and waits for the running one (`_settle`); the
command line does not wait at all (`exit_process`: its output is written, nothing is left to keep)."""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import weakref
from typing import Callable, Hashable

_ALL: weakref.WeakSet = weakref.WeakSet()  # every worker of this process


class Background:
    """The worker thread lives only while there is work: an idle thread blocked on its queue would
    keep its last job (and through it a model and its compiled programs) and its owner alive for
    the life of the process."""

    def __init__(self, on_done: Callable[[], None] | None = None):
        self.on_done = on_done  # called (from the worker) after each job, done or failed
        self.ready: set = set()  # keys whose job finished
        self.failed: dict = {}  # key -> the error its job raised
        self._pending: set = set()
        self._jobs: collections.deque = collections.deque()
        self._idle = threading.Condition()
        self._worker: threading.Thread | None = None
        _ALL.add(self)

    def submit(self, key: Hashable, job: Callable[[], None]) -> bool:
        """Run `job` in the worker unless `key` is done, failed or queued; whether it was queued."""
        with self._idle:
            if key in self.ready or key in self.failed or key in self._pending:
                return False
            self._pending.add(key)
            self._jobs.append((key, job))
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="jaxspec-background", daemon=True)
                self._worker.start()
        return True

    def _run(self) -> None:
        try:  # below the caller's threads: on a machine of few cores the decoding it competes with comes first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):  # (not on every platform)
            pass
        while True:
            with self._idle:
                if not self._jobs:
                    self._worker = None  # the next `submit` starts another
                    return
                key, job = self._jobs.popleft()
            try:
                job()
                done = True
            except Exception as e:  # noqa: BLE001  (reported in `failed`; the caller never waits on it)
                self.failed[key] = f"{type(e).__name__}: {e}"
                done = False
            del job  # (not kept alive by this frame until the next one)
            with self._idle:
                self._pending.discard(key)
                if done:
                    self.ready.add(key)
                self._idle.notify_all()
            if self.on_done is not None:
                self.on_done()

    def busy(self) -> bool:
        return bool(self._pending)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no job is queued or running (tests, benchmarks); whether that happened in time."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def drop_queued(self) -> None:
        """Forget the jobs not yet begun."""
        with self._idle:
            while self._jobs:
                key, _ = self._jobs.popleft()
                self._pending.discard(key)
            self._idle.notify_all()


@atexit.register
def _settle() -> None:
    for worker in list(_ALL):
        worker.drop_queued()
        worker.wait()


def exit_process(code: int) -> None:
    """End the command line's process with `code`, not waiting for a background compile."""
    if any(worker.busy() for worker in list(_ALL)):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
