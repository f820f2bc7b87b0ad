"""Tests of resuming an interrupted training fit (``hf-msv train --resume``: the training state saved with
`accelerate.Accelerator.save_state` at every validation), of ``--report-to`` (accelerate's experiment trackers), and
of ``hf-msv reproduce --config FILE`` / ``--log-level``."""

from __future__ import annotations

import pytest
import torch

import hf_msv.training.trainer as training
from helpers.cli import run_command
from helpers.shards import write_dataset
from hf_msv.errors import UserError
from hf_msv.training import MSVTrainingConfig, train_verifier
from hf_msv.training.checkpoint import TRAINING_STATE_DIR

pytestmark = pytest.mark.usefixtures("single_thread")


class _Interrupted(Exception):
    pass


def _shards(root):
    """Tiny synthetic training (8 problems) and validation (4 problems) shards, 6 sequences each."""
    (root / "train").mkdir()
    (root / "val").mkdir()
    write_dataset(root / "train", num_problems=8, per_shard=3, seed=1)
    write_dataset(root / "val", num_problems=4, per_shard=2, seed=2)
    return root / "train", root / "val"


def _config(**kwargs) -> MSVTrainingConfig:
    """N = 2 (3 groups per problem), 6 groups a step: 4 steps a pass; validation every 2 steps, so states are saved
    at the end of a pass (4, 8) and in the middle of one (2, 6); 10 steps; no start at the vote (no
    cross-validation: the training's state alone is resumed)."""
    settings = dict(
        num_sequences=2,
        mode="streaming",
        gamma_skip=False,
        batch_size=6,
        max_steps=10,
        eval_steps=2,
        early_stopping_patience=0,
        architecture={"intermediate_size": 16, "num_attention_heads": 2},
        progress=False,
    )
    return MSVTrainingConfig(**(settings | kwargs))


def _fit(monkeypatch, train_dir, val_dir, out, config, stop_at=None, resume=False, **kwargs):
    """`train_verifier` and the optimizer steps it took; raises `_Interrupted` at its step `stop_at` (1-based), as a
    fit killed there."""
    real, calls = training._optimizer_step, []

    def step(*args, **kw):
        calls.append(1)
        if len(calls) == stop_at:
            raise _Interrupted
        return real(*args, **kw)

    monkeypatch.setattr(training, "_optimizer_step", step)
    try:
        return train_verifier(train_dir, val_dir, out, config, resume=resume, **kwargs), len(calls)
    finally:
        monkeypatch.setattr(training, "_optimizer_step", real)


def _validations(result):
    # What a fit's validations measured (not its timings or the interval's training loss).
    return [{k: v for k, v in entry.items() if not k.startswith("train_")} for entry in result.history]


@pytest.mark.parametrize(
    "settings",
    [{}, {"gamma_skip": True, "vote_pathway": False, "vote_folds": 0, "vote_margin_se": 0.5}],
    ids=["plain", "anchored-at-the-vote"],  # the second compares every checkpoint with the step-0 vote
)
def test_an_interrupted_training_fit_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch, settings):
    """A fit killed twice (after the state saved at the end of a pass, then after one saved in the middle of a pass)
    and resumed each time trains only the steps after the saved state and ends with the uninterrupted fit's
    validations and weights; the state goes when the fit ends."""
    train_dir, val_dir = _shards(tmp_path)
    config = _config(**settings)
    whole, total = _fit(monkeypatch, train_dir, val_dir, tmp_path / "whole", config)
    assert total == 10 and [e["step"] for e in whole.history] == [0, 2, 4, 6, 8, 10]
    assert not (tmp_path / "whole" / TRAINING_STATE_DIR).exists()

    out = tmp_path / "resumed"
    with pytest.raises(_Interrupted):
        _fit(monkeypatch, train_dir, val_dir, out, config, stop_at=6)  # states saved at 2 and 4 (the pass's end)
    assert (out / TRAINING_STATE_DIR).is_dir()
    with pytest.raises(_Interrupted):  # from step 4: steps 5, 6 (state saved mid-pass), killed at step 8
        _, steps = _fit(monkeypatch, train_dir, val_dir, out, config, stop_at=4, resume=True)
    resumed, steps = _fit(monkeypatch, train_dir, val_dir, out, config, resume=True)
    assert steps == 10 - 6
    assert _validations(resumed) == _validations(whole) and resumed.best_step == whole.best_step
    a, b = whole.verifier.state_dict(), resumed.verifier.state_dict()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-7) for k in a)
    assert not (out / TRAINING_STATE_DIR).exists() and not any(out.glob(f".{TRAINING_STATE_DIR}*"))


