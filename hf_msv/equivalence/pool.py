"""The symbolic checker's worker processes: a pool of forked workers per process, with a hard time bound per task.

Math-Verify runs with its own (signal-based) timeouts disabled in a worker process, and the parent bounds each task by
killing that worker. Workers are forked from a *zygote*: a child interpreter that runs `hf_msv.equivalence.worker` as a
script (``python -P worker.py``) and has imported Math-Verify once, so replacing a killed worker is a ~10 ms fork.

multiprocessing is not used: its forkserver re-imports the caller's ``__main__`` script in every child (its
``__main__`` preload never happens in CPython 3.11), which for a script importing hf_msv (torch) costs seconds per
restart; it also refuses to start children from daemonic processes (``multiprocessing.Pool`` workers).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

logger = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
"""The zygote program (`hf_msv.equivalence.worker`), run as a script so that it never imports hf_msv."""


class _Zygote:
    """The interpreter that forks workers (`WORKER_SCRIPT`, see its docstring for the protocol)."""

    def __init__(self, memory_limit_mb: int | None, start_timeout: float):
        ours, theirs = socket.socketpair()
        with theirs:
            # -P: neither the cwd nor the script's directory on sys.path, so nothing can shadow math_verify.
            self.process = subprocess.Popen(
                [sys.executable, "-P", str(WORKER_SCRIPT), str(theirs.fileno()), str(memory_limit_mb or 0)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        self.sock = ours
        self.lock = threading.Lock()
        ours.settimeout(start_timeout)  # start-up (imports) is not charged to any check's timeout
        try:
            ready = ours.recv(1) == b"R"
        except OSError:
            ready = False
        if not ready:
            self.close()
            raise RuntimeError("the symbolic equivalence zygote failed to start")

    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, start_timeout: float) -> "_Worker":
        ours, theirs = socket.socketpair()
        with self.lock, theirs:
            socket.send_fds(self.sock, [b"F"], [theirs.fileno()])
            data = b""
            while len(data) < 8:
                chunk = self.sock.recv(8 - len(data))
                if not chunk:
                    raise EOFError("the symbolic equivalence zygote died")
                data += chunk
        worker = _Worker(int.from_bytes(data, "little"), Connection(ours.detach()))
        try:
            ready = worker.conn.poll(start_timeout) and worker.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            worker.kill()
            raise RuntimeError("a symbolic equivalence worker failed to start")
        return worker

    def close(self) -> None:
        self.sock.close()  # the zygote exits on EOF
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


class _Worker:
    def __init__(self, pid: int, conn: Connection):
        self.pid = pid
        self.conn = conn

    def call(self, task, timeout: float):
        """The task's result; raises TimeoutError (the worker is then useless) or EOFError/OSError if it died."""
        self.conn.send(task)
        if not self.conn.poll(timeout):
            raise TimeoutError
        return self.conn.recv()

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)  # the zygote reaps it
        except OSError:
            pass
        self.conn.close()


class WorkerPool:
    """Persistent workers shared by the checkers of one process; a thread borrows one per task.

    Args:
        max_workers: workers alive at once; more concurrent tasks wait for a free one.
        memory_limit_mb: address space a worker may add before its allocations fail (Linux); ``None``: no limit.
        start_timeout: seconds to wait for the zygote or a worker to start (not charged to any task's timeout).
    """

    def __init__(self, max_workers: int, memory_limit_mb: int | None, start_timeout: float = 120.0):
        self.max_workers = max_workers
        self.memory_limit_mb = memory_limit_mb
        self.start_timeout = start_timeout
        self._zygote: _Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()

    def _new_worker(self) -> _Worker:
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive():
                self._zygote = _Zygote(self.memory_limit_mb, self.start_timeout)
            zygote = self._zygote
        return zygote.fork(self.start_timeout)

    def _acquire(self) -> _Worker:
        with self._cond:
            while not self._idle and self._count >= self.max_workers:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()  # LIFO: the most recently used worker has the warmest parse cache
            self._count += 1
        try:
            return self._new_worker()
        except BaseException:
            self._release(None)
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None:
                self._count -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def run(self, task, timeout: float) -> tuple[object, float]:
        """(result of ``task`` in a worker, seconds it ran there); the result is ``None`` on failure or timeout.

        Waiting for a free worker and starting one are not charged to ``timeout``.
        """
        spent = 0.0
        for _ in range(2):  # a worker found dead (killed from outside, crashed) gets one fresh replacement
            try:
                worker = self._acquire()
            except Exception:
                logger.warning("could not start a symbolic equivalence worker", exc_info=True)
                return None, spent
            start = time.monotonic()
            try:
                result = worker.call(task, max(timeout - spent, 0.0))
            except Exception as e:  # timeout, or the worker died: replace it
                worker.kill()
                self._release(None)
                spent += time.monotonic() - start
                if isinstance(e, TimeoutError):
                    return None, spent
                continue
            self._release(worker)
            return result, spent + time.monotonic() - start
        return None, spent

    def warmup(self) -> None:
        """Start a worker now (the first also starts the zygote, ~1 s), so that no task waits for it."""
        self._release(self._acquire())

    def close(self) -> None:
        """Kill the idle workers and stop the zygote (busy workers are killed by their tasks' owners)."""
        with self._cond:
            for worker in self._idle:
                worker.kill()
            self._count -= len(self._idle)
            self._idle.clear()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


_pools: dict[tuple, WorkerPool] = {}
_pools_pid = os.getpid()
_pools_lock = threading.Lock()


@atexit.register
def _close_pools() -> None:
    if _pools_pid == os.getpid():
        for pool in _pools.values():
            pool.close()


def get_pool(max_workers: int, memory_limit_mb: int | None) -> WorkerPool:
    """This process's pool for these settings, created on first use (a forked child never reuses its parent's)."""
    global _pools, _pools_pid
    with _pools_lock:
        if _pools_pid != os.getpid():  # forked child: the parent's workers are not ours to use
            _pools, _pools_pid = {}, os.getpid()
        key = (max_workers, memory_limit_mb)
        if key not in _pools:
            _pools[key] = WorkerPool(max_workers, memory_limit_mb)
        return _pools[key]


__all__ = ["WORKER_SCRIPT", "WorkerPool", "get_pool"]
