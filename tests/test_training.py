"""Tests of hf_msv.training: the paper's recipe as defaults, the Probe model, training that lowers validation BCE on
collected data (the testbed LM's when it is shipped, else a tiny scripted random LM whose labels are learnable),
best-checkpoint keeping, a weak equivalence checker at training time, and a 2-process accelerate run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import hf_msv.training.trainer as training
from helpers.collect import TOK, tiny_lm
from helpers.launch import free_port
from helpers.shards import make_problem
from hf_msv import MSVVerifier
from hf_msv.data import VERIFIER_INPUTS, ShardDataset, collate_groups, write_shard
from hf_msv.errors import UserError
from hf_msv.pruning import PruneRule
from hf_msv.training import (
    MSVTrainingConfig,
    ProbeConfig,
    ProbeVerifier,
    build_verifier,
    parse_train_args,
    train_verifier,
)


def _testbed_lm_dir():
    """The shipped testbed LM, or a checkpoint named by ``$HF_MSV_TESTBED_LM`` (e.g. one still training)."""
    from hf_msv.testbed import TESTBED_LM_DIR

    path = os.environ.get("HF_MSV_TESTBED_LM") or TESTBED_LM_DIR
    return path if (training.Path(path) / "config.json").exists() else None


TESTBED_LM = _testbed_lm_dir()


pytestmark = pytest.mark.usefixtures("single_thread")


def collect_tiny(out, split: str, n: int):
    """The tiny random LM with scripted answers "0" or "1" (the parity of where it branched), graded against a
    constant gold "1": correctness is which digit it wrote, visible in the answer tokens' hidden states."""
    from hf_msv.collect import collect
    from hf_msv.data.problems import Problem

    # " ok" * (i % 4) varies the prompt length, hence the parity that decides the scripted digit.
    problems = [
        Problem(id=f"{split}/{i}", question=f"Q{i}: add {i} and {i % 7}." + " ok" * (i % 4) + " Wait e", gold="1")
        for i in range(n)
    ]
    collect(
        tiny_lm(),
        TOK,
        problems,
        out,
        num_samples=4,
        max_new_tokens=10,
        delimiters=["Wait", "e"],
        checker="exact",
        prompt_template="plain",
        problems_per_shard=8,
        seed=1,
        progress=False,
    )
    return out


def collect_testbed(out, split: str, n: int):
    """The testbed LM on its own task (its splits), 8 samples per problem, streaming at ``Wait``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_msv.collect import collect
    from hf_msv.testbed import generate_problems

    model = AutoModelForCausalLM.from_pretrained(TESTBED_LM).eval()
    tokenizer = AutoTokenizer.from_pretrained(TESTBED_LM)
    collect(
        model,
        tokenizer,
        generate_problems(split, n, seed=0),
        out,
        num_samples=8,
        max_new_tokens=200,
        checker="symbolic",
        prompt_template="testbed",
        problems_per_shard=16,
        problems_per_batch=4,
        seed=1,
        progress=False,
    )
    return out


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    root = tmp_path_factory.mktemp("collected")
    return collect_tiny(root / "train", "train", 40), collect_tiny(root / "val", "validation", 16)


def synthetic_dirs(tmp_path, d=16):
    for split, count in (("train", 6), ("val", 3)):
        (tmp_path / split).mkdir()
        problems = [
            make_problem(f"{split}/{i}", num_sequences=4, seed=i + (100 if split == "val" else 0), d=d)
            for i in range(count)
        ]
        write_shard(
            tmp_path / split / "shard-r000-00000.safetensors",
            problems,
            info={
                "lm_name_or_path": "synthetic-lm",
                "lm_num_attention_heads": 4,
                "checker": "exact",
                "delimiters": ["Wait"],
                "num_samples": 4,
            },
        )
    return tmp_path / "train", tmp_path / "val"


# ----------------------------------------------------------------------------------------------------------------
# Recipe and models
# ----------------------------------------------------------------------------------------------------------------


def test_paper_recipe_preset_keeps_the_papers_numbers(tmp_path):
    """``recipe="paper"`` is the paper's literal recipe (the library default is ``recipe="auto"``)."""
    from hf_msv.training.config import default_learning_rate, resolve_plan

    config = MSVTrainingConfig(recipe="paper")
    plan = resolve_plan(config, 1536, steps_per_pass=10)
    assert (
        plan.learning_rate,
        config.mask_learning_rate,
        config.embedding_learning_rate,
        config.probe_learning_rate,
    ) == (5e-5, 1e-1, 1e-3, 1e-3)
    assert (plan.batch_size, config.max_grad_norm, config.warmup_ratio, config.architecture) == (64, 1.0, 0.0, {})
    assert MSVTrainingConfig(recipe="paper", mode="terminal").epochs == 1
    assert MSVTrainingConfig(recipe="paper", mode="streaming").epochs == 2
    assert plan.max_steps == 20 and plan.eval_steps == 10 and plan.early_stopping_patience == 0
    assert MSVTrainingConfig(kind="probe", num_sequences=16).group_size == 1
    info = {"lm_name_or_path": "some/lm", "lm_num_attention_heads": 4, "delimiters": ["Wait"]}
    msv = build_verifier(MSVTrainingConfig(num_sequences=16), 16, info)
    assert isinstance(msv, MSVVerifier)
    assert (msv.config.num_attention_heads, msv.config.num_hidden_layers, msv.config.num_sequences) == (4, 1, 16)
    assert msv.config.base_model_name_or_path == "some/lm" and msv.config.elicitation.delimiters == ("Wait",)
    groups = training._parameter_groups(msv, config, default_learning_rate(config, 16))
    # The auto recipe's vote pathway (single-chain head and its skip) trains at the Probe's rate.
    assert [g["lr"] for g in groups] == [5e-5, 1e-1, 1e-3, 1e-3]
    paper = build_verifier(config, 16, info)
    assert not paper.config.vote_pathway and not paper.config.gamma_skip
    assert [g["lr"] for g in training._parameter_groups(paper, config, 5e-5)] == [5e-5, 1e-1, 1e-3]
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in msv.parameters())
    with pytest.raises(ValueError, match="kind must be"):
        MSVTrainingConfig(kind="prm")
    with pytest.raises(ValueError, match="recipe"):
        MSVTrainingConfig(recipe="fast")
    with pytest.raises(ValueError, match="stop_statistic must be one of"):
        MSVTrainingConfig(stop_statistic="vote")


def test_auto_recipe_budgets_steps_and_scales_the_learning_rate_to_the_width():
    """The default recipe trains the same number of steps whatever the data size (within 300..2000), evaluates
    ~20 times, stops early, and scales the body learning rate as 1/sqrt(d)."""
    from hf_msv.training.config import resolve_plan

    config = MSVTrainingConfig(num_sequences=16, mode="terminal")
    small = resolve_plan(config, 128, steps_per_pass=6)  # 96 problems x 16 samples, N = 16, 16 groups a step
    large = resolve_plan(config, 128, steps_per_pass=500)
    assert small.max_steps == 300 and large.max_steps == 2000 and small.batch_size == 16
    assert small.early_stopping_patience == 5 and not small.by_epoch and 10 <= small.eval_steps <= 100
    assert resolve_plan(config, 1536, 6).learning_rate == pytest.approx(small.learning_rate * (128 / 1536) ** 0.5)
    assert small.gamma_learning_rate == 1e-2
    assert resolve_plan(MSVTrainingConfig(recipe="paper"), 128, 6).gamma_learning_rate is None
    assert resolve_plan(MSVTrainingConfig(num_sequences=64), 128, 6).batch_size == 4
    assert resolve_plan(MSVTrainingConfig(num_sequences=1), 128, 6).batch_size == 64
    # Explicit settings win; --num-epochs validates once per epoch and does not stop early.
    epochs = resolve_plan(MSVTrainingConfig(num_epochs=3, learning_rate=1e-4, batch_size=8), 128, 7)
    assert (
        epochs.max_steps,
        epochs.eval_steps,
        epochs.early_stopping_patience,
        epochs.learning_rate,
        epochs.batch_size,
    ) == (21, 7, 0, 1e-4, 8)