def test_a_training_state_saved_with_other_settings_is_not_resumed(tmp_path, monkeypatch):
    """Resuming with other training settings is refused before any training, naming what differs, and keeps the
    state; without ``resume`` the state is discarded and the fit starts again."""
    train_dir, val_dir = _shards(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(_Interrupted):
        _fit(monkeypatch, train_dir, val_dir, out, _config(), stop_at=4)
    saved = (out / TRAINING_STATE_DIR / "progress.pt").read_bytes()
    with pytest.raises(UserError, match=r"other config \(learning_rate\).*cannot resume"):
        _fit(monkeypatch, train_dir, val_dir, out, _config(learning_rate=1e-3), resume=True)
    assert (out / TRAINING_STATE_DIR / "progress.pt").read_bytes() == saved
    with pytest.raises(_Interrupted):  # a fresh fit: its third step is the third of the run
        _fit(monkeypatch, train_dir, val_dir, out, _config(learning_rate=1e-3), stop_at=3)
    assert torch.load(out / TRAINING_STATE_DIR / "progress.pt", weights_only=False)["step"] == 2


# ----------------------------------------------------------------------------------------------------------------
# --report-to
# ----------------------------------------------------------------------------------------------------------------


def test_report_to_a_tracker_that_is_not_installed_fails_before_training(tmp_path, monkeypatch, capsys):
    """A tracker whose package is missing, an unknown one, or ``none`` beside another, is a user error naming what
    to do, before the data is even read; so is ``--report-to`` with ``--lr-sweep``."""
    import accelerate.tracking

    from hf_msv.training.trainer import resolve_trackers

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])  # nothing installed
    assert resolve_trackers("none") == resolve_trackers(None) == resolve_trackers(["none"]) == []
    assert resolve_trackers(["all"]) == []
    with pytest.raises(UserError, match=r"the comet-ml package is not installed \(pip install comet-ml\)"):
        resolve_trackers(["comet_ml"])
    with pytest.raises(UserError, match=r"unknown tracker\(s\) \['tensorbored'\]"):
        resolve_trackers(["tensorbored"])
    with pytest.raises(UserError, match="give it alone"):
        resolve_trackers(["none", "wandb"])

    missing = str(tmp_path / "no-such-shards")  # read only after the trackers are checked
    base = ["train", "--train-dir", missing, "--val-dir", missing, "--output-dir", str(tmp_path / "out")]
    code, _, err = run_command([*base, "--report-to", "tensorboard"], capsys)
    assert code == 2 and "pip install tensorboard" in err.strip().splitlines()[-1]
    code, _, err = run_command([*base, "--report-to", "tensorboard", "--lr-sweep"], capsys)
    assert code == 2 and "pip install tensorboard" in err.strip().splitlines()[-1]
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: ["tensorboard"])
    code, _, err = run_command([*base, "--report-to", "tensorboard", "--lr-sweep"], capsys)
    assert code == 2 and "--lr-sweep runs several" in err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_report_to_logs_every_step_and_every_validation(tmp_path, monkeypatch):
    """A tracker named in ``report_to`` (one registered with accelerate, as a package's would be) gets the run's
    settings, the loss and learning rate of every step, the validation metrics at every validation, and is
    finished."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker

    records = []

    class Recording(GeneralTracker):
        name = "recording"
        requires_logging_directory = False

        def __init__(self, run_name: str, **kwargs):
            super().__init__()
            records.append(("start", run_name))

        @property
        def tracker(self):
            return records

        def store_init_configuration(self, values: dict):
            records.append(("config", values))

        def log(self, values: dict, step: int | None = None, **kwargs):
            records.append(("log", step, values))

        def finish(self):
            records.append(("finish",))

    monkeypatch.setitem(LOGGER_TYPE_TO_CLASS, "recording", Recording)
    train_dir, val_dir = _shards(tmp_path)
    result = train_verifier(train_dir, val_dir, tmp_path / "out", _config(), report_to=["recording"])
    assert records[0] == ("start", "hf-msv") and records[-1] == ("finish",)
    (config,) = [r[1] for r in records if r[0] == "config"]
    assert config["num_sequences"] == 2 and config["plan_max_steps"] == 10
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in config.values())
    logs = [r[1:] for r in records if r[0] == "log"]
    steps = [(step, values["train/loss"]) for step, values in logs if "train/loss" in values]
    assert [s for s, _ in steps] == list(range(1, 11)) and all(loss > 0 for _, loss in steps)
    evals = {step: values for step, values in logs if "eval/bce" in values}
    assert sorted(evals) == [e["step"] for e in result.history] == [0, 2, 4, 6, 8, 10]
    assert all(evals[e["step"]]["eval/bce"] == e["val_bce"] for e in result.history)
    assert {"eval/auroc", "eval/brier", "eval/ece", "eval/accuracy"} <= set(evals[10])


# ----------------------------------------------------------------------------------------------------------------
# hf-msv reproduce --config FILE and --log-level
# ----------------------------------------------------------------------------------------------------------------


def test_reproduce_reads_a_config_file_and_flags_override_it(tmp_path, capsys, monkeypatch):
    import hf_msv.reproduction.pipeline as pipeline

    seen = []
    monkeypatch.setattr(pipeline, "reproduce", lambda args, config: seen.append((args, config)) or {})
    config = tmp_path / "run.yaml"
    config.write_text(
        f"output_dir: {tmp_path / 'a'}\nwork_dir: {tmp_path / 'work'}\nquick: true\nnum_sequences: [1, 4]\n"
        "studies: [main, masks]\n"
    )
    code, _, _ = run_command(["reproduce", "--config", str(config), "--output-dir", str(tmp_path / "b")], capsys)
    assert code == 0 and len(seen) == 1
    args, cfg = seen[0]
    assert (args.output_dir, args.work_dir, args.quick) == (str(tmp_path / "b"), str(tmp_path / "work"), True)
    assert (args.num_sequences, args.studies) == ([1, 4], ["main", "masks"])
    assert cfg == args.reproduce_config()

    config.write_text(config.read_text() + "num_sequence: 4\n")
    code, _, err = run_command(["reproduce", "--config", str(config)], capsys)
    assert code == 2 and "num_sequence" in err.strip().splitlines()[-1] and not seen[1:]
    code, _, err = run_command(["reproduce", "--config", str(tmp_path / "missing.yaml")], capsys)
    assert code != 0 and "missing.yaml" in err and not seen[1:]


def test_reproduce_takes_the_log_level(tmp_path, capsys, monkeypatch):
    import logging

    import hf_msv.reproduction.pipeline as pipeline

    def fake(args, config):
        logging.getLogger("hf_msv.reproduction").info("a reproduction info line")
        return {}

    monkeypatch.setattr(pipeline, "reproduce", fake)
    out = ["--output-dir", str(tmp_path / "a"), "--work-dir", str(tmp_path / "w")]
    code, _, err = run_command(["reproduce", *out], capsys)
    assert code == 0 and "a reproduction info line" not in err
    code, _, err = run_command(["reproduce", *out, "--log-level", "info"], capsys)
    assert code == 0 and "INFO hf_msv.reproduction: a reproduction info line" in err
    code, _, err = run_command(["reproduce", *out, "--log-level", "chatty"], capsys)
    assert code == 2 and "--log-level" in err
