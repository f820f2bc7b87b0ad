"""The zygote of the symbolic checker's worker processes: a script, run as ``python -P worker.py <fd> <memory_mb>``.

It imports Math-Verify once, reports ready (``b"R"`` on the control socket ``<fd>``), then forks one worker per
request: the parent sends one byte with a socket end attached and gets the worker's pid back (8 bytes, little
endian). A worker answers ``(task, *args)`` requests on that socket with ``(result, cpu_seconds)`` until it is closed
or killed. ``<memory_mb>`` > 0 caps the address space each worker may add. It imports only the standard library,
Math-Verify and SymPy, never hf_msv. Design: ``docs/equivalence.md``.
"""

import functools
import logging
import os
import signal
import socket
import sys
import time
import zlib
from multiprocessing.connection import Connection
from typing import cast

logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" is intended here
from math_verify import parse, verify  # noqa: E402  (after silencing its logger)
from sympy import Basic, E, Expr, FiniteSet, Float, Interval, Mul, Symbol, Tuple, UnevaluatedExpr  # noqa: E402
from sympy.core.function import AppliedUndef, UndefinedFunction  # noqa: E402


@functools.lru_cache(maxsize=4096)
def parse_answer(text):
    """Math-Verify's parse of ``$text$`` (a list; empty when nothing parses), cached per worker."""
    return parse("$" + text + "$", parsing_timeout=None)  # pyright: ignore[reportArgumentType]  (None: no alarm)


def verify_pair(kind, a, b, options):
    """``"gold"``: verify(gold=a, pred=b); ``"either"``: either direction verifies; ``None``: a side did not parse."""
    pa, pb = parse_answer(a), parse_answer(b)
    if not pa or not pb:
        return None
    if verify(pa, pb, timeout_seconds=None, **options):
        return True
    return kind == "either" and verify(pb, pa, timeout_seconds=None, **options)


def probe(text):
    """What the parent needs to settle most pairs without verify (see `SymbolicChecker`).

    ``("value", re, im, has_symbols, strings)``: a constant, or an expression in symbols evaluated at fixed
    name-derived points; ``("collection", strings)``: a tuple or set of 2+ elements, or an interval with start < end;
    ``("expr", strings)``: anything else; ``("none",)``: nothing parses. ``strings``: the parse's string candidates,
    which verify also matches ("-0{,}100" parses to 0 and to the string "-0,100", as "-0,100" does to -0.1).
    """
    parsed = parse_answer(text)
    if not parsed:
        return ("none",)
    return (*_probe_value(parsed[0]), tuple(x for x in parsed if isinstance(x, str)))


def _probe_value(expr):
    """`probe`'s kind and value of a parsed expression, without the string candidates."""
    try:
        if isinstance(expr, (Tuple, FiniteSet)) and len(expr) >= 2:
            return ("collection",)
        if isinstance(expr, Interval) and bool(expr.start < expr.end):  # pyright: ignore[reportOperatorIssue]
            return ("collection",)
        if not isinstance(expr, Expr) or getattr(expr, "is_Matrix", False) or expr.has(UnevaluatedExpr):
            return ("expr",)
        symbols = expr.free_symbols
        if isinstance(expr, Symbol) or (isinstance(expr, Mul) and all(x == E or x.is_Symbol for x in expr.args)):
            return ("expr",)  # Math-Verify matches these by name (\text{abc} vs abc, e vs E)
        if any(isinstance(f.func, UndefinedFunction) for f in expr.atoms(AppliedUndef)):
            return ("expr",)
        # free symbols are `Symbol`s (sympy types them as `Basic`)
        points: dict[Basic, Basic | float] = {
            x: Float(1.1 + (zlib.crc32(cast(Symbol, x).name.encode()) % 7919) / 9973, 40) for x in symbols
        }
        value = expr.evalf(30, subs=points) if points else expr.evalf(30)
        re_, im_ = value.as_real_imag()
        if re_.is_Number and im_.is_Number and re_.is_finite and im_.is_finite:
            return ("value", str(re_), str(im_), bool(symbols))
    except Exception:  # no value: leave the decision to verify
        pass
    return ("expr",)


def run(task, *args):
    """One request: ``("probe", text)`` or ``("verify", kind, a, b, options)``."""
    return probe(*args) if task == "probe" else verify_pair(*args)


def limit_memory(extra_mb):
    """Cap this process's address space at what it maps now plus ``extra_mb`` MiB (allocations beyond fail)."""
    try:
        import resource

        with open("/proc/self/statm") as f:  # relative to what is mapped already
            base = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = base + (extra_mb << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    except (ImportError, OSError, ValueError):
        pass  # not Linux: the timeout alone bounds the worker


def serve(conn):
    """A worker's loop: answer each request on ``conn`` with (result, CPU seconds) until the parent closes it."""
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        start = time.process_time()
        try:
            result = run(*task)
        except Exception:  # MemoryError and RecursionError included: "could not verify"
            result = None
        conn.send((result, time.process_time() - start))


def main(argv: list[str]) -> None:
    """Warm Math-Verify, report ready on the control socket ``argv[0]``, then fork a worker per request."""
    # Math-Verify and SymPy initialise lazily on first use: do it once here, for every forked worker to inherit.
    run("verify", "either", "\\frac{1}{2}+x^{2}", "(1,2)", {})
    ctl = socket.socket(fileno=int(argv[0]))
    memory_mb = int(argv[1])
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped automatically
    ctl.sendall(b"R")
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1, 1)
        except OSError:
            break
        if not msg:  # the parent is gone
            break
        pid = os.fork()
        if pid == 0:
            ctl.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if memory_mb:
                limit_memory(memory_mb)
            serve(Connection(fds[0]))
            os._exit(0)
        os.close(fds[0])
        ctl.sendall(pid.to_bytes(8, "little"))


if __name__ == "__main__":  # only ever run as a script: importing this module must not start a zygote
    main(sys.argv[1:])