def test_probe_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    probe = ProbeVerifier(ProbeConfig(hidden_size=16, mode="terminal", base_model_name_or_path="x")).eval()
    assert probe.up.out_features == 1024
    hidden = torch.randn(7, 16)
    token_answer = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    out = probe(hidden, token_answer, labels=torch.tensor([1.0, 0.0, -1.0]))
    # The readout is the last token of each answer.
    direct = probe.head(probe.act(probe.up(hidden[[1, 4, 6]]))).squeeze(-1)
    torch.testing.assert_close(out.logits, direct)
    assert out.loss is not None and out.probabilities.shape == (3,)
    probe.save_pretrained(tmp_path)
    loaded = ProbeVerifier.from_pretrained(tmp_path).eval()
    assert loaded.config.mode == "terminal" and loaded.config.model_type == "msv_probe"
    torch.testing.assert_close(loaded(hidden, token_answer).logits, out.logits)


def test_cli_arguments_map_to_the_config():
    _, config = parse_train_args(
        [
            "--train-dir",
            "a",
            "--val-dir",
            "b",
            "--output-dir",
            "c",
            "--kind",
            "probe",
            "--num-sequences",
            "4",
            "--mode",
            "terminal",
            "--masks",
            "full",
            "equivalence",
            "--checker",
            "random",
            "--checker-kwargs",
            '{"seed": 3}',
            "--no-progress",
            "--num-epochs",
            "3",
            "--learning-rate",
            "1e-4",
        ]
    )
    assert (config.kind, config.num_sequences, config.mode, config.architecture, config.checker) == (
        "probe",
        4,
        "terminal",
        {"masks": ["full", "equivalence"]},
        "random",
    )
    assert config.checker_kwargs == {"seed": 3} and not config.progress and config.epochs == 3
    assert config.learning_rate == 1e-4 and config.mask_learning_rate == 1e-1
    assert config.max_train_problems is None
    _, config = parse_train_args(
        ["--train-dir", "a", "--val-dir", "b", "--output-dir", "c", "--max-train-problems", "56"]
    )
    assert config.max_train_problems == 56 and config.architecture == {}


def test_the_architecture_is_msvconfigs_and_its_flags_keep_their_names():
    """`MSVTrainingConfig.architecture` holds MSVConfig keyword arguments: every MSVConfig field the run does not set
    itself is a flag of its own (the architecture flags of ``hf-msv train`` keep their names), a flag wins over the
    same key of ``--architecture``, and the verifier is built with them."""
    from hf_msv.configuration_msv import MSVConfig
    from hf_msv.training.config import RUN_SET_FIELDS, architecture_fields

    assert set(architecture_fields()) | set(RUN_SET_FIELDS) == set(MSVConfig.__annotations__)
    _, config = parse_train_args(
        [
            "--train-dir",
            "a",
            "--val-dir",
            "b",
            "--output-dir",
            "c",
            "--num-hidden-layers",
            "2",
            "--num-attention-heads",
            "2",
            "--intermediate-size",
            "24",
            "--readout",
            "mean",
            "--logit-averaging",
            "true",
            "--gamma-hidden-size",
            "8",
            "--attention-backend",
            "dense",
            "--layer-norm-eps",
            "1e-6",
            "--architecture",
            '{"num_hidden_layers": 3, "vote_threshold": 5}',
            "--gamma-skip",
            "false",
        ]
    )
    assert config.architecture == {
        "num_hidden_layers": 2,
        "vote_threshold": 5,
        "num_attention_heads": 2,
        "intermediate_size": 24,
        "readout": "mean",
        "logit_averaging": True,
        "gamma_hidden_size": 8,
        "attention_backend": "dense",
        "layer_norm_eps": 1e-6,
    }
    built = build_verifier(config, 16, {"lm_num_attention_heads": 4}).config
    assert (
        built.num_hidden_layers,
        built.num_attention_heads,
        built.intermediate_size,
        built.readout,
        built.vote_threshold,
        built.layer_norm_eps,
        built.gamma_skip,
        built.vote_pathway,
    ) == (2, 2, 24, "mean", 5, 1e-6, False, False)
    for bad in ({"hidden_size": 8}, {"mode": "terminal"}, {"num_layers": 2}):
        with pytest.raises(ValueError, match="not MSVConfig fields a training run takes"):
            MSVTrainingConfig(architecture=bad)
    with pytest.raises(ValueError, match="architecture"):
        parse_train_args(["--train-dir", "a", "--val-dir", "b", "--output-dir", "c", "--architecture", "[2]"])


def test_the_recorded_settings_keep_their_flat_form():
    """``training_config.json``, reuse keys and resume states record the architecture beside the other settings,
    with the keys earlier versions of the package recorded always present: the records they wrote still match."""
    import dataclasses

    settings = MSVTrainingConfig(architecture={"masks": ["full"], "vote_threshold": 3}).to_dict()
    assert "architecture" not in settings and settings["masks"] == ["full"] and settings["vote_threshold"] == 3
    defaults = MSVTrainingConfig().to_dict()
    assert {
        k: defaults[k]
        for k in (
            "masks",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "readout",
            "logit_averaging",
            "gamma_hidden_size",
            "attention_backend",
        )
    } == {
        "masks": None,
        "num_hidden_layers": 1,
        "num_attention_heads": None,
        "intermediate_size": None,
        "readout": "last",
        "logit_averaging": None,
        "gamma_hidden_size": 64,
        "attention_backend": "chunked",
    }
    fields = {f.name for f in dataclasses.fields(MSVTrainingConfig)} - {"architecture"}
    assert set(defaults) == fields | {
        "masks",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "readout",
        "logit_averaging",
        "gamma_hidden_size",
        "attention_backend",
    }


def test_the_gamma_skip_default_is_decided_once():
    """Unset, the γ skip is on under the auto recipe and off under the paper's; the vote pathway and the anchored
    start follow it, and the verifier gets what `uses_gamma_skip` says."""
    info = {"lm_num_attention_heads": 4}
    for recipe, gamma_skip, expected in (
        ("auto", None, True),
        ("paper", None, False),
        ("paper", True, True),
        ("auto", False, False),
    ):
        config = MSVTrainingConfig(recipe=recipe, gamma_skip=gamma_skip, architecture={"intermediate_size": 16})
        assert config.uses_gamma_skip is expected and config.anchored is (expected or config.uses_vote_pathway)
        assert config.uses_vote_pathway is (recipe == "auto" and expected)
        assert build_verifier(config, 16, info).config.gamma_skip is expected
    assert not MSVTrainingConfig(kind="probe").uses_gamma_skip


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,mode,lr", [("msv", "streaming", 3e-3), ("probe", "terminal", 5e-5)])
def test_training_lowers_validation_bce(collected, tmp_path, kind, mode, lr):
    """Tiny random LM data (fast); the testbed LM's data is the slow test below."""
    train_dir, val_dir = collected
    config = MSVTrainingConfig(
        kind=kind, num_sequences=4, mode=mode, learning_rate=lr, batch_size=8, num_epochs=4, progress=False, seed=0
    )
    result = train_verifier(train_dir, val_dir, tmp_path / "out", config)
    before, best = result.history[0]["val_bce"], result.best_metrics["bce"]
    assert best < before - 0.02, result.history
    if kind == "msv":  # MSV attends to the digit token itself: it learns the label, not just the base rate
        assert result.best_metrics["auroc"] > 0.8, result.history
    assert result.best_metrics["answers"] == result.history[0]["val_answers"] > 0
    # The checkpoint on disk is the best one, with its model card, config and log.
    model = type(result.verifier).from_pretrained(tmp_path / "out")
    val = ShardDataset(val_dir, num_sequences=config.group_size, mode=mode, seed=0)
    assert abs(training.evaluate_verifier(model, val, mode)["bce"] - best) < 1e-6
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Training data" in card and "validation bce" in card
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert log["best_epoch"] == result.best_epoch and len(log["history"]) == 5
    assert json.loads((tmp_path / "out" / "training_config.json").read_text())["kind"] == kind


