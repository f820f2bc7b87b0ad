"""Bad input a new user can give ``hf-msv``: each is refused in one line (exit 2), in CLI terms, before any model or
data loads; and the parser machinery behind that changes nothing of argparse or transformers."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import run_command
from hf_msv.collect.config import CollectConfig
from hf_msv.collect.model_arguments import ModelArguments
from hf_msv.errors import UserError


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)


@pytest.fixture
def no_lm_load(monkeypatch):
    """Loading an LM fails the test: every refusal here must come before it."""
    import hf_msv.collect.lm

    def load_lm(*args, **kwargs):
        raise AssertionError("the LM was loaded before the input was checked")

    monkeypatch.setattr(hf_msv.collect.lm, "load_lm", load_lm)


def _one_error_line(code, err, command="collect"):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"hf-msv {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _hf_msv():
    script = Path(sys.executable).with_name("hf-msv")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hf_msv.cli"]


@pytest.mark.parametrize("argv", [["--help"], ["collect", "--help"]])
def test_help_imports_no_torch(argv):
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    done = subprocess.run([*_hf_msv(), *argv], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "hf_msv.cli" in imported and "torch" not in imported
    if argv[0] == "collect":
        assert "--model-dtype" in done.stdout and "hf_msv.collect.config" in imported


def test_the_cli_assigns_nothing_of_argparse_or_transformers(monkeypatch, capsys, tmp_path):
    """A command runs with argparse's and transformers' parser methods as they are (the parser is a subclass)."""
    from transformers import HfArgumentParser

    import hf_msv.training

    before = (argparse.ArgumentParser.error, HfArgumentParser.parse_args_into_dataclasses)
    seen = []
    real = hf_msv.training.main

    def main(argv):
        seen.append((argparse.ArgumentParser.error, HfArgumentParser.parse_args_into_dataclasses))
        return real(argv)

    monkeypatch.setattr(hf_msv.training, "main", main)
    flags = ["--train_dir", str(tmp_path), "--val_dir", str(tmp_path), "--output_dir", str(tmp_path)]
    code, _, err = run_command(["train", *flags, "--bogus-flag", "1"], capsys)
    line = _one_error_line(code, err, "train")
    assert "unrecognized arguments: --bogus-flag 1" in line and "--help" in line
    assert seen == [before] and (argparse.ArgumentParser.error, HfArgumentParser.parse_args_into_dataclasses) == before


@pytest.mark.parametrize(
    "given, meant", [("bf16", "bfloat16"), ("FP16", "float16"), ("fp32", "float32"), ("auto", "auto")]
)
def test_model_dtype_aliases(given, meant):
    assert ModelArguments(model_dtype=given).model_dtype == meant


def test_a_bad_model_dtype_is_one_line(capsys, tmp_path, no_lm_load):
    argv = ["collect", "--model", "testbed", "--problems", "testbed:validation:2", "--output-dir", str(tmp_path)]
    line = _one_error_line(*run_command([*argv, "--model-dtype", "bf17"], capsys)[::2])
    assert "--model-dtype bf17" in line and "bfloat16 (bf16" in line


def test_dtype_is_the_storage_dtype_and_says_so(capsys, tmp_path, no_lm_load):
    """``--dtype`` keeps its meaning (the shards' dtype); a TRL user's ``--dtype float32`` names both flags."""
    assert CollectConfig(dtype="bf16").dtype == "bfloat16" and CollectConfig(dtype="fp16").dtype == "float16"
    argv = ["collect", "--model", "testbed", "--problems", "testbed:validation:2", "--output-dir", str(tmp_path)]
    line = _one_error_line(*run_command([*argv, "--dtype", "float32"], capsys)[::2])
    assert "--dtype" in line and "--model-dtype float32" in line
    line = _one_error_line(*run_command([*argv, "--dtype", "int8"], capsys)[::2])
    assert "--dtype int8" in line and "float16" in line


def test_config_file_takes_the_log_level_and_checks_values(capsys, tmp_path, no_lm_load):
    config = tmp_path / "c.yaml"
    argv = ["collect", "--config", str(config)]
    config.write_text("log_level: info\nmodel: testbed\nnum_samples: 2\n")
    line = _one_error_line(*run_command(argv, capsys)[::2])
    assert "--output-dir" in line  # parsed: the file's options were all accepted
    config.write_text("log_level: loud\n")
    assert "log_level" in _one_error_line(*run_command(argv, capsys)[::2])
    for bad in ("num_samples: many", "num_samples: [1, 2]", "gold_format: roman", "top_p: {a: 1}"):
        config.write_text(bad + "\n")
        line = _one_error_line(*run_command(argv, capsys)[::2])
        assert bad.split(":")[0] in line, (bad, line)


def test_yaml_values_parse_as_flags(tmp_path):
    from hf_msv.arguments import parse_command_args
    from hf_msv.collect.config import build_parser

    config = tmp_path / "c.yaml"
    config.write_text("num_samples: '3'\nprogress: false\ndelimiters: [Wait, Hmm]\ntemperature: 1\n")
    (parsed,) = parse_command_args(build_parser(), ["--config", str(config)])
    assert (parsed.num_samples, parsed.progress, parsed.delimiters) == (3, False, ["Wait", "Hmm"])
    assert parsed.temperature == 1.0
    config.write_text("num_samples: true\n")
    with pytest.raises(UserError, match="num_samples"):
        parse_command_args(build_parser(), ["--config", str(config)])


def _collect_argv(out, *extra):
    return ["collect", "--model", "testbed", "--problems", "testbed:validation:2", "--output-dir", str(out), *extra]


def test_an_output_dir_that_is_a_file_is_refused_before_the_lm(capsys, tmp_path, no_lm_load):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "below"):
        line = _one_error_line(*run_command(_collect_argv(out), capsys)[::2])
        assert "--output-dir" in line and str(tmp_path / "f") in line


def test_other_settings_are_refused_before_the_lm_in_flag_terms(capsys, tmp_path, no_lm_load):
    from hf_msv.collect.job import config_settings
    from hf_msv.collect.live import LIVE_SETTINGS
    from hf_msv.utils import atomic_write_json

    config = CollectConfig(model="testbed", num_samples=4, output_dir=str(tmp_path)).resolved()
    atomic_write_json(tmp_path / "collect_config.json", config_settings(config, config.elicitation, LIVE_SETTINGS))
    line = _one_error_line(
        *run_command(_collect_argv(tmp_path, "--num-samples", "8", "--mode", "terminal"), capsys)[::2]
    )
    assert "--num-samples 4 there, 8 now" in line and "--mode 'streaming' there, 'terminal' now" in line
    assert "--overwrite" in line and "overwrite=True" not in line
    (tmp_path / "collect_config.json").write_text("{truncated")
    assert "--overwrite" in _one_error_line(*run_command(_collect_argv(tmp_path), capsys)[::2])


def test_counts_are_named_as_flags(capsys, tmp_path, no_lm_load):
    line = _one_error_line(*run_command(_collect_argv(tmp_path, "--num-samples", "0"), capsys)[::2])
    assert "--num-samples 0: must be positive" in line


@pytest.mark.parametrize("name", ["empty.jsonl", "blank.jsonl", "empty.parquet", "no_rows.parquet", "empty.csv"])
def test_empty_problem_files_are_named_as_empty(name, capsys, tmp_path, no_lm_load):
    path = tmp_path / name
    if name == "blank.jsonl":
        path.write_text("\n  \n")
    elif name == "no_rows.parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"question": pa.array([], pa.string()), "gold": pa.array([], pa.string())}), path)
    else:
        path.write_bytes(b"")
    argv = ["collect", "--model", "testbed", "--problems", str(path), "--output-dir", str(tmp_path / "out")]
    line = _one_error_line(*run_command(argv, capsys)[::2])
    assert str(path) in line and "empty" in line, line


def test_missing_columns_are_named_as_flags(capsys, tmp_path, no_lm_load):
    path = tmp_path / "p.jsonl"
    path.write_text('{"q": "1+1", "a": "2"}\n')
    argv = ["collect", "--model", "testbed", "--problems", str(path), "--output-dir", str(tmp_path / "out")]
    line = _one_error_line(*run_command(argv, capsys)[::2])
    assert "--question-column" in line and "'q'" in line


def test_no_progress_turns_off_the_libraries_bars(capsys, tmp_path, monkeypatch):
    import datasets
    from transformers.utils import logging as transformers_logging

    import hf_msv.collect.lm

    seen = []

    def load_lm(*args, **kwargs):
        seen.append((transformers_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled()))
        raise UserError("stop here")

    monkeypatch.setattr(hf_msv.collect.lm, "load_lm", load_lm)
    try:
        run_command(_collect_argv(tmp_path / "out", "--no-progress"), capsys)
    finally:
        transformers_logging.enable_progress_bar()
        datasets.enable_progress_bars()
    assert seen == [(False, False)]
