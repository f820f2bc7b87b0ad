"""`hf-msv`: every command against each kind of bad input ends as one line on stderr, exit code 2, no traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.shards import write_dataset
from hf_msv.cli import error_line, main
from hf_msv.errors import UserError, check_checkpoint_dir, looks_like_path


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Bad inputs of every kind, and one good shard directory to put them beside."""
    root = tmp_path_factory.mktemp("cli")
    (root / "a_file.txt").write_text("not a directory\n")
    (root / "empty").mkdir()
    (root / "shards").mkdir()
    write_dataset(root / "shards", num_problems=3)
    (root / "bad_shards").mkdir()
    (root / "bad_shards" / "shard-r000-00000.safetensors").write_bytes(b"not safetensors" * 8)
    (root / "bad_config").mkdir()
    (root / "bad_config" / "config.json").write_text("{not json")
    (root / "bad.jsonl").write_text("{not json\n")
    (root / "bad_report").mkdir()
    (root / "bad_report" / "testbed-v2-quick.json").write_text("{not json")
    return {
        "missing": str(root / "no" / "such" / "dir"),
        "file": str(root / "a_file.txt"),
        "empty": str(root / "empty"),
        "shards": str(root / "shards"),
        "bad_shards": str(root / "bad_shards"),
        "bad_config": str(root / "bad_config"),
        "bad_jsonl": str(root / "bad.jsonl"),
        "bad_report": str(root / "bad_report"),
        "out": str(root / "out"),
    }


# (command, kind of bad input) -> (argv with {placeholders} for `paths`, what the message must name)
CASES = {
    ("demo", "missing dir"): ("demo --model {missing} --verifier {missing}", "{missing}"),
    ("demo", "file for a dir"): ("demo --model {file} --verifier {file}", "{file}"),
    ("demo", "empty dir"): ("demo --model {empty} --verifier {empty}", "{empty}"),
    ("demo", "bad flag value"): ("demo --num_sequences many", "--num_sequences"),
    ("demo", "flag missing its partner"): ("demo --model {empty}", "--verifier"),
    ("demo", "bad data"): ("demo --model {bad_config} --verifier {bad_config}", "{bad_config}"),
    ("collect", "missing dir"): (
        "collect --model {missing} --problems testbed:validation:2 --output_dir {out}",
        "{missing}",
    ),
    ("collect", "file for a dir"): (
        "collect --model {file} --problems testbed:validation:2 --output_dir {out}",
        "{file}",
    ),
    ("collect", "empty dir"): (
        "collect --model {empty} --problems testbed:validation:2 --output_dir {out}",
        "{empty}",
    ),
    ("collect", "bad flag value"): ("collect --model testbed --num_samples many --output_dir {out}", "--num_samples"),
    ("collect", "missing file"): (
        "collect --model testbed --problems {missing}.jsonl --output_dir {out}",
        "{missing}.jsonl",
    ),
    ("collect", "bad data"): ("collect --model testbed --problems {bad_jsonl} --output_dir {out}", "{bad_jsonl}"),
    ("train", "missing dir"): ("train --train_dir {missing} --val_dir {missing} --output_dir {out}", "{missing}"),
    ("train", "file for a dir"): ("train --train_dir {file} --val_dir {file} --output_dir {out}", "{file}"),
    ("train", "empty dir"): ("train --train_dir {empty} --val_dir {empty} --output_dir {out}", "{empty}"),
    ("train", "bad flag value"): (
        "train --train_dir {shards} --val_dir {shards} --output_dir {out} --learning_rate fast",
        "--learning_rate",
    ),
    ("train", "bad data"): (
        "train --train_dir {bad_shards} --val_dir {bad_shards} --output_dir {out}",
        "{bad_shards}",
    ),
    ("evaluate", "missing dir"): ("evaluate --eval_dir {missing} --output_dir {out}", "{missing}"),
    ("evaluate", "file for a dir"): ("evaluate --eval_dir {file} --output_dir {out}", "{file}"),
    ("evaluate", "empty dir"): ("evaluate --eval_dir {empty} --output_dir {out}", "{empty}"),
    ("evaluate", "empty verifier dir"): (
        "evaluate --eval_dir {shards} --output_dir {out} --verifier x={empty}",
        "{empty}",
    ),
    ("evaluate", "bad flag value"): (
        "evaluate --eval_dir {shards} --output_dir {out} --bootstrap lots",
        "--bootstrap",
    ),
    ("evaluate", "N beyond the data"): (
        "evaluate --eval_dir {shards} --output_dir {out} --num_sequences 64",
        "--num-sequences",
    ),
    ("evaluate", "unknown flag"): ("evaluate --eval_dir {shards} --output_dir {out} --frobnicate 3", "--frobnicate"),
    ("evaluate", "bad data"): ("evaluate --eval_dir {bad_shards} --output_dir {out}", "{bad_shards}"),
    ("reproduce", "missing dir"): ("reproduce --quick --continue_report --output_dir {missing}", "{missing}"),
    ("reproduce", "file for a dir"): ("reproduce --quick --work_dir {file} --output_dir {out}", "{file}"),
    ("reproduce", "empty dir"): ("reproduce --quick --continue_report --output_dir {empty}", "{empty}"),
    ("reproduce", "bad flag value"): ("reproduce --studies everything", "--studies"),
    ("reproduce", "bad data"): ("reproduce --quick --continue_report --output_dir {bad_report}", "{bad_report}"),
}


