"""Bad data and concurrent runs: a corrupted shard, non-finite hidden states, a collection without one right answer
and two runs on one output directory are each refused in one line before any work; strict JSON on stdout."""

import dataclasses
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from helpers.cli import run_command
from helpers.shards import make_problem, write_dataset
from hf_msv.collect.store import LOCK_FILE, acquire_lock, check_unlocked, release_lock, write_index
from hf_msv.data import write_shard
from hf_msv.data.shards import check_finite, list_shards, verify_checksums
from hf_msv.errors import UserError


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)


@pytest.fixture
def no_training(monkeypatch):
    """Training fails the test: every refusal here must come before it."""
    import hf_msv.training.cli

    def train(*args, **kwargs):
        raise AssertionError("training started on data that should have been refused")

    monkeypatch.setattr(hf_msv.training.cli, "train_verifier", train)


def _line(code, err, command="train"):
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"hf-msv {command}: error: "), err
    return lines[0]


def _train(capsys, train, val, out):
    return run_command(["train", "--train_dir", str(train), "--val_dir", str(val), "--output_dir", str(out)], capsys)


def _corrupt(path, offset_from_end=4096, size=4096):
    """Random bytes over the data (the header stays intact), as a failing disk or a bad copy leaves them."""
    data = bytearray(path.read_bytes())
    start = max(len(data) - offset_from_end, 0)
    data[start : start + size] = np.random.default_rng(0).integers(0, 256, size=min(size, len(data) - start)).tobytes()
    path.write_bytes(bytes(data))


def test_a_corrupted_shard_fails_its_checksum(tmp_path, capsys, no_training):
    (tmp_path / "train").mkdir()
    write_dataset(tmp_path / "train", num_problems=4)
    write_index(tmp_path / "train")
    assert verify_checksums(list_shards(tmp_path / "train")) == []
    shard = list_shards(tmp_path / "train")[0]
    _corrupt(shard)
    with pytest.raises(UserError, match="checksum"):
        verify_checksums([shard])
    line = _line(*_train(capsys, tmp_path / "train", tmp_path / "train", tmp_path / "out")[::2])
    assert str(shard) in line and "checksum" in line


def test_shards_without_checksums_stay_readable_and_are_named_unchecked(tmp_path):
    (tmp_path / "old").mkdir()
    write_dataset(tmp_path / "old", num_problems=2)  # no index.json: written before checksums
    files = list_shards(tmp_path / "old")
    assert verify_checksums(files) == files
    (tmp_path / "old" / "index.json").write_text(json.dumps({"shards": {}, "problems": 0}))  # an old index
    assert verify_checksums(files) == files


def test_non_finite_hidden_states_are_named_by_file_and_row(tmp_path, capsys, no_training):
    (tmp_path / "train").mkdir()
    problems = [make_problem(f"q{i}", seed=i) for i in range(2)]
    problems[1].hidden_states[3, 0] = float("nan")
    write_shard(tmp_path / "train" / "shard-r000-00000.safetensors", problems, {"checker": "exact"})
    row = len(problems[0].hidden_states) + 3
    with pytest.raises(UserError, match=f"row {row} \\(problem 'q1'\\) are not finite"):
        check_finite(tmp_path / "train" / "shard-r000-00000.safetensors")
    line = _line(*_train(capsys, tmp_path / "train", tmp_path / "train", tmp_path / "out")[::2])
    assert "shard-r000-00000.safetensors" in line and f"row {row}" in line


def test_no_right_answers_is_reported(tmp_path, capsys, no_training):
    (tmp_path / "train").mkdir()
    problems = [make_problem(f"q{i}", seed=i) for i in range(3)]
    for p in problems:
        p.answer_correct = np.zeros_like(np.asarray(p.answer_correct, dtype=bool))
    write_shard(tmp_path / "train" / "shard-r000-00000.safetensors", problems, {"checker": "exact"})
    line = _line(*_train(capsys, tmp_path / "train", tmp_path / "train", tmp_path / "out")[::2])
    assert "--train-dir" in line and "no right answers" in line


def test_the_train_summary_is_strict_json(tmp_path, capsys, monkeypatch):
    import hf_msv.training.cli as cli
    from hf_msv.training.trainer import TrainingResult

    (tmp_path / "d").mkdir()
    write_dataset(tmp_path / "d", num_problems=2)
    fields = {f.name: None for f in dataclasses.fields(TrainingResult)}
    result = TrainingResult(**dict(fields, output_dir="o", best_step=0, best_metrics={"auroc": float("nan")}))
    monkeypatch.setattr(cli, "train_verifier", lambda *a, **k: result)
    code, out, _ = _train(capsys, tmp_path / "d", tmp_path / "d", tmp_path / "out")
    summary = json.loads(out.strip().splitlines()[-1], parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert code == 0 and summary["best_metrics"] == {"auroc": None}


def test_one_writer_per_output_dir(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        with pytest.raises(UserError, match=f"being written by another run \\(pid {sleeper.pid}"):
            acquire_lock(tmp_path)
        with pytest.raises(UserError, match="--output-dir"):
            check_unlocked(tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    lock = acquire_lock(tmp_path)  # its holder was killed: a stale lock is taken over
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    release_lock(lock)
    assert not lock.exists()


def test_saved_verifiers_take_the_users_umask(tmp_path):
    """safetensors writes 0600; a verifier saved in a shared directory must be readable as the umask allows."""
    from hf_msv.hub import save_verifier
    from hf_msv.modeling_probe import ProbeConfig, ProbeVerifier

    probe = ProbeVerifier(ProbeConfig(hidden_size=8, intermediate_size=16, mode="terminal"))
    old = os.umask(0o022)
    try:
        save_verifier(probe, tmp_path / "v")
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "v").iterdir()}
        os.umask(0o077)
        save_verifier(probe, tmp_path / "private")
        private = {p.stat().st_mode & 0o777 for p in (tmp_path / "private").iterdir()}
    finally:
        os.umask(old)
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
    assert private == {0o600}


def test_the_readme_own_lm_snippet_handles_no_answer():
    """With a weak LM no sequence may give an answer (``chosen`` is None): the snippet's lines that read the chosen
    answer still run."""
    import textwrap
    from pathlib import Path
    from types import SimpleNamespace

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index('name = "deepseek-ai/') :].split("```", 1)[0]
    lines = [line for line in block.splitlines() if "chosen" in line or line.strip().startswith("print(")]
    assert sum("chosen" in line for line in lines) >= 2
    empty = SimpleNamespace(chosen=None, confidence=0.0, stop_step=3, tokens_decoded=10)
    problem = SimpleNamespace(gold="1")
    namespace = {"result": empty, "best": empty, "problems": [problem], "problem": problem, "print": lambda *a: None}
    for line in lines:  # in order, in one namespace: a line may use a name the one before set
        exec(textwrap.dedent(line), namespace)


def test_shards_take_the_users_umask(tmp_path):
    """Shards (and the index beside them) get the mode the user's umask gives a new file, not a fixed 0644."""
    from helpers.evaluation import write_split

    old = os.umask(0o027)
    try:
        write_split(tmp_path / "shared", 2, seed=1, num_sequences=2)
    finally:
        os.umask(old)
    modes = {p.stat().st_mode & 0o777 for p in (tmp_path / "shared").glob("*.safetensors")}
    assert modes == {0o640}