@pytest.mark.slow
@pytest.mark.skipif(TESTBED_LM is None, reason="no testbed LM checkpoint (hf_msv/testbed/lm-v2 or $HF_MSV_TESTBED_LM)")
def test_training_lowers_validation_bce_on_testbed_data(tmp_path):
    """Collect 128 training and 32 validation problems x 8 samples from the testbed LM (~1.5 min on 2 cores), then
    train MSV_4 (streaming) and the Probe (terminal): validation BCE drops, below the entropy of the base rate (what
    a constant predictor at best achieves), so they learned which answers are right, not just how many."""
    import math

    # 64 / 16 problems were too few for the current LM (accuracy near 0.5): MSV_4 stayed within 0.01 of the
    # base-rate entropy; with 128 / 32 it ends 0.09 below it (measured: BCE 0.607 vs 0.693, AUROC 0.73)
    train_dir = collect_testbed(tmp_path / "train", "train", 128)
    val_dir = collect_testbed(tmp_path / "val", "validation", 32)
    for kind, mode in (("msv", "streaming"), ("probe", "terminal")):
        # 128 problems x 8 samples make only 16 steps an epoch: train for 12 (best epoch kept)
        # gamma_skip=False: from a random start (the anchored default starts at the vote, see the tests below)
        config = MSVTrainingConfig(
            kind=kind,
            num_sequences=4,
            mode=mode,
            learning_rate=1e-3,
            batch_size=16,
            num_epochs=12,
            gamma_skip=False,
            progress=False,
        )
        result = train_verifier(train_dir, val_dir, tmp_path / kind, config)
        acc = result.history[0]["val_accuracy"]
        entropy = -(acc * math.log(acc) + (1 - acc) * math.log(1 - acc))
        best = result.best_metrics["bce"]
        assert best < result.history[0]["val_bce"] - 0.05 and best < entropy - 0.01, (entropy, result.history)
        assert result.best_metrics["auroc"] > 0.6, result.history


def test_best_checkpoint_is_kept_not_the_last(tmp_path, monkeypatch):
    train_dir, val_dir = synthetic_dirs(tmp_path)
    scripted = iter([0.70, 0.50, 0.60, 0.65])  # before training, then epochs 1..3: epoch 1 is best
    snapshots = []
    real = training.validation_predictions

    def fake(model, *args, **kwargs):
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return real(model, *args, **kwargs)

    monkeypatch.setattr(training, "validation_predictions", fake)
    monkeypatch.setattr(training, "prediction_metrics", lambda predictions: {"bce": next(scripted)})
    config = MSVTrainingConfig(
        num_sequences=2,
        mode="streaming",
        batch_size=4,
        num_epochs=3,
        learning_rate=1e-3,
        gamma_skip=False,
        progress=False,
    )
    result = train_verifier(train_dir, val_dir, tmp_path / "out", config)
    assert result.best_epoch == 1 and result.best_metrics["bce"] == 0.50
    saved = MSVVerifier.from_pretrained(tmp_path / "out").state_dict()
    assert all(torch.equal(saved[k], snapshots[1][k]) for k in saved)
    assert not all(torch.equal(saved[k], snapshots[3][k]) for k in saved)


def test_weak_checker_rederives_classes_for_training(tmp_path):
    train_dir, val_dir = synthetic_dirs(tmp_path)
    config = MSVTrainingConfig(
        num_sequences=4,
        mode="terminal",
        checker="random",
        checker_kwargs={"probability": 0.5, "seed": 0},
        batch_size=4,
        num_epochs=1,
        gamma_skip=False,
        progress=False,
    )  # one epoch, kept: the trained checkpoint is used
    result = train_verifier(train_dir, val_dir, tmp_path / "out", config)
    assert result.best_epoch == 1
    assert "re-derived with the `random` checker" in (tmp_path / "out" / "README.md").read_text()
    # The verifier sees the weak checker's classes; the labels stay the gold ones.
    strong = ShardDataset(train_dir, num_sequences=4, mode="terminal")
    weak = ShardDataset(
        train_dir, num_sequences=4, mode="terminal", checker="random", checker_kwargs={"probability": 0.5, "seed": 0}
    )
    a, b = (
        collate_groups([strong[i] for i in range(6)], "terminal"),
        collate_groups([weak[i] for i in range(6)], "terminal"),
    )
    assert torch.equal(a["labels"], b["labels"]) and not torch.equal(a["answer_class"], b["answer_class"])
    out = result.verifier(**{k: b[k] for k in VERIFIER_INPUTS})
    assert torch.isfinite(out.loss)