def run_cli(argv, capsys, stdout=None):
    """(exit code, stderr lines) of ``hf-msv argv`` run in this process; ``stdout``: a list that gets its stdout."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    if stdout is not None:
        stdout.append(captured.out)
    return exit_info.value.code, captured.err.strip().splitlines()


@pytest.mark.parametrize("command, kind", list(CASES), ids=[f"{c}-{k}" for c, k in CASES])
def test_user_error_is_one_line(command, kind, paths, capsys, monkeypatch):
    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)
    template, named = CASES[command, kind]
    argv = [part.format(**paths) for part in template.split()]
    code, lines = run_cli(argv, capsys)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"hf-msv {command}: error: "), lines
    assert "Traceback" not in lines[0]
    assert named.format(**paths) in lines[0]
    assert "Repo id must be in the form" not in lines[0]  # a local path is never read as a malformed Hub id


def test_debug_shows_the_exception(paths, capsys, monkeypatch):
    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)
    argv = ["train", "--train_dir", paths["missing"], "--val_dir", paths["missing"], "--output_dir", paths["out"]]
    for debug_argv in (["--debug", *argv], [*argv, "--debug"]):  # before or after the command
        with pytest.raises(FileNotFoundError, match="no shard file or directory"):
            main(debug_argv)
    monkeypatch.setenv("HF_MSV_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(argv)
    monkeypatch.setenv("HF_MSV_DEBUG", "0")
    assert run_cli(argv, capsys)[0] == 2


def test_unknown_command_and_no_command(capsys):
    code, lines = run_cli(["frobnicate"], capsys)
    assert code == 2 and len(lines) == 1 and "invalid choice: 'frobnicate'" in lines[0]
    code, lines = run_cli([], capsys)
    assert code == 2 and len(lines) == 1 and "<command>" in lines[0]


def test_command_help_still_exits_0(capsys):
    out = []
    code, lines = run_cli(["train", "--help"], capsys, stdout=out)
    assert code == 0 and not lines and "--train_dir" in out[0]


def _hf_msv():
    script = Path(sys.executable).with_name("hf-msv")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hf_msv.cli"]


def test_help_does_not_import_torch():
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    done = subprocess.run([*_hf_msv(), "--help"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "train" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "hf_msv.cli" in imported
    assert not {"torch", "transformers", "numpy"} & imported


def test_no_traceback_in_a_real_process(paths):
    argv = ["evaluate", "--eval_dir", paths["missing"], "--output_dir", paths["out"]]
    env = {k: v for k, v in os.environ.items() if k != "HF_MSV_DEBUG"}
    done = subprocess.run([*_hf_msv(), *argv], capture_output=True, text=True, env=env, timeout=600)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and paths["missing"] in lines[0]


def test_error_line():
    assert error_line(FileNotFoundError(2, "No such file or directory", "/x/y")) == "no such file or directory: /x/y"
    assert error_line(ValueError("two\n  lines")) == "two lines"
    assert error_line(KeyError("field")) == "field"
    assert error_line(UserError("")) == "UserError"


def test_checkpoint_dir_checks(tmp_path):
    assert check_checkpoint_dir("Qwen/Qwen2.5-0.5B", "LM") is None  # a Hub id is left to transformers
    assert looks_like_path(str(tmp_path)) and looks_like_path("./lm") and looks_like_path("a/b/c")
    assert not looks_like_path("gpt2") and not looks_like_path("org/name")
    with pytest.raises(FileNotFoundError, match="No such LM directory"):
        check_checkpoint_dir(str(tmp_path / "nope"), "LM")
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        check_checkpoint_dir(str(tmp_path / "f"), "LM")
    with pytest.raises(FileNotFoundError, match=r"config.json"):
        check_checkpoint_dir(str(tmp_path), "verifier")
    assert check_checkpoint_dir(str(tmp_path), "LM", required=None) == tmp_path
    (tmp_path / "config.json").write_text(json.dumps({}))
    assert check_checkpoint_dir(str(tmp_path), "verifier") == tmp_path


def _command_raising(monkeypatch, error_or_factory):
    """Make ``hf-msv train`` raise (`error_or_factory(argv)` when callable) from inside its ``main``."""
    import hf_msv.training

    def main(argv):
        raise error_or_factory(argv) if callable(error_or_factory) else error_or_factory

    monkeypatch.setattr(hf_msv.training, "main", main)


def _wrapped(argv):
    try:
        raise UserError("no shards in /data")
    except UserError as e:
        raise FileNotFoundError(f"training data (--train-dir /data): {e}") from e  # a caller adding context


def _bug_while_handling(argv):
    try:
        raise UserError("no shards in /data")
    except UserError:
        raise KeyError("a bug in the handler")  # noqa: B904 (raised while handling one, not `from` it: internal)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bug"),
        OSError("disk trouble"),
        KeyError("field"),
        FileNotFoundError(2, "No such file or directory", "/internal/cache.json"),
        _bug_while_handling,
    ],
)
def test_an_internal_error_keeps_its_traceback(error, capsys, monkeypatch):
    """Only user errors become one line: any other exception, even a ValueError or an OSError on a path the user
    did not give, propagates as raised (Python prints its traceback and exits with code 1)."""
    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)
    _command_raising(monkeypatch, error)
    expected = type(error) if isinstance(error, BaseException) else KeyError
    with pytest.raises(expected):
        main(["train", "--output_dir", "/tmp/x"])
    assert "error:" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "error, line",
    [
        (UserError("bad input"), "bad input"),
        (_wrapped, "training data (--train-dir /data): no shards in /data"),
        (lambda argv: FileExistsError(17, "File exists", argv[1]), "not a directory (a file is in the way): {file}"),
        (lambda argv: PermissionError(13, "Permission denied", argv[1] + "/"), "permission denied: {file}/"),
    ],
)
def test_user_errors_raised_from_a_command_are_one_line(error, line, paths, capsys, monkeypatch):
    """A `UserError`, an exception raised ``from`` one, and the system's OSError on a path given on the command
    line end as one line and exit code 2."""
    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)
    _command_raising(monkeypatch, error)
    code, lines = run_cli(["train", "--work_dir", paths["file"]], capsys)
    assert code == 2 and lines == [f"hf-msv train: error: {line.format(**paths)}"]


def test_an_unsupported_model_is_a_user_error(capsys, monkeypatch):
    from hf_msv.errors import UnsupportedError

    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)
    _command_raising(monkeypatch, UnsupportedError("MSV generation cannot fork the decoding state of RwkvForCausalLM"))
    code, lines = run_cli(["train"], capsys)
    assert code == 2 and lines == [
        "hf-msv train: error: MSV generation cannot fork the decoding state of RwkvForCausalLM"
    ]


def test_user_error_kinds():
    from hf_msv.errors import MissingPathError, NotADirectoryPathError, UnsupportedError

    missing = MissingPathError(2, "No such LM directory", "/x")
    assert isinstance(missing, FileNotFoundError) and isinstance(missing, UserError) and missing.filename == "/x"
    assert error_line(missing) == "no such LM directory: /x"
    assert isinstance(NotADirectoryPathError(20, "Not a directory", "/f"), NotADirectoryError)
    assert isinstance(UnsupportedError("x"), NotImplementedError) and isinstance(UserError("x"), ValueError)


def test_an_internal_error_exits_1_with_a_traceback_in_a_real_process():
    code = (
        "import sys, hf_msv.training as t\n"
        "def main(argv): raise ValueError('bug')\n"
        "t.main = main\n"
        "from hf_msv.cli import main as cli\n"
        "cli(['train'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_MSV_DEBUG"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ValueError: bug" in done.stderr
    assert "hf-msv train: error" not in done.stderr
