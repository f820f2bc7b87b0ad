"""A fuzzer of ``hf-msv``: invocations of every command built from its parser's flags (its dataclass fields) with
hostile values — wrong types, negatives, empty, huge, paths that are files / missing / unwritable / locked by another
run, malformed YAML, corrupted shards — and hostile runs (interrupted, a disk that fills mid-write).

Each must end with exit code 0, 2 (a user error) or 130 (interrupted), at most one error line on stderr (warnings
aside), no traceback, nothing written in the working directory, and the shards already written untouched. Where a
command would start its work (load an LM, train, evaluate, ...), a stub stands in: what is fuzzed is everything
before it, which is where bad input must be refused; the stub then ends the run as it would (done, Ctrl-C, or a
full disk). ``make test`` tries `EXAMPLES` invocations per command; ``make test-slow`` `SLOW_EXAMPLES`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.shards import write_dataset
from hf_msv.cli import COMMANDS, main

EXAMPLES = 25
SLOW_EXAMPLES = 300
COUNTS: Counter = Counter()  # invocations tried per command (reported by test_fuzz_counts)

# command -> (module, attribute) of the step where its work starts: replaced by a stub
WORK = {
    "demo": [("hf_msv.demo", "run_demo")],
    "collect": [("hf_msv.collect.lm", "load_lm")],
    "train": [("hf_msv.training.cli", "train_verifier"), ("hf_msv.training.sweep", "sweep_learning_rates")],
    "evaluate": [("hf_msv.evaluation.cli", "evaluate_study")],
    "reproduce": [
        ("hf_msv.reproduction.pipeline", "reproduce"),
        ("hf_msv.reproduction.pipeline", "train_shipped_verifier"),
    ],
    "respace": [("hf_msv.collect.respace", "respace_collection")],
    "export": [("hf_msv.data.cli", "export_from_config")],
}
ENDINGS = ("done", "interrupted", "disk full")


class _Done(Exception):
    """Raised by a stub: the command got past every check and would start its work now."""


def _parser(command: str):
    """The command's parser, as its ``main`` builds it."""
    from hf_msv.arguments import CommandParser

    if command == "collect":
        from hf_msv.collect.config import build_parser

        return build_parser()
    if command == "train":
        from hf_msv.training.cli import build_train_parser

        return build_train_parser()
    if command == "demo":
        from hf_msv.demo import DemoConfig

        return CommandParser(DemoConfig)
    if command == "evaluate":
        from hf_msv.evaluation.config import EvaluateConfig

        return CommandParser(EvaluateConfig)
    if command == "reproduce":
        from hf_msv.reproduction.pipeline import ReproduceArguments

        return CommandParser(ReproduceArguments)
    if command == "respace":
        from hf_msv.collect.respace import RespaceConfig

        return CommandParser(RespaceConfig)
    from hf_msv.data.cli import ExportConfig

    return CommandParser(ExportConfig)


def _flags(command: str) -> list[argparse.Action]:
    skip = {"help", "config", "log_level"}
    flags = [a for a in _parser(command)._actions if a.dest not in skip and a.option_strings]
    # --engine vllm hands the run to another environment (.venv-vllm): not fuzzed here
    return [a for a in flags if a.dest != "engine"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Paths of every kind a hostile user gives, and the shards that must survive every run."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "a_file.txt").write_text("not a directory\n")
    (root / "empty").mkdir()
    (root / "shards").mkdir()
    write_dataset(root / "shards", num_problems=3)
    (root / "corrupt").mkdir()
    write_dataset(root / "corrupt", num_problems=2)
    shard = sorted((root / "corrupt").glob("shard-*"))[0]
    shard.write_bytes(shard.read_bytes()[:200] + os.urandom(512))
    (root / "unwritable").mkdir(mode=0o500)
    (root / "locked").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    (root / "locked" / ".hf_msv-collect.lock").write_text(
        json.dumps({"pid": holder.pid, "host": socket.gethostname()})
    )
    (root / "bad.yaml").write_text("num_samples: [unclosed\n")
    (root / "list.yaml").write_text("- a\n- b\n")
    (root / "hostile.yaml").write_text("num_samples: -3\nlog_level: loud\nseed: many\n")
    (root / "empty.jsonl").write_text("")
    paths = {name: str(root / name) for name in ("a_file.txt", "empty", "shards", "corrupt", "unwritable", "locked")}
    paths |= {
        "missing": str(root / "no" / "such"),
        "yaml": str(root / "bad.yaml"),
        "list_yaml": str(root / "list.yaml"),
    }
    paths |= {"hostile_yaml": str(root / "hostile.yaml"), "empty_jsonl": str(root / "empty.jsonl")}
    yield paths
    sys.__stdout__.write(f"\nfuzzed invocations per command: {dict(COUNTS)} (total {sum(COUNTS.values())})\n")
    holder.kill()
    holder.wait()
    os.chmod(root / "unwritable", 0o700)


def _digest(directory: str) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).glob("*"))}


