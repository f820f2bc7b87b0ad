"""Smoke tests: every example and the main job run as a user would run them, and print what they promise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(args, tmp_path, timeout=600):
    env = dict(os.environ, HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    result = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def test_push_to_hub_dry_run_lists_weights_code_and_card(tmp_path):
    out = run([ROOT / "examples/push_to_hub_dry_run.py"], tmp_path)
    for name in ("model.safetensors", "config.json", "modeling_msv.py", "configuration_msv.py", "README.md"):
        assert name in out
    assert "base_model: your-org/your-reasoning-lm" in out and "MSVVerifier" in out


def test_early_stopping_example_stops_and_reports(tmp_path):
    out = run([ROOT / "examples/early_stopping.py", "-n", "8", "--threshold", "0.5"], tmp_path)
    assert "chosen" in out and "stopped early" in out and "time split" in out


def test_best_of_n_example_compares_with_majority_vote(tmp_path):
    out = run([ROOT / "examples/best_of_n.py", "-n", "4", "--problems", "1"], tmp_path)
    assert "MSV best-of-4" in out and "majority vote" in out


def test_collect_and_train_example_writes_a_loadable_verifier(tmp_path):
    run(
        [
            ROOT / "examples/collect_and_train.py",
            "--train-problems",
            "4",
            "--val-problems",
            "2",
            "-n",
            "4",
            "--max-new-tokens",
            "160",
            "--output-dir",
            str(tmp_path / "recipe"),
        ],
        tmp_path,
    )
    from hf_msv import MSVVerifier

    verifier = MSVVerifier.from_pretrained(tmp_path / "recipe" / "verifier")
    assert verifier.config.num_sequences == 4
    assert (tmp_path / "recipe" / "verifier" / "README.md").exists()


def test_vllm_example_runs_its_help_without_vllm(tmp_path):
    """The sampling half imports vLLM lazily: the script loads (and its writer is tested in test_traces.py)."""
    out = run([ROOT / "examples/sample_with_vllm.py", "--help"], tmp_path)
    assert "--num-samples" in out and "--logprobs" in out


@pytest.mark.slow
def test_main_job_prints_the_per_problem_table_and_totals(tmp_path):
    out = run(["-m", "hf_msv.cli", "demo", "--problems", "3", "--output-dir", str(tmp_path)], tmp_path)
    assert "chosen" in out and "accuracy: MSV selection" in out and "tokens decoded:" in out and "pruned" in out
    assert (tmp_path / "demo.png").exists()


def test_demo_defaults_follow_the_shipped_verifier():
    """The demo's default is what the shipped MSV_16 certified (`fit_shipped_stopping`, recorded beside it and in its
    config): its λ and its pruning rule, read by `MSVEarlyStop.from_verifier`; ``--threshold`` is a λ of one's own
    without pruning, ``--no-prune`` the stop alone; `--device auto` picks the GPU only when there is one."""
    import json

    import torch

    from hf_msv import MSVEarlyStop, MSVVerifier
    from hf_msv.demo import DemoConfig, build_parser
    from hf_msv.generation import CERTIFIED
    from hf_msv.pruning import PruneRule
    from hf_msv.reproduction import SHIPPED_LAMBDA_FILE
    from hf_msv.stop_rules import ConfidenceMap
    from hf_msv.testbed import TESTBED_VERIFIER_DIR
    from hf_msv.utils import resolve_device

    stopping = json.loads((TESTBED_VERIFIER_DIR / SHIPPED_LAMBDA_FILE).read_text())
    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR)
    criterion, alone = MSVEarlyStop.from_verifier(verifier), MSVEarlyStop.from_verifier(verifier, prune=False)
    # The stop alone: the λ recorded beside the verifier, reporting through the map fitted on its calibration stops.
    assert abs(stopping["lambda"] - alone.threshold) < 0.005 and stopping["num_sequences"] == 16
    assert alone.prune is None and alone.confidence_map == ConfidenceMap.of(verifier.config)
    # The default: the pair certified jointly (its own λ, rule and map), stored in the config.
    pair = verifier.config.early_stopping["pruning"]
    assert criterion.prune == PruneRule.of(verifier.config) and not criterion.prune.off
    assert criterion.threshold == pair["lambda"]["lam"] and criterion.confidence_map == ConfidenceMap.from_dict(
        pair["confidence_map"]
    )
    (args,) = build_parser().parse_args_into_dataclasses([])
    assert args.threshold is None and args.prune and args.device == "auto"
    assert args.resolved_threshold == CERTIFIED and DemoConfig(threshold=0.5).resolved_threshold == 0.5
    (no_prune,) = build_parser().parse_args_into_dataclasses(["--no-prune"])
    assert not no_prune.prune and MSVEarlyStop.resolve(CERTIFIED, verifier, no_prune.prune).prune is None
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_cli_lists_the_commands_and_dispatches_to_their_main(monkeypatch, capsys):
    import hf_msv.demo
    from hf_msv import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    for name, (_, line) in cli.COMMANDS.items():
        assert name in help_text and line.split(",")[0] in help_text
    seen = []
    monkeypatch.setattr(hf_msv.demo, "main", seen.append)
    cli.main(["demo", "-n", "8", "--problems", "2"])
    assert seen == [["-n", "8", "--problems", "2"]]
    import importlib

    for module, _ in cli.COMMANDS.values():  # every command's package exposes main(argv)
        assert callable(importlib.import_module(module).main)


def test_demo_flags_keep_their_names():
    from hf_msv.demo import build_parser

    (config,) = build_parser().parse_args_into_dataclasses(
        ["-n", "8", "--max-new-tokens", "50", "--gguf-file", "m.gguf", "--output-dir", "o", "--threshold", "0.7"]
    )
    assert (config.num_sequences, config.max_new_tokens, config.gguf_file, config.output_dir) == (8, 50, "m.gguf", "o")
    assert config.threshold == 0.7 and config.problems == 12


@pytest.mark.parametrize("command", ["collect", "train", "evaluate", "reproduce", "demo"])
def test_every_command_prints_its_help(command, capsys):
    """argparse %-formats help strings: a bare "%" in a field's help (e.g. "95 % intervals") crashes --help."""
    from hf_msv import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0 and "--" in capsys.readouterr().out


