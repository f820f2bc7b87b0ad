"""The symbolic checker's worker processes: forked from a zygote, each task bounded by the CPU time it uses.

`WorkerPool.run` sends one task to a worker and kills the worker once the task has used its CPU budget (read from
``/proc/<pid>/stat``; wall time where there is no ``/proc``) or a much larger wall-clock limit (a stalled worker).
`get_pool` gives each process its own pool. Design: ``docs/equivalence.md``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

logger = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
"""The zygote program (`hf_msv.equivalence.worker`), run as a script so that it never imports hf_msv."""

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_POLL_S = 0.1  # longest wait between two looks at a busy worker's CPU time


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` has used, from ``/proc``; ``None`` where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the command name may contain spaces and ")"
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime: fields 14, 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class TaskResult:
    """Outcome of `WorkerPool.run`.

    Attributes:
        value: what the worker returned (``None`` unless ``status == "ok"``).
        cpu_s: CPU seconds the task used in workers.
        status: ``"ok"``; ``"timeout"`` (the CPU budget ran out); ``"stalled"`` (the wall-clock limit ran out
            first); ``"failed"`` (no worker could be started, or workers died twice).
    """

    value: object
    cpu_s: float
    status: str


class _OutOfTime(Exception):
    def __init__(self, status: str, cpu_s: float):
        super().__init__(status)
        self.status, self.cpu_s = status, cpu_s


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
        ours.settimeout(start_timeout)  # start-up (imports) is not charged to any task
        try:
            ready = ours.recv(1) == b"R"
        except OSError:
            ready = False
        if not ready:
            self.close()
            raise RuntimeError("the symbolic equivalence zygote failed to start")

    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, start_timeout: float) -> _Worker:
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

    def call(self, task, cpu_budget: float, wall_limit: float) -> tuple[object, float]:
        """(result, CPU seconds) of ``task``; raises `_OutOfTime` (the worker is then useless), or EOFError /
        OSError if it died."""
        cpu_start = process_cpu_seconds(self.pid)
        start = time.monotonic()
        self.conn.send(task)
        used = elapsed = 0.0
        while True:
            # A single-threaded worker cannot use more CPU time than the wall time that passes, so waiting for the
            # rest of its budget never overshoots it; a worker that gets no CPU just takes more waits.
            if self.conn.poll(max(min(cpu_budget - used, wall_limit - elapsed, _MAX_POLL_S), 0.005)):
                break
            elapsed = time.monotonic() - start
            cpu_now = process_cpu_seconds(self.pid) if cpu_start is not None else None
            used = elapsed if cpu_now is None or cpu_start is None else cpu_now - cpu_start
            if used >= cpu_budget:
                raise _OutOfTime("timeout", used)
            if elapsed >= wall_limit:
                raise _OutOfTime("stalled", used)
        value, cpu_s = self.conn.recv()
        return value, cpu_s

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)  # the zygote reaps it
        self.conn.close()


class WorkerPool:
    """Persistent workers shared by the checkers of one process; a thread borrows one per task.

    Args:
        max_workers: workers alive at once; more concurrent tasks wait for a free one.
        memory_limit_mb: address space a worker may add before its allocations fail (Linux); ``None``: no limit.
        start_timeout: seconds to wait for the zygote or a worker to start (not charged to any task).
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

    def run(self, task, cpu_budget: float, wall_limit: float) -> TaskResult:
        """Run ``task`` in a worker, killing it after ``cpu_budget`` CPU seconds or ``wall_limit`` wall seconds.

        Waiting for a free worker and starting one are not charged. A worker found dead (killed from outside,
        crashed) is replaced once with the rest of the budget.
        """
        spent = 0.0
        for _ in range(2):
            try:
                worker = self._acquire()
            except Exception:
                logger.warning("could not start a symbolic equivalence worker", exc_info=True)
                return TaskResult(None, spent, "failed")
            try:
                value, cpu_s = worker.call(task, cpu_budget - spent, wall_limit)
            except _OutOfTime as e:
                worker.kill()
                self._release(None)
                return TaskResult(None, spent + e.cpu_s, e.status)
            except (EOFError, OSError):
                worker.kill()
                self._release(None)
                continue
            self._release(worker)
            return TaskResult(value, spent + cpu_s, "ok")
        return TaskResult(None, spent, "failed")

    def warmup(self) -> None:
        """Start a worker now (the first also starts the zygote, ~1 s), so that no task waits for it."""
        self._release(self._acquire())

    def idle_worker_pids(self) -> list[int]:
        """Process ids of the workers waiting for a task (the next task goes to the last one)."""
        with self._cond:
            return [w.pid for w in self._idle]

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


__all__ = ["WORKER_SCRIPT", "TaskResult", "WorkerPool", "get_pool", "process_cpu_seconds"]