NUMBERS = ["-1", "0", "1", "3", "-0.5", "1e309", "nan", "inf", "-inf", "99999999999999999999", "many", "", "0x10"]
TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)


def _values(action: argparse.Action, paths: dict):
    """Hostile values of one flag (a list of strings: what follows it on the command line)."""
    pool = [st.sampled_from(sorted(paths.values())), st.sampled_from(NUMBERS), TEXTS]
    if action.choices:
        pool.append(st.sampled_from([str(c) for c in action.choices] + ["bogus", ""]))
    one = st.one_of(*pool)
    if action.nargs == 0:  # store_true / store_false
        return st.just([])
    if action.nargs in ("+", "*"):
        return st.lists(one, min_size=0, max_size=3)
    if action.nargs == "?":
        return st.one_of(st.just([]), one.map(lambda v: [v]))
    return one.map(lambda v: [v])


@st.composite
def invocations(draw, command: str, paths: dict):
    """(argv, how the work ends): required flags given most of the time (to get past them), 1-4 others."""
    flags = _flags(command)
    required = [a for a in flags if a.required]
    chosen = [a for a in required if draw(st.integers(0, 9)) > 0]
    chosen += draw(st.lists(st.sampled_from(flags), min_size=1, max_size=4)) if flags else []
    argv = [command]
    for action in chosen:
        argv += [draw(st.sampled_from(action.option_strings)), *draw(_values(action, paths))]
    if draw(st.integers(0, 5)) == 0:
        argv += ["--config", draw(st.sampled_from([paths["yaml"], paths["list_yaml"], paths["hostile_yaml"]]))]
    if draw(st.integers(0, 7)) == 0:
        argv += ["--log-level", draw(st.sampled_from(["debug", "loud", ""]))]
    return argv, draw(st.sampled_from(ENDINGS))


def _stub(ending: str, out: str):
    def work(*args, **kwargs):
        if ending == "interrupted":
            raise KeyboardInterrupt
        if ending == "disk full":
            raise OSError(errno.ENOSPC, "No space left on device", os.path.join(out, "shard-r000-00000.safetensors"))
        raise _Done

    return work


def _run(argv: list[str], ending: str, paths: dict, scratch: Path) -> tuple[int, str]:
    """(exit code, stderr) of ``hf-msv argv`` in this process, in an empty working directory, work stubbed."""
    import importlib

    patches = []
    for module_name, attribute in WORK[argv[0]]:
        module = importlib.import_module(module_name)
        patches.append((module, attribute, getattr(module, attribute)))
        setattr(module, attribute, _stub(ending, paths["empty"]))
    err, cwd = io.StringIO(), os.getcwd()
    os.chdir(scratch)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                main(argv)
                code = 0
            except _Done:
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os.chdir(cwd)
        for module, attribute, original in patches:
            setattr(module, attribute, original)
    return code, err.getvalue()


def _check(argv, ending, paths, tmp_path_factory):
    os.environ.pop("HF_MSV_DEBUG", None)
    scratch = tmp_path_factory.mktemp("cwd")
    before = {name: _digest(paths[name]) for name in ("shards", "corrupt")}
    COUNTS[argv[0]] += 1
    code, err = _run(argv, ending, paths, scratch)
    expected = {0, 2, 130} if ending == "interrupted" else {0, 2}
    assert code in expected, (argv, ending, code, err[-3000:])
    assert "Traceback" not in err, (argv, err[-3000:])
    errors = [line for line in err.splitlines() if line.strip() and not _is_warning(line)]
    assert len(errors) <= 1, (argv, ending, errors)
    written = {p.name for p in scratch.iterdir()} - {os.path.basename(a.rstrip("/")) for a in argv}
    assert not written, (argv, written)  # nothing written where no flag pointed
    assert {name: _digest(paths[name]) for name in before} == before, argv  # nothing already written lost


def _is_warning(line: str) -> bool:
    """Warnings are not errors: ours (``warning: ...``), logging's and Python's (library deprecations)."""
    return line.startswith(("warning:", "WARNING ", "  warnings.warn")) or "Warning:" in line or "warn(" in line


@pytest.mark.parametrize("command", list(COMMANDS))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_command(command, data, world, tmp_path_factory):
    argv, ending = data.draw(invocations(command, world))
    _check(argv, ending, world, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
@settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_command_long(command, data, world, tmp_path_factory):
    argv, ending = data.draw(invocations(command, world))
    _check(argv, ending, world, tmp_path_factory)