def test_every_benchmark_and_example_has_a_quick_mode():
    """`scripts/bench_smoke.sh` runs ``<script> --quick`` for every benchmark and example: each must declare the flag
    (an argparse option string, read from the source without running it) so that none can rot unnoticed."""
    import ast

    scripts = sorted(
        p for d in ("benchmarks", "examples") for p in (ROOT / d).glob("*.py") if not p.name.startswith("_")
    )
    assert len(scripts) >= 10
    missing = []
    for path in scripts:
        flags = {
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--")
        }
        if "--quick" not in flags:
            missing.append(path.name)
    assert not missing, f"no --quick mode: {missing}"
    smoke = (ROOT / "scripts" / "bench_smoke.sh").read_text()
    assert "for f in benchmarks/*.py examples/*.py" in smoke and "--quick" in smoke


def test_demo_without_matplotlib_prints_its_table_and_says_how_to_get_the_figure(monkeypatch, tmp_path, capsys):
    """The figure is an extra (``hf-msv[report]``): without matplotlib the demo still finishes, draws nothing and
    names the extra in one line."""
    import importlib.util

    from hf_msv import MSVEarlyStop, MSVVerifier
    from hf_msv.demo import DemoConfig, run_demo
    from hf_msv.testbed import TESTBED_VERIFIER_DIR

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    rows = run_demo(DemoConfig(problems=1, num_sequences=2, max_new_tokens=24, output_dir=str(tmp_path / "demo")))
    out = capsys.readouterr().out
    lam = MSVEarlyStop.from_verifier(MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR)).threshold
    assert len(rows) == 1 and "accuracy: MSV selection" in out and f"λ={lam}" in out and "chains pruned" in out
    assert 'figure: not drawn, matplotlib is not installed (pip install "hf-msv[report]")' in out
    assert not (tmp_path / "demo").exists()