@pytest.mark.slow  # ~20-30 s: two interpreters start and import torch on a shared 2-core machine
def test_two_process_accelerate_training(tmp_path):
    """``accelerate launch`` with 2 CPU processes runs the CLI entry; the global batch is split over processes,
    validation covers every answer once, and the main process saves the checkpoint."""
    train_dir, val_dir = synthetic_dirs(tmp_path)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "2",
        "--multi_gpu",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "hf_msv.training",
        "--train-dir",
        str(train_dir),
        "--val-dir",
        str(val_dir),
        "--output-dir",
        str(tmp_path / "out"),
        "--num-sequences",
        "2",
        "--batch-size",
        "4",
        "--num-epochs",
        "2",
        "--learning-rate",
        "1e-3",
        "--no-progress",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1")
    # With the default cross-validated vote decision: every process runs the folds itself and reaches the same
    # length, so the prepared (synchronised) run that follows does not hang.
    done = subprocess.run(
        cmd[:-1] + ["--output-dir", str(tmp_path / "cv"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cv_log = json.loads((tmp_path / "cv" / "training_log.json").read_text())
    assert cv_log["vote_cv"]["folds"] == 4 and cv_log["steps"] == cv_log["vote_cv"]["step"]
    done = subprocess.run(cmd + ["--vote-folds", "0"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert len(log["history"]) == 3 and summary["best_epoch"] == log["best_epoch"]
    val = ShardDataset(val_dir, num_sequences=2)
    total = sum(len(val[i]["labels"]) for i in range(len(val)))
    assert log["history"][-1]["val_answers"] == total
    # 6 problems x 2 groups = 12 groups per epoch = 3 steps of 2 x 2 groups.
    assert log["history"][1]["step"] == 3 and log["history"][1]["train_groups"] == 12
    assert MSVVerifier.from_pretrained(tmp_path / "out").config.num_sequences == 2


def test_max_train_problems_and_resuming_a_finished_run(tmp_path):
    """`max_train_problems` trains on a prefix; `reproduce` resumes a finished run with the same reuse key and
    retrains when a setting really changed (code and data changes: tests/test_reuse.py)."""
    from hf_msv.reproduction import train_or_reuse as _train

    train_dir, val_dir = synthetic_dirs(tmp_path)
    config = MSVTrainingConfig(
        kind="probe", mode="terminal", max_steps=1, num_epochs=1, progress=False, max_train_problems=4
    )
    out = _train(train_dir, val_dir, tmp_path / "probe", config)
    log = json.loads((out / "training_log.json").read_text())
    assert "Training: 4 problems" in log["training_data"]
    full = MSVTrainingConfig(kind="probe", mode="terminal", max_steps=1, num_epochs=1, progress=False)
    out = _train(train_dir, val_dir, tmp_path / "probe", full)  # a changed setting: trained again
    assert "Training: 6 problems" in json.loads((out / "training_log.json").read_text())["training_data"]
    weights = out / "model.safetensors"
    before = weights.stat().st_mtime_ns
    _train(train_dir, val_dir, tmp_path / "probe", full)  # the same key: reused
    assert weights.stat().st_mtime_ns == before


# ----------------------------------------------------------------------------------------------------------------
# Defaults that train, the guard, and bad input
# ----------------------------------------------------------------------------------------------------------------


def signal_problem(pid: str, rng, num_sequences: int = 8, d: int = 16, strength: float = 0.6, hidden=True):
    """One terminal answer per sequence from 3 candidate answers; the correct one is the plurality only about half
    of the time (γ is a weak signal), and each answer's tokens carry a noisy ±`strength` mark on dimension 0 (+ for
    the correct answer): one sequence's mark is unreliable, the marks of a class's members pooled across sequences
    are not — a cross-sequence signal the MSV can read (equivalence mask, logit averaging) and γ cannot."""
    from hf_msv.data import CollectedProblem

    texts = ["a", "b", "c"]
    correct = texts[int(rng.integers(0, 3))]
    weights = rng.dirichlet([1.0, 1.0, 1.0])
    answers = [texts[int(rng.choice(3, p=weights))] for _ in range(num_sequences)]
    lengths = rng.integers(2, 4, size=num_sequences)
    t = int(lengths.sum())
    states = rng.normal(size=(t, d)).astype(np.float32)
    token_answer = np.repeat(np.arange(num_sequences), lengths)
    marks = np.array([strength if a == correct else -strength for a in answers], dtype=np.float32)
    states[:, 0] += marks[token_answer] * 2
    classes = {a: i for i, a in enumerate(dict.fromkeys(answers))}
    taus = np.sort(rng.choice(np.arange(10, 200), size=num_sequences, replace=False))
    return CollectedProblem(
        problem_id=pid,
        gold=correct,
        source="synthetic",
        hidden_states=torch.from_numpy(states),
        token_ids=np.zeros(t, dtype=np.int64),
        token_logprobs=np.zeros(t, dtype=np.float32),
        answer_text=answers,
        answer_raw_text=answers,
        answer_trigger=["eos"] * num_sequences,
        answer_sequence=np.arange(num_sequences),
        answer_step=np.zeros(num_sequences),
        answer_tau=taus,
        answer_length=lengths,
        answer_class=[classes[a] for a in answers],
        answer_terminal=np.ones(num_sequences, bool),
        answer_correct=[a == correct for a in answers],
        sequence_length=taus + 1,
        sequence_finish=["eos"] * num_sequences,
    )


def signal_dirs(root, sizes=(("train", 64), ("val", 24)), lm="synthetic-lm", d=16, seed=0, **kwargs):
    rng = np.random.default_rng(seed)
    dirs = []
    for split, count in sizes:
        (root / split).mkdir(parents=True, exist_ok=True)
        write_shard(
            root / split / "shard-r000-00000.safetensors",
            [signal_problem(f"{split}/{i}", rng, d=d, **kwargs) for i in range(count)],
            info={"lm_name_or_path": lm, "lm_num_attention_heads": 4, "checker": "exact", "num_samples": 8},
        )
        dirs.append(root / split)
    return dirs


def test_defaults_train_a_verifier_that_beats_the_vote(tmp_path):
    """Defaults only (auto recipe) on 64 small synthetic problems: the MSV beats calibrated γ (self-consistency)
    and the guard says so in the log, the card and the result."""
    train_dir, val_dir = signal_dirs(tmp_path)
    result = train_verifier(
        train_dir, val_dir, tmp_path / "out", MSVTrainingConfig(num_sequences=8, mode="terminal", progress=False)
    )
    guard = result.guard
    assert guard.passed and guard.warning is None, guard
    assert guard.verifier["brier"] < guard.self_consistency["brier"] - 0.02, guard
    assert guard.verifier["auroc"] > guard.self_consistency["auroc"] + 0.03, guard
    # Cross-validation over the training problems chose to leave the vote, and for how long; the run trained that
    # long on all problems and kept its last checkpoint.
    decision = result.vote_cv
    assert decision.folds == 4 and decision.step > 0 and decision.gain > decision.se, decision
    assert guard.linear_probe is not None and result.best_step == result.plan.max_steps == decision.step
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert log["guard"]["passed"] and log["vote_cv"]["step"] == decision.step
    assert len(log["history"]) >= 2 and log["history"][-1]["step"] == log["steps"] == decision.step
    card = (tmp_path / "out" / "README.md").read_text()
    assert "calibrated self-consistency" in card and "linear probe" in card


def test_guard_warns_and_strict_fails_when_the_verifier_is_worse_than_the_vote(tmp_path, caplog, capsys):
    """A verifier that cannot have learned (1 step at a tiny learning rate) on data where γ is informative: one
    warning line naming the best baseline of the table (calibrated vote, Probe+WV, stacked) and both Briers, and
    telling the user to use it; ``--strict`` exits 1; without it the command exits normally."""
    from hf_msv.training import main

    train_dir, val_dir = signal_dirs(tmp_path, sizes=(("train", 16), ("val", 48)), strength=0.0)
    argv = [
        "--train-dir",
        str(train_dir),
        "--val-dir",
        str(val_dir),
        "--output-dir",
        str(tmp_path / "out"),
        "--num-sequences",
        "8",
        "--mode",
        "terminal",
        "--max-steps",
        "1",
        "--learning-rate",
        "1e-9",
        "--mask-learning-rate",
        "0",
        "--embedding-learning-rate",
        "0",
        "--gamma-skip",
        "false",
        "--no-progress",
    ]
    with caplog.at_level("WARNING", logger="hf_msv.training.trainer"):
        result = main(argv)
    assert not result.guard.passed
    guard = result.guard
    assert set(guard.rows()) >= {"MSV_8", "calibrated self-consistency", "Probe+WV", "stacked [vote, Probe]"}
    best = guard.rows()[guard.best]
    assert best["brier"] == min(r["brier"] for name, r in guard.rows().items() if name != "MSV_8")
    warnings = [r.getMessage() for r in caplog.records if f"is worse than {guard.best}" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0] and f"use {guard.best}" in warnings[0]
    assert f"{guard.verifier['brier']:.4f} > {best['brier']:.4f}" in warnings[0]
    assert "too little data" in warnings[0] and "too few steps" in warnings[0]
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == guard.warning and json.loads(lines[-1])["guard_passed"] is False
    with pytest.raises(SystemExit) as exit_:
        main(argv + ["--strict"])
    assert exit_.value.code == 1


def test_bad_input_fails_before_training(tmp_path, monkeypatch):
    """Different LMs / widths, an empty validation set, N above the samples collected, an unknown checker: each a
    clear error before the first optimizer step."""
    monkeypatch.setattr(training, "_TrainingRun", None)  # training would raise TypeError, not the errors below
    train_dir, val_dir = signal_dirs(tmp_path / "a")
    (other_lm,) = signal_dirs(tmp_path / "b", sizes=(("val", 4),), lm="another-lm")
    (wider,) = signal_dirs(tmp_path / "c", sizes=(("val", 4),), d=32)
    config = MSVTrainingConfig(num_sequences=8, mode="terminal", progress=False)
    for val in (other_lm, wider):
        with pytest.raises(ValueError, match="different LMs or widths"):
            train_verifier(train_dir, val, tmp_path / "out", config)
    with pytest.raises(ValueError, match="different LMs or widths"):  # mixed shards inside one split
        train_verifier([train_dir, other_lm], val_dir, tmp_path / "out", config)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="validation data"):
        train_verifier(train_dir, tmp_path / "empty", tmp_path / "out", config)
    with pytest.raises(ValueError, match="num_sequences=16 but some problems have only 8"):
        train_verifier(train_dir, val_dir, tmp_path / "out", MSVTrainingConfig(num_sequences=16, progress=False))
    with pytest.raises(ValueError, match="unknown equivalence checker 'nope'"):
        train_verifier(train_dir, val_dir, tmp_path / "out", MSVTrainingConfig(num_sequences=8, checker="nope"))
    assert not (tmp_path / "out").exists()


def test_cli_main_parses_into_the_dataclasses():
    from hf_msv.training import TrainArguments

    args, config = parse_train_args(
        [
            "--train-dir",
            "a",
            "--val-dir",
            "b",
            "--output-dir",
            "c",
            "--recipe",
            "paper",
            "--strict",
            "--lr-sweep",
            "--lr-sweep-values",
            "1e-4",
            "3e-4",
            "--checker",
            "jaccard",
            "--checker-kwargs",
            '{"threshold": 0.8}',
        ]
    )
    assert isinstance(args, TrainArguments) and args.strict and args.lr_sweep and args.lr_sweep_values == [1e-4, 3e-4]
    assert config.recipe == "paper" and config.checker_kwargs == {"threshold": 0.8} and config.epochs == 2
    for f in __import__("dataclasses").fields(MSVTrainingConfig):
        assert f.metadata.get("help"), f.name


def test_lr_sweep_keeps_the_best_validation_brier(tmp_path, capsys):
    from hf_msv.training import sweep_learning_rates

    train_dir, val_dir = signal_dirs(tmp_path, sizes=(("train", 16), ("val", 8)))
    result = sweep_learning_rates(
        train_dir,
        val_dir,
        tmp_path / "out",
        MSVTrainingConfig(num_sequences=8, mode="terminal", max_steps=4, eval_steps=2, progress=False),
        learning_rates=[1e-9, 3e-3],
    )
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    rows = log["lr_sweep"]
    assert [r["learning_rate"] for r in rows] == [1e-9, 3e-3]
    assert log["chosen_learning_rate"] == min(rows, key=lambda r: r["val_brier"])["learning_rate"]
    assert result.output_dir == str(tmp_path / "out") and (tmp_path / "out" / "model.safetensors").exists()
    assert "[lr-sweep 2/2]" in capsys.readouterr().out


def test_anchored_training_starts_at_calibrated_vote_and_may_keep_step_0(tmp_path, monkeypatch):
    """`gamma_skip=True`: the step-0 verifier is Platt(γ) fitted on the training answers (validated as history[0])
    and, when no later validation beats its BCE, it is the checkpoint kept (best_step 0), not "nothing saved"."""
    from hf_msv.baselines import platt
    from hf_msv.training.guard import training_vote_platt

    train_dir, val_dir = signal_dirs(tmp_path)
    scripted = iter([0.40, 0.50, 0.60])  # step 0, then two evaluations: step 0 stays best
    real = training.prediction_metrics
    monkeypatch.setattr(training, "prediction_metrics", lambda p: dict(real(p), bce=next(scripted)))
    config = MSVTrainingConfig(
        num_sequences=8,
        mode="terminal",
        gamma_skip=True,
        vote_pathway=False,
        max_steps=4,
        eval_steps=2,
        vote_folds=0,
        progress=False,
    )  # validation chooses (CV: its own test)
    result = train_verifier(train_dir, val_dir, tmp_path / "out", config)
    assert result.best_step == 0 and result.best_epoch == 0 and result.verifier is not None
    assert result.verifier.config.gamma_skip and result.best_metrics["bce"] == 0.40
    a, b = training_vote_platt(ShardDataset(train_dir, num_sequences=8, mode="terminal"), "terminal", config.seed)
    val = ShardDataset(val_dir, num_sequences=8, mode="terminal")
    batch = collate_groups([val[i] for i in range(len(val))], "terminal")
    with torch.no_grad():
        p = result.verifier(**{k: batch[k] for k in VERIFIER_INPUTS}).probabilities.double().numpy()
    np.testing.assert_allclose(p, platt(batch["gamma"].double().numpy(), a, b), atol=1e-5)
    assert MSVTrainingConfig().anchored and not MSVTrainingConfig(recipe="paper").anchored
    assert not MSVTrainingConfig(kind="probe", gamma_skip=True).anchored


def test_the_default_starts_at_calibrated_probe_wv(tmp_path, monkeypatch):
    """Defaults: the verifier has the vote pathway, its single-chain head trained on the training chains, and the
    step-0 verifier is exactly σ(a·share + b), `share` the weighted vote of that head's probabilities over each
    answer's class (the evaluation's Probe+WV rule) and (a, b) the out-of-fold Platt fit in ``training_log.json``."""
    from hf_msv.baselines import platt, weighted_voting

    train_dir, val_dir = signal_dirs(tmp_path)
    scripted = iter([0.40, 0.50, 0.60])  # step 0, then two evaluations: step 0 stays best
    real = training.prediction_metrics
    monkeypatch.setattr(training, "prediction_metrics", lambda p: dict(real(p), bce=next(scripted)))
    config = MSVTrainingConfig(
        num_sequences=8, mode="terminal", max_steps=4, eval_steps=2, vote_folds=0, progress=False
    )
    result = train_verifier(train_dir, val_dir, tmp_path / "out", config)
    model = result.verifier
    assert config.uses_vote_pathway and model.config.vote_pathway and result.best_step == 0
    anchor = json.loads((tmp_path / "out" / "training_log.json").read_text())["vote_anchor"]
    assert anchor["epochs"] >= 1 and anchor["held_out_answers"] == anchor["answers"] > 0
    val = ShardDataset(val_dir, num_sequences=8, mode="terminal")
    for i in range(len(val)):
        batch = collate_groups([val[i]], "terminal")
        with torch.no_grad():
            out = model(**{k: batch[k] for k in VERIFIER_INPUTS})
        share = weighted_voting(torch.sigmoid(out.vote_logits).double().numpy(), batch["answer_class"].numpy())
        np.testing.assert_allclose(out.probabilities.double().numpy(), platt(share, *anchor["platt"]), atol=1e-5)
    assert anchor["platt"][0] > 0  # a larger share means more likely right
    assert not MSVTrainingConfig(recipe="paper").uses_vote_pathway
    assert not MSVTrainingConfig(gamma_skip=False).uses_vote_pathway
    assert not MSVTrainingConfig(kind="probe").uses_vote_pathway


def test_a_streaming_verifier_that_never_stops_early_warns(tmp_path, caplog):
    """A streaming MSV's stopping rule is fitted on validation and saved with it: the stop head (fitted on half the
    problems) and the λ (chosen on the other half) in its config (what `generate` and `MSVEarlyStop.from_verifier`
    read), the curves, the split and both λ rules in ``training_log.json``. A calibration split too small to
    certify ε saves λ = ∞ (full decoding) whatever the target rule would stop at: a line says so before training,
    the warning after it, the log and the card say how many problems ε needs; ``lambda_rule="target"`` keeps the
    target λ for a user who asks for it."""
    from types import SimpleNamespace

    from hf_msv import MSVEarlyStop
    from hf_msv.training.stopping_curve import fit_early_stopping

    # 32 problems of two chains: chain 0 answers wrong early (ends 5, 20), chain 1 right at the end (50), scored
    # higher. Any λ that stops before the end stops at a wrong early answer; only full decoding is right.
    def predictions(logits, labels, problems=32):
        structure = {
            k: np.tile(v, problems)
            for k, v in {
                "end": [5, 20, 50],
                "klass": [0, 0, 1],
                "sequence": [0, 0, 1],
                "step": [0, 1, 0],
                "terminal": [False, True, True],
            }.items()
        }
        structure["group"] = np.repeat(np.arange(problems), 3)
        return SimpleNamespace(
            logits=np.tile(logits, problems),
            labels=np.tile(labels, problems),
            problems=np.repeat([f"p{i}" for i in range(problems)], 3).astype(object),
            structure=structure,
        )

    never = fit_early_stopping(predictions([2.0, 2.0, 3.0], [0.0, 0.0, 1.0]), num_chains=2, lambda_rule="target")
    assert not never.choice.reached and np.isinf(never.choice.lam) and never.choice.full_accuracy == 1.0
    assert not never.guarantee.reached and never.guarantee.problems_needed == 114
    # The early answers right: the target rule stops at the first one, right, with 10 of 70 tokens; 16 calibration
    # problems certify nothing, so by default the verifier decodes in full.
    data = predictions([2.0, 2.0, -1.0], [1.0, 1.0, 0.0])
    stops = fit_early_stopping(data, num_chains=2, lambda_rule="target")
    assert stops.choice.reached and stops.choice.accuracy == 1.0
    assert (stops.choice.tokens, stops.choice.full_tokens) == (10, 70)
    default = fit_early_stopping(data, num_chains=2)
    assert default.target.reached and not default.guarantee.reached and np.isinf(default.choice.lam)
    assert default.choice is default.guarantee and default.config_entry()["lambda"]["lam"] is None
    head, calibration = set(default.split.head), set(default.split.calibration)
    assert len(head) == len(calibration) == 16 and not head & calibration  # λ is tested on other problems
    # ... and on 128 calibration problems, where every early stop is right, ε = 2 pp is certified.
    certified = fit_early_stopping(predictions([2.0, 2.0, -1.0], [1.0, 1.0, 0.0], problems=256), num_chains=2)
    assert certified.choice.rule == "guarantee" and certified.choice.reached and certified.choice.num_problems == 128

    train_dir, val_dir = signal_dirs(tmp_path)
    with caplog.at_level("WARNING", logger="hf_msv.training.trainer"):
        result = train_verifier(
            train_dir,
            val_dir,
            tmp_path / "out",
            MSVTrainingConfig(num_sequences=8, max_steps=4, eval_steps=2, progress=False),
        )
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())["early_stopping"]
    curve = log["curve"]
    from hf_msv.lambda_rule import LAMBDAS

    assert len(curve["lambdas"]) == len(curve["accuracy"]) == len(curve["tokens"]) == LAMBDAS.size  # the one grid
    assert curve["lambdas"][-1] is None and log["lambda"]["full_tokens"] == curve["tokens"][-1]
    assert set(log["at_stop"]) == {"stopped", "accuracy", "confidence", "ece"} and "raw_score" in log
    penalty = log["stop_head_penalty"]  # cross-validated over the validation problems, recorded with its evidence
    assert penalty["folds"] == 4 and len(penalty["losses"]) == len(penalty["penalties"])
    assert penalty["penalty"] in penalty["penalties"]
    warned = [r.getMessage() for r in caplog.records if "does not stop early" in r.getMessage()]
    assert bool(warned) == (not log["lambda"]["reached"])
    # 24 validation problems: 12 calibrate λ, too few for ε = 2 pp: said before training, and λ = ∞ is saved.
    before = [r.getMessage() for r in caplog.records if "calibration problems cannot certify" in r.getMessage()]
    assert before == [
        "early stopping: 12 calibration problems cannot certify ε = 0.02 at δ = 0.1 (needs ≥ 114); "
        "the verifier will decode in full by default (λ = ∞): collect more validation problems or "
        "pass --stop-calibration-dir (best-of-N needs no λ)"
    ]
    assert log["lambda"]["lam"] is None and log["lambda"]["rule"] == "guarantee" and not log["guarantee"]["reached"]
    assert log["split"]["head_problems"] == log["split"]["calibration_problems"] == 12
    assert not set(log["split"]["head_problem_ids"]) & set(log["split"]["calibration_problem_ids"])
    card = (tmp_path / "out" / "README.md").read_text()
    assert "ε = 0.02, δ = 0.1, on 12 calibration problems" in card and "ε needs ≥ 114" in card
    assert "certified: no (full decoding by default)" in card and "ε = –" not in card
    saved = MSVVerifier.from_pretrained(tmp_path / "out")
    assert saved.config.early_stopping == result.verifier.config.early_stopping
    assert saved.config.early_stopping["lambda"] == log["lambda"]
    criterion = MSVEarlyStop.from_verifier(saved)
    assert criterion.choice.to_dict() == log["lambda"] and criterion.threshold is None  # never stops


def test_training_certifies_pruning_jointly_on_the_calibration_problems(tmp_path):
    """``hf-msv train`` certifies a pruning rule with its λ on the problems λ is certified on (not the stop head's)
    and saves the pair as the verifier's default: the config (what `MSVEarlyStop.from_verifier` reads), the card
    and the summary line say it; ``stop_pruning="off"`` saves the stop alone. Chains that settle at once (answers
    repeating every 25 tokens) make pruning free, so at ε = 0.3 the 24 calibration problems certify it."""
    from helpers.shards import steady_problem
    from hf_msv import MSVEarlyStop
    from hf_msv.training.pruned_replay import PRUNE_CANDIDATES

    rng = np.random.default_rng(0)
    for split, count in (("train", 32), ("val", 48)):
        (tmp_path / split).mkdir()
        write_shard(
            tmp_path / split / "shard-r000-00000.safetensors",
            [steady_problem(f"{split}/{i}", rng) for i in range(count)],
            info={"lm_name_or_path": "synthetic-lm", "lm_num_attention_heads": 4, "checker": "exact"},
        )
    common = dict(num_sequences=8, mode="streaming", max_steps=2, eval_steps=2, progress=False, stop_epsilon=0.3)
    result = train_verifier(tmp_path / "train", tmp_path / "val", tmp_path / "out", MSVTrainingConfig(**common))
    stopping = result.verifier.config.early_stopping
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())["early_stopping"]
    pair = stopping["pruning"]
    rule = PruneRule.from_dict(pair["rule"])
    assert rule in PRUNE_CANDIDATES and not rule.off
    assert pair["lambda"]["num_problems"] == log["split"]["calibration_problems"] == 24 and pair["lambda"]["reached"]
    assert pair["joint"]["choice"]["num_problems"] == 24 and "net loss" in pair["joint"]["procedure"]
    saved = MSVVerifier.from_pretrained(tmp_path / "out")
    criterion = MSVEarlyStop.from_verifier(saved)
    assert criterion.prune == rule and criterion.threshold == pair["lambda"]["lam"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"Default with pruning: {rule.describe()}" in card and "on 24 calibration problems" in card
    assert any(line.startswith("pruning, certified jointly") for line in result.guard.summary_lines())
    # Re-fitting the stop alone replaces the config's early stopping whole: the pair and its card line go.
    from hf_msv.reproduction import fit_shipped_stopping

    fit_shipped_stopping(tmp_path / "val", tmp_path / "out", epsilon=0.3)
    refit = MSVVerifier.from_pretrained(tmp_path / "out").config.early_stopping
    card = (tmp_path / "out" / "README.md").read_text()
    assert "pruning" not in refit and "Default with pruning" not in card and "- Early stopping (" in card
    off = train_verifier(
        tmp_path / "train", tmp_path / "val", tmp_path / "off", MSVTrainingConfig(**common, stop_pruning="off")
    )
    assert "pruning" not in off.verifier.config.early_stopping and off.verifier.config.early_stopping["lambda"]
    with pytest.raises(UserError, match="stop_pruning"):
        MSVTrainingConfig(stop_pruning="sometimes")


def test_the_vote_anchor_is_kept_when_no_trained_checkpoint_beats_it(tmp_path, caplog, capsys):
    """Anchored at calibrated voting (``--vote-pathway false``) on data whose hidden states carry nothing: no trained
    verifier beats the step-0 vote by a standard error in cross-validation over the training problems, so the vote
    itself is
    kept without training (its probabilities are Platt(γ) fitted on the training answers), the warning line says so
    with the numbers, ``--strict`` exits 1."""
    from hf_msv.baselines import platt
    from hf_msv.training import main

    train_dir, val_dir = signal_dirs(tmp_path, sizes=(("train", 24), ("val", 16)), strength=0.0)
    argv = [
        "--train-dir",
        str(train_dir),
        "--val-dir",
        str(val_dir),
        "--output-dir",
        str(tmp_path / "out"),
        "--num-sequences",
        "8",
        "--mode",
        "terminal",
        "--max-steps",
        "60",
        "--vote-pathway",
        "false",
        "--no-progress",
    ]
    with caplog.at_level("WARNING", logger="hf_msv.training.trainer"):
        result = main(argv)
    assert result.best_step == 0 and not result.guard.passed and result.vote_cv.step == 0, result.vote_cv
    curve = result.vote_cv.curve
    assert len(curve) >= 2 and all(e["gain"] <= e["se"] for e in curve[1:]), curve
    assert [h["step"] for h in result.history] == [0]  # nothing to train: the vote is the verifier
    warnings = [r.getMessage() for r in caplog.records if "kept its starting point" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "1 standard error" in warnings[0], warnings
    assert "4-fold cross-validation of the training problems" in warnings[0]
    assert capsys.readouterr().out.strip().splitlines()[-2] == result.guard.warning
    platt_ab = json.loads((tmp_path / "out" / "config.json").read_text())
    val = ShardDataset(val_dir, num_sequences=8, mode="terminal")
    batch = collate_groups([val[i] for i in range(len(val))], "terminal")
    with torch.no_grad():
        p = result.verifier(**{k: batch[k] for k in VERIFIER_INPUTS}).probabilities.double().numpy()
    a, b = float(result.verifier.gamma_skip_weight.detach()), float(result.verifier.gamma_skip_bias.detach())
    np.testing.assert_allclose(p, platt(batch["gamma"].double().numpy(), a, b), atol=1e-5)
    assert platt_ab["gamma_skip"] is True
    assert "kept the calibrated vote" in (tmp_path / "out" / "README.md").read_text()
    kept = json.loads((tmp_path / "out" / "training_log.json").read_text())["guard"]["extra"]["kept_vote"]
    assert kept["folds"] == 4 and kept["steps"] == curve[-1]["step"] > 0
    with pytest.raises(SystemExit) as exit_:
        main(argv + ["--strict"])
    assert exit_.value.code == 1


def test_bce_gain_standard_error_is_clustered_by_problem():
    """Equal-size problems: the gain is the mean of per-problem mean differences and its error their standard
    deviation over sqrt(P) (ddof 1); answers of one problem do not count as independent evidence."""
    from hf_msv.training.guard import ValidationPredictions, bce_gain

    rng = np.random.default_rng(0)
    problems = np.repeat(np.array([f"p{i}" for i in range(6)], dtype=object), 5)
    y = rng.integers(0, 2, size=30).astype(float)
    z_ref, z_new = rng.normal(size=30), rng.normal(size=30)
    pred = lambda z: ValidationPredictions(logits=z, labels=y, gamma=np.zeros(30), problems=problems)
    gain, se = bce_gain(pred(z_ref), pred(z_new))
    loss = lambda z: np.logaddexp(0, z) - y * z
    per_problem = (loss(z_ref) - loss(z_new)).reshape(6, 5).mean(axis=1)
    assert gain == pytest.approx(per_problem.mean())
    assert se == pytest.approx(per_problem.std(ddof=1) / np.sqrt(6))
    assert bce_gain(pred(z_ref), pred(z_ref)) == (0.0, 0.0)
    single = ValidationPredictions(logits=z_ref, labels=y, gamma=np.zeros(30), problems=np.full(30, "p", object))
    assert bce_gain(single, single)[1] == float("inf")


def test_guard_calibrates_the_vote_out_of_sample():
    """With problem ids, calibrated self-consistency is cross-fitted: each half of the problems is scored by the
    Platt fit on the other half (never in sample), and ``platt`` is the fit on all answers."""
    from hf_msv.baselines import fit_platt, platt
    from hf_msv.training.guard import calibrated_self_consistency

    rng = np.random.default_rng(1)
    problems = np.repeat(np.array(["b", "a", "d", "c"], dtype=object), 25)  # fold by first appearance: b, d | a, c
    gamma = rng.uniform(size=100)
    y = (rng.uniform(size=100) < gamma).astype(float)
    p_in, fit = calibrated_self_consistency(gamma, y)
    p_out, fit_out = calibrated_self_consistency(gamma, y, problems)
    assert fit["platt"] == fit_out["platt"] and np.allclose(p_in, platt(gamma, *fit_platt(gamma, y)))
    assert fit_out["brier"] > fit["brier"]  # in-sample is optimistic
    first = np.isin(problems, ["b", "d"])
    np.testing.assert_allclose(p_out[first], platt(gamma[first], *fit_platt(gamma[~first], y[~first])))
    np.testing.assert_allclose(p_out[~first], platt(gamma[~first], *fit_platt(gamma[first], y[first])))


def test_cross_validation_pools_every_training_problem_once_and_fixes_the_length(tmp_path, monkeypatch):
    """`cross_validate_vote`: the held-out folds pooled at every evaluation cover each training problem exactly once
    (never in the fold it trained on), and the chosen length is what the final run trains, keeping its last
    checkpoint even where an earlier validation BCE was lower."""
    from hf_msv.training import guard

    train_dir, val_dir = signal_dirs(tmp_path)
    seen = {}
    real_choose = training.choose_vote_departure

    def choose(steps, predictions, margin_se, folds):
        seen["problems"], seen["steps"] = [p.problems for p in predictions], steps
        return guard.VoteDecision(
            folds, steps[2], 0.1, 0.01, margin_se, real_choose(steps, predictions, margin_se, folds).curve
        )

    monkeypatch.setattr(training, "choose_vote_departure", choose)
    config = MSVTrainingConfig(
        num_sequences=8, mode="terminal", max_steps=6, eval_steps=2, vote_folds=3, progress=False
    )
    result = train_verifier(train_dir, val_dir, tmp_path / "out", config)
    train = ShardDataset(train_dir, num_sequences=8, mode="terminal")
    for problems in seen["problems"]:  # terminal: 8 answers per problem, every problem once
        ids, counts = np.unique(problems, return_counts=True)
        assert sorted(ids) == sorted(train.problem_ids) and set(counts) == {8}
    assert seen["steps"] == [0, 2, 4, 6] and result.vote_cv.step == 4
    assert result.best_step == 4 == result.history[-1]["step"] and result.plan.max_steps == 4
    assert result.plan.early_stopping_patience == 0


def test_choose_vote_departure_needs_a_significant_pooled_gain():
    """The step with the largest pooled gain over step 0 is chosen only if the gain beats the margin in standard
    errors (clustered by problem); otherwise the vote (step 0), with the best gain reported."""
    from hf_msv.training.guard import ValidationPredictions, choose_vote_departure

    rng = np.random.default_rng(0)
    problems = np.repeat(np.array([f"p{i}" for i in range(40)], dtype=object), 4)
    y = rng.integers(0, 2, size=160).astype(float)
    sign = 2 * y - 1
    pred = lambda z: ValidationPredictions(logits=z, labels=y, gamma=np.zeros(160), problems=problems)
    vote = pred(np.zeros(160))
    better, best = pred(0.5 * sign + rng.normal(0, 0.1, 160)), pred(1.0 * sign + rng.normal(0, 0.1, 160))
    worse = pred(-0.5 * sign)
    decision = choose_vote_departure([0, 10, 20, 30], [vote, better, best, worse], 1.0, 4)
    assert decision.step == 20 and decision.gain > decision.se > 0 and len(decision.curve) == 4
    assert choose_vote_departure([0, 10, 20], [vote, better, best], 1e9, 4).step == 0
    noise = choose_vote_departure([0, 10], [vote, worse], 0.0, 4)
    assert noise.step == 0 and noise.gain < 0 and noise.to_dict()["curve"][1]["gain"] == noise.gain
    assert choose_vote_departure([0], [vote], 1.0, 4).step == 0


# ----------------------------------------------------------------------------------------------------------------
# Resuming an interrupted fit (hf_msv.training.checkpoint)
# ----------------------------------------------------------------------------------------------------------------


class _Interrupted(Exception):
    pass


def _fit_counting_steps(monkeypatch, train_dir, val_dir, out, config, stop_at=None, resume=False):
    """`train_verifier` with its optimizer steps counted (every fold's and the final run's); raises `_Interrupted`
    at step `stop_at` (1-based), as a fit killed there."""
    real, calls = training._optimizer_step, []

    def step(*args, **kwargs):
        calls.append(1)
        if stop_at is not None and len(calls) == stop_at:
            raise _Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "_optimizer_step", step)
    try:
        return train_verifier(train_dir, val_dir, out, config, resume=resume), len(calls)
    finally:
        monkeypatch.setattr(training, "_optimizer_step", real)


def _resume_config(**kwargs):
    return MSVTrainingConfig(
        **{
            "num_sequences": 8,
            "mode": "streaming",
            "max_steps": 8,
            "eval_steps": 2,
            "vote_folds": 3,
            "vote_margin_se": 0.0,
            "vote_pathway": False,
            "progress": False,
            **kwargs,
        }
    )


def test_an_interrupted_fit_resumes_to_the_uninterrupted_verifier(tmp_path, monkeypatch):
    """A fit killed in the middle of its vote cross-validation, resumed with ``resume=True``, trains the same
    batches from the last pooled evaluation on and ends with the same decision, history and weights as the fit
    that was never interrupted; the saved state goes when the fit ends, and without ``resume`` one left behind is
    discarded (a fresh fit)."""
    from safetensors.torch import load_file

    from hf_msv.training.checkpoint import STATE_FILE

    train_dir, val_dir = signal_dirs(tmp_path)
    config = _resume_config()
    whole, total = _fit_counting_steps(monkeypatch, train_dir, val_dir, tmp_path / "whole", config)
    assert not (tmp_path / "whole" / STATE_FILE).exists()
    cv_steps = 3 * whole.vote_cv.curve[-1]["step"]  # three folds in lockstep, then the final run
    assert cv_steps >= 12 and total == cv_steps + whole.plan.max_steps

    out = tmp_path / "resumed"
    with pytest.raises(_Interrupted):  # the third fold's first step of the third chunk (states saved at 2 and 4)
        _fit_counting_steps(monkeypatch, train_dir, val_dir, out, config, stop_at=2 * 3 + 2 * 3 + 2 * 2 + 1)
    assert torch.load(out / STATE_FILE, weights_only=False)["step"] == 4
    resumed, rest = _fit_counting_steps(monkeypatch, train_dir, val_dir, out, config, resume=True)
    assert rest == total - 3 * 4  # the 12 steps before the saved state are not trained again
    assert resumed.vote_cv == whole.vote_cv and resumed.best_step == whole.best_step
    strip = lambda h: [{k: v for k, v in e.items() if not k.startswith("train_")} for e in h]
    assert strip(resumed.history) == strip(whole.history)
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (out / STATE_FILE).exists()

    # Killed in the final run: the decision was saved, so resuming trains only the final run.
    out = tmp_path / "after-cv"
    with pytest.raises(_Interrupted):
        _fit_counting_steps(monkeypatch, train_dir, val_dir, out, config, stop_at=cv_steps + 1)
    resumed, rest = _fit_counting_steps(monkeypatch, train_dir, val_dir, out, config, resume=True)
    assert rest == whole.plan.max_steps and resumed.vote_cv == whole.vote_cv
    b = load_file(out / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)

    # Without resume a state left behind is discarded: a fit from the start.
    with pytest.raises(_Interrupted):
        _fit_counting_steps(monkeypatch, train_dir, val_dir, out, config, stop_at=7)
    _, again = _fit_counting_steps(monkeypatch, train_dir, val_dir, out, config)
    assert again == total


def test_resuming_a_state_saved_with_other_settings_fails_and_keeps_it(tmp_path, monkeypatch):
    """A saved state is resumed only by a fit with the same settings and training problems: otherwise a clear error
    naming what differs, before any training, and the state is still there for the fit that made it."""
    from hf_msv.training.checkpoint import STATE_FILE

    train_dir, val_dir = signal_dirs(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(_Interrupted):
        _fit_counting_steps(monkeypatch, train_dir, val_dir, out, _resume_config(), stop_at=8)
    saved = (out / STATE_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"other config \(learning_rate\)"):
        _fit_counting_steps(monkeypatch, train_dir, val_dir, out, _resume_config(learning_rate=3e-4), resume=True)
    assert (out / STATE_FILE).read_bytes() == saved
    _, steps = _fit_counting_steps(monkeypatch, train_dir, val_dir, out, _resume_config(progress=True), resume=True)
    assert steps > 0  # progress output is not a training setting


def test_the_guard_reference_at_n_1_is_labelled_by_what_it_computes():
    """At N = 1 γ is always 1, so the guard's calibrated γ is a base rate cross-fitted over two halves of the
    validation problems: one constant per half, the other half's accuracy, whose AUROC is not 0.5 when the halves'
    accuracies differ. Its label says that, not "constant"."""
    from hf_msv.training.guard import BASE_RATE_REFERENCE, ValidationPredictions, build_guard_report

    problems = np.repeat(np.array(["a", "b", "c", "d"], dtype=object), 20)  # halves: a, c | b, d
    labels = np.concatenate([np.ones(16), np.zeros(4), np.ones(4), np.zeros(16)] * 2)
    preds = ValidationPredictions(logits=np.zeros(80), labels=labels, gamma=np.ones(80), problems=problems)
    report = build_guard_report("Probe", 1, preds, None, {})
    assert report.reference == BASE_RATE_REFERENCE and "cross-fitted" in report.reference
    assert "constant" not in " ".join(report.summary_lines()) + " ".join(report.card_metrics())
    assert report.self_consistency["auroc"] != pytest.approx(0.5)  # two constants, not one
    assert build_guard_report("MSV_4", 4, preds, None, {}).reference == "calibrated self-consistency"


def test_training_on_an_empty_directory_names_the_flag_and_what_to_give(tmp_path):
    """``hf-msv train`` on a directory without shards: a FileNotFoundError naming the split, the flag and what to
    give, before anything is written."""
    from hf_msv.training import main

    (tmp_path / "empty").mkdir()
    _, val_dir = signal_dirs(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match=r"training data \(--train-dir .*empty\): .*hf-msv collect"):
        main(
            ["--train-dir", str(tmp_path / "empty"), "--val-dir", str(val_dir), "--output-dir", str(tmp_path / "out")]
        )
    assert not (tmp_path / "out").exists()


def test_a_verifier_takes_its_elicitation_settings_from_the_shards_new_or_old():
    """Shards that record `ElicitationSettings` and shards written with the flat keys before build the same
    verifier config; a terminal verifier keeps the prompt and cap but no delimiters."""
    from hf_msv.elicitation import ElicitationSettings

    settings = ElicitationSettings(delimiters=("Wait", "Hmm"), prompt="Answer: \\boxed", max_answer_tokens=12)
    new = {"lm_name_or_path": "lm", "elicitation": settings.to_dict()}
    old = {
        "lm_name_or_path": "lm",
        "delimiters": ["Wait", "Hmm"],
        "every_k_tokens": None,
        "elicitation_prompt": "Answer: \\boxed",
        "max_answer_tokens": 12,
    }
    for kind in ("msv", "probe"):
        config = MSVTrainingConfig(
            kind=kind, num_sequences=1, mode="streaming", architecture={"intermediate_size": 16}
        )
        built = [training.build_verifier(config, 16, info).config.elicitation for info in (new, old)]
        assert built[0] == built[1] == settings
    terminal = training.build_verifier(
        MSVTrainingConfig(num_sequences=2, mode="terminal", architecture={"intermediate_size": 16}), 16, new
    ).config.elicitation
    assert terminal.delimiters == () and terminal.prompt == "Answer: \\boxed" and terminal.mode == "terminal"


def hard_problem(pid: str, rng, num_sequences: int = 8, d: int = 16):
    """One terminal answer per chain; each chain is right with a per-problem probability in [0.15, 0.75] and wrong
    chains favour one distractor (0.7), so the majority is often wrong; every chain's last state carries its
    correctness (±1 on dimension 0) plus an offset shared by the problem, which no single-chain score removes."""
    from hf_msv.data import CollectedProblem

    p, offset, names = rng.uniform(0.15, 0.75), rng.normal() * 2.0, rng.permutation(["a", "b", "c", "d"])
    right = rng.random(num_sequences) < p
    klass = np.where(right, 0, np.where(rng.random(num_sequences) < 0.7, 1, rng.integers(2, 4, num_sequences)))
    answers = [str(names[k]) for k in klass]
    states = rng.normal(size=(num_sequences, d)).astype(np.float32)
    states[:, 0] += np.where(right, 1.0, -1.0) + offset
    classes = {a: i for i, a in enumerate(dict.fromkeys(answers))}
    taus = np.sort(rng.choice(np.arange(10, 200), size=num_sequences, replace=False))
    ones = np.ones(num_sequences, dtype=np.int64)
    return CollectedProblem(
        problem_id=pid,
        gold=str(names[0]),
        source="synthetic",
        hidden_states=torch.from_numpy(states),
        token_ids=np.zeros(num_sequences, dtype=np.int64),
        token_logprobs=np.zeros(num_sequences, dtype=np.float32),
        answer_text=answers,
        answer_raw_text=answers,
        answer_trigger=["eos"] * num_sequences,
        answer_sequence=np.arange(num_sequences),
        answer_step=np.zeros(num_sequences),
        answer_tau=taus,
        answer_length=ones,
        answer_class=[classes[a] for a in answers],
        answer_terminal=np.ones(num_sequences, bool),
        answer_correct=list(right),
        sequence_length=taus + 1,
        sequence_finish=["eos"] * num_sequences,
    )


def test_the_default_beats_the_vote_and_probe_wv_where_the_majority_is_often_wrong(tmp_path):
    """Defaults only, on synthetic shards where the majority is often wrong and each chain carries a noisy
    correctness signal: on 200 held-out problems the MSV_8 picks better than the vote and than the weighted vote of
    a Probe trained with the defaults on the same chains (Probe+WV), and its Brier is lower than calibrated Probe+WV's.
    """
    from hf_msv.baselines import best_of_n, fit_platt, platt, self_consistency, weighted_voting
    from hf_msv.evaluation.scoring import score_problems

    rng = np.random.default_rng(0)
    dirs = {}
    for split, count in (("train", 128), ("val", 32), ("test", 200)):
        dirs[split] = tmp_path / split
        dirs[split].mkdir()
        write_shard(
            dirs[split] / "shard-r000-00000.safetensors",
            [hard_problem(f"{split}/{i}", rng) for i in range(count)],
            info={
                "lm_name_or_path": "synthetic-lm",
                "lm_num_attention_heads": 4,
                "checker": "exact",
                "num_samples": 8,
            },
        )
    common = dict(mode="terminal", probe_hidden_size=64, progress=False)
    msv = train_verifier(dirs["train"], dirs["val"], tmp_path / "msv", MSVTrainingConfig(num_sequences=8, **common))
    probe = train_verifier(dirs["train"], dirs["val"], tmp_path / "probe", MSVTrainingConfig(kind="probe", **common))
    assert msv.guard.passed, msv.guard
    test = ShardDataset(dirs["test"], num_sequences=8, mode="terminal")
    problems = test.read_problems(False)
    msv_scores, _, _ = score_problems(msv.verifier, test)
    probe_scores, _, _ = score_problems(probe.verifier, test)
    val = ShardDataset(dirs["val"], num_sequences=8, mode="terminal")
    val_probe, _, _ = score_problems(probe.verifier, val)
    val_problems = val.read_problems(False)
    a, b = fit_platt(
        np.concatenate([weighted_voting(s, p.answer_class) for s, p in zip(val_probe, val_problems)]),
        np.concatenate([p.answer_correct for p in val_problems]),
    )
    picks = {"vote": [], "Probe+WV": [], "MSV_8": []}
    brier = {"Probe+WV": [], "MSV_8": []}
    for p, m, s in zip(problems, msv_scores, probe_scores):
        y = np.asarray(p.answer_correct, dtype=float)
        wv = weighted_voting(s, p.answer_class)
        for name, scores in (("vote", self_consistency(p.answer_class)), ("Probe+WV", wv), ("MSV_8", m)):
            picks[name].append(y[best_of_n(scores)])
        brier["Probe+WV"].append(np.mean((platt(wv, a, b) - y) ** 2))
        brier["MSV_8"].append(np.mean((m - y) ** 2))
    accuracy = {k: float(np.mean(v)) for k, v in picks.items()}
    assert accuracy["MSV_8"] > accuracy["Probe+WV"] > accuracy["vote"], accuracy
    assert np.mean(brier["MSV_8"]) < np.mean(brier["Probe+WV"]), {k: np.mean(v) for k, v in brier.items()}
