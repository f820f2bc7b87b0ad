"""Reuse of trained verifiers and collected shards (`hf_msv.reproduction.reuse`, `train_or_reuse`): keyed on the
settings, the data fingerprint and the code version, so a change to any of them retrains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.evaluation import write_split
from hf_msv.reproduction.reuse import KEY_FILE, ReuseLog, code_version, data_fingerprint
from hf_msv.reproduction.stages import ShardReuse, train_or_reuse
from hf_msv.training import MSVTrainingConfig

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("reuse")
    return write_split(root / "train", 6, seed=1), write_split(root / "val", 4, seed=2)


def _config(**kw):
    return MSVTrainingConfig(
        **(
            {
                "kind": "probe",
                "num_sequences": 1,
                "mode": "terminal",
                "max_steps": 2,
                "eval_steps": 1,
                "batch_size": 4,
                "probe_hidden_size": 8,
                "progress": False,
            }
            | kw
        )
    )


def test_reuse_invalidates_when_the_code_version_changes(splits, tmp_path):
    train, val = splits
    out, counts, log = tmp_path / "probe", {}, ReuseLog()
    train_or_reuse(train, val, out, _config(), counts, log, code="code-v1")
    assert counts == {"trained": 1} and json.loads((out / KEY_FILE).read_text())["code"] == "code-v1"
    first = (out / "training_log.json").stat().st_mtime_ns
    train_or_reuse(train, val, out, _config(), counts, log, code="code-v1")  # same key: reused
    assert counts == {"trained": 1, "reused": 1} and (out / "training_log.json").stat().st_mtime_ns == first
    train_or_reuse(train, val, out, _config(), counts, log, code="code-v2")  # code changed: retrained
    assert counts == {"trained": 2, "reused": 1}
    assert json.loads((out / KEY_FILE).read_text())["code"] == "code-v2"
    train_or_reuse(train, val, out, _config(seed=1), counts, log, code="code-v2")  # settings changed
    assert counts["trained"] == 3
    (out / KEY_FILE).unlink()  # made before keys existed
    train_or_reuse(train, val, out, _config(seed=1), counts, log, code="code-v2")
    assert counts["trained"] == 4
    assert log.summary() == {
        "reused": ["verifier probe (same settings, data and code)"],
        "redone": [
            "verifier probe (changed: code; the old fit moved to probe.replaced-1)",
            "verifier probe (changed: settings; the old fit moved to probe.replaced-2)",
            "verifier probe (no reuse key (made before keys were stored); the old fit moved to probe.replaced-3)",
        ],
    }
    # each replaced fit is kept whole beside the new one: the first, trained by code-v1, is still loadable
    assert json.loads((tmp_path / "probe.replaced-1" / KEY_FILE).read_text())["code"] == "code-v1"
    assert (tmp_path / "probe.replaced-1" / "training_log.json").stat().st_mtime_ns == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "probe",
        "probe.replaced-1",
        "probe.replaced-2",
        "probe.replaced-3",
    ]


def test_reuse_verifiers_keep_accepts_another_code_version_but_not_other_settings_or_data(splits, tmp_path):
    train, val = splits
    out, counts, log = tmp_path / "probe", {}, ReuseLog()
    train_or_reuse(train, val, out, _config(), counts, log, code="code-v1")
    first = (out / "training_log.json").stat().st_mtime_ns
    train_or_reuse(train, val, out, _config(), counts, log, code="code-v2", reuse="keep")  # only the code differs
    assert counts == {"trained": 1, "reused": 1} and (out / "training_log.json").stat().st_mtime_ns == first
    assert json.loads((out / KEY_FILE).read_text())["code"] == "code-v1"  # the key still names what trained it
    assert "kept by --reuse-verifiers keep" in log.summary()["reused"][0] and "code-v1" in log.summary()["reused"][0]
    assert log.summary()["redone"] == []  # kept, so not also listed as redone (the report listed it under both)
    train_or_reuse(train, val, out, _config(seed=1), counts, log, code="code-v2", reuse="keep")  # settings differ
    assert counts == {"trained": 2, "reused": 1}
    other = write_split(tmp_path / "train2", 6, seed=3)
    train_or_reuse(other, val, out, _config(seed=1), counts, log, code="code-v3", reuse="keep")  # data differ
    assert counts == {"trained": 3, "reused": 1}


def test_reuse_invalidates_when_the_data_changes(splits, tmp_path):
    train, val = splits
    out, counts = tmp_path / "probe", {}
    train_or_reuse(train, val, out, _config(), counts, code="v")
    other = write_split(tmp_path / "train2", 6, seed=3)
    train_or_reuse(other, val, out, _config(), counts, code="v")
    assert counts == {"trained": 2}


def test_code_version_and_data_fingerprint_follow_the_files(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    v1 = code_version(("pkg", "b.py"), root=tmp_path)
    assert v1 == code_version(("pkg", "b.py"), root=tmp_path) and len(v1) == 16
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert code_version(("pkg", "b.py"), root=tmp_path) != v1
    assert code_version() == code_version()  # the installed package's training code
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "shard-0.safetensors").write_bytes(b"abc")
    f1 = data_fingerprint(tmp_path / "d")
    (tmp_path / "d" / "reuse_key.json").write_text('{"git_commit": "x"}')  # not data: ignored
    assert data_fingerprint(tmp_path / "d") == f1
    (tmp_path / "d" / "shard-0.safetensors").write_bytes(b"abd")
    assert data_fingerprint(tmp_path / "d") != f1


def test_an_interrupted_collection_is_extended_by_the_next_run_not_collected_again(tmp_path, monkeypatch):
    """`collect_problems` stores its reuse key before collecting, so the shards of a run stopped part-way match the
    next run's key (same settings) and are extended; before, a shard without a key was deleted and collected again."""
    import hf_msv.collect as collect_module
    from hf_msv.collect import load_lm
    from hf_msv.reproduction import ReproduceConfig, collect_problems

    model, tokenizer = load_lm("testbed")
    cfg = ReproduceConfig(problems_per_shard=1, max_new_tokens=24)
    out, real = tmp_path / "train", collect_module.collect

    def stopped_after_the_first_problem(model, tokenizer, problems, *args, **kwargs):
        real(model, tokenizer, problems[:1], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(collect_module, "collect", stopped_after_the_first_problem)
    with pytest.raises(KeyboardInterrupt):
        collect_problems(model, tokenizer, "train", range(2), out, cfg, num_samples=2)
    (first,) = out.glob("*.safetensors")
    written = first.stat().st_mtime_ns
    monkeypatch.setattr(collect_module, "collect", real)
    log = ReuseLog()
    result = collect_problems(model, tokenizer, "train", range(2), out, cfg, num_samples=2, reuse=ShardReuse(log))
    assert log.summary()["redone"] == [] and (result.already_done, result.generated) == (1, 1)
    assert first.stat().st_mtime_ns == written and len(list(out.glob("*.safetensors"))) == 2


def test_training_queue_trains_in_worker_processes_what_inline_training_trains(splits, tmp_path):
    """`TrainingQueue(2)` (``hf-msv reproduce --train-workers 2``) runs fits in other processes; they store the same
    weights and keys as fits run inline, are reusable, and `wait` is what makes them finished."""
    from safetensors.torch import load_file

    from hf_msv.reproduction.stages import TrainingQueue

    train, val = splits
    inline, counts = tmp_path / "inline", {}
    for seed in (0, 1):
        train_or_reuse(train, val, inline / f"s{seed}", _config(seed=seed), counts, code="v")
    queue = TrainingQueue(workers=2, threads=1)
    try:
        for seed in (0, 1):
            train_or_reuse(
                train, val, tmp_path / "queued" / f"s{seed}", _config(seed=seed), counts, code="v", queue=queue
            )
        queue.wait()
    finally:
        queue.close()
    assert counts == {"trained": 4}
    for seed in (0, 1):
        a, b = (load_file(d / f"s{seed}" / "model.safetensors") for d in (inline, tmp_path / "queued"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert json.loads((tmp_path / "queued" / f"s{seed}" / KEY_FILE).read_text())["code"] == "v"
        train_or_reuse(train, val, tmp_path / "queued" / f"s{seed}", _config(seed=seed), counts, code="v")
    assert counts == {"trained": 4, "reused": 2}


def _write_when(gate: str, out: str) -> None:
    """A stand-in for a long fit (run in a worker process): writes `out` once `gate` exists (or after 60 s)."""
    import time

    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    Path(out).write_text("opened" if Path(gate).exists() else "timed out")


def test_training_queue_waits_for_the_tagged_fits_alone(tmp_path):
    """`wait(tags)` returns once the fits tagged so have finished while the others keep running (a study evaluates
    its small fits while its large ones train); `wait()` then waits for the rest."""
    from hf_msv.reproduction.stages import TrainingQueue

    gate, slow, fast = (str(tmp_path / name) for name in ("gate", "slow", "fast"))
    queue = TrainingQueue(workers=2, threads=1)
    try:
        queue.submit(_write_when, gate, slow, tag="large")
        queue.submit(_write_when, tmp_path, fast, tag="small")  # its gate (the directory) exists already
        queue.wait({"small"})
        assert Path(fast).read_text() == "opened" and not Path(slow).exists()
        Path(gate).touch()
        queue.wait()
    finally:
        queue.close(cancel=True)
    assert Path(slow).read_text() == "opened"


def test_training_queue_reraises_a_failed_fit_at_wait(splits, tmp_path):
    from hf_msv.reproduction.stages import TrainingQueue

    train, _ = splits
    queue = TrainingQueue(workers=2, threads=1)
    (tmp_path / "empty").mkdir()
    try:  # a validation directory without shards: the worker's train_verifier raises, the parent sees it at wait
        train_or_reuse(train, tmp_path / "empty", tmp_path / "bad", _config(), code="v", queue=queue)
        with pytest.raises(Exception, match="empty"):
            queue.wait()
    finally:
        queue.close(cancel=True)
    assert not (tmp_path / "bad" / KEY_FILE).exists()


def test_a_study_evaluates_only_after_its_queued_fits_have_finished(splits, tmp_path, monkeypatch):
    """`ReproductionContext.train` hands fits to the queue and returns at once; `ReproductionContext.evaluate`
    waits for them, so `evaluate_study` never sees a half-written verifier."""
    import hf_msv.evaluation
    from hf_msv.reproduction import ReproduceConfig, ReproductionContext, TrainingQueue

    train, val = splits
    seen = []

    def fake_evaluate_study(config, verifiers, **kwargs):
        seen.extend(
            (Path(p) / "training_log.json").exists() for specs in verifiers.values() for s in specs for p in s.values()
        )
        return {}

    monkeypatch.setattr(hf_msv.evaluation, "evaluate_study", fake_evaluate_study)
    monkeypatch.setattr("hf_msv.reproduction.context.vote_check_rows", lambda res, name: [])
    ctx = ReproductionContext(
        ReproduceConfig.quick_config(), tmp_path / "work", tmp_path / "out", queue=TrainingQueue(workers=2, threads=1)
    )
    try:
        paths = ctx.train(train, "probe", _config(), val_dir=val)
        assert len(paths) == ctx.config.training_seeds == 2
        ctx.evaluate(val, {"Probe": [{"terminal": p} for p in paths]}, [1], val, report_name="r", title="t")
    finally:
        ctx.queue.close()
    assert seen == [True, True] and ctx.counts["trained"] == 2


def test_checkpoint_paths_are_the_fits_an_evaluation_waits_for():
    from hf_msv.reproduction.context import checkpoint_paths

    spec = {"Probe": [{"terminal": "p0", "streaming": "p0s"}, {"terminal": "p1", "streaming": "p1s"}], "MSV": "m"}
    assert checkpoint_paths(spec) == {"p0", "p0s", "p1", "p1s", "m"}
    assert checkpoint_paths({}) == set()


def test_a_study_evaluation_is_kept_and_reused_until_a_verifier_changes(splits, tmp_path, monkeypatch):
    """`ReproductionContext.evaluate` keeps each evaluation (results, report) in the work directory under a reuse
    key naming its verifiers' keys, so a resumed run does not evaluate a finished study again; a retrained
    verifier (other key) evaluates again."""
    import hf_msv.evaluation
    from hf_msv.reproduction import ReproduceConfig, ReproductionContext

    train, val = splits
    real, calls = hf_msv.evaluation.evaluate_study, []

    def counted(config, *args, **kwargs):
        calls.append(config.report_name)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(hf_msv.evaluation, "evaluate_study", counted)

    def run(out, seed=0):
        ctx = ReproductionContext(ReproduceConfig.quick_config(), tmp_path / "work", tmp_path / out)
        probe = train_or_reuse(train, val, tmp_path / "probe", _config(seed=seed), code="v")
        # every spec evaluate_study takes: {mode: path} per seed (main study), a path per seed (checker study)
        res = ctx.evaluate(
            val,
            {"Probe": [{"terminal": str(probe)}], "Probe (path)": [str(probe)]},
            [1],
            val,
            report_name="r",
            title="t",
            bootstrap=20,
        )
        return res, ctx.reuse.summary()

    first, _ = run("out1")
    second, reuse = run("out2")  # a new run, another output directory: nothing evaluated, the report put back
    assert calls == ["testbed-v2-quick-r"] and second == first
    assert "evaluation testbed-v2-quick-r (same settings, data and code)" in reuse["reused"]
    report = "studies/testbed-v2-quick-r.md"
    assert (tmp_path / "out2" / report).read_text() == (tmp_path / "out1" / report).read_text()
    run("out3", seed=1)  # the Probe retrained with another seed: its key changed, evaluated again
    assert len(calls) == 2


def test_reuse_shards_keep_names_the_code_that_collected_them(tmp_path, monkeypatch):
    """After a collection-code change, ``--reuse-shards keep`` reuses the shards and the log says that only the code
    version differs (and which one collected them); without keep they are collected again, the old ones kept aside."""
    import hf_msv.reproduction.stages as stages
    from hf_msv.collect import load_lm
    from hf_msv.reproduction import ReproduceConfig, collect_problems

    model, tokenizer = load_lm("testbed")
    cfg = ReproduceConfig(problems_per_shard=1, max_new_tokens=24)
    out = tmp_path / "train"
    collect_problems(model, tokenizer, "train", range(1), out, cfg, num_samples=2)
    before = json.loads((out / KEY_FILE).read_text())["code"]
    monkeypatch.setattr(stages, "code_version", lambda parts: "changed-code")
    log = ReuseLog()
    result = collect_problems(
        model, tokenizer, "train", range(1), out, cfg, num_samples=2, reuse=ShardReuse(log, "keep")
    )
    assert (
        result.generated == 0
        and log.summary()["reused"]
        == [
            (
                "shards tmp/train (kept by --reuse-shards keep: same settings and LM, collected by code version "
                f"{before})"
            ).replace("tmp", tmp_path.name)
        ]
        and log.summary()["redone"] == []
    )
    old_files = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    log = ReuseLog()
    result = collect_problems(model, tokenizer, "train", range(1), out, cfg, num_samples=2, reuse=ShardReuse(log))
    assert result.generated == 1 and log.summary()["redone"] == [
        f"shards {tmp_path.name}/train (changed: code; the old shards moved to train.replaced-1)"
    ]
    # The replaced collection is kept beside the new one, byte for byte; a second replacement takes the next name.
    aside = tmp_path / "train.replaced-1"
    assert {f.name: f.read_bytes() for f in aside.iterdir() if f.is_file()} == old_files
    monkeypatch.setattr(stages, "code_version", lambda parts: "changed-again")
    collect_problems(model, tokenizer, "train", range(1), out, cfg, num_samples=2, reuse=ShardReuse(ReuseLog()))
    assert aside.exists() and (tmp_path / "train.replaced-2" / KEY_FILE).exists()


def test_a_fit_interrupted_by_a_run_is_resumed_by_the_next_run_with_the_same_key(splits, tmp_path, monkeypatch):
    """`train_fit` keeps the key of a fit under way as pending: a run stopped during the fit leaves it (and the fit's
    saved state), the next run with the same key resumes it (``train_verifier(resume=True)``, logged as resumed,
    not set aside), and a run with another key starts that directory again."""
    import hf_msv.training as training
    from hf_msv.reproduction.stages import PENDING_KEY, resumable

    train, val = splits
    out, log, calls = tmp_path / "msv", ReuseLog(), []
    real = training.train_verifier

    def interrupted(*args, resume=False):
        calls.append(resume)
        (out / "training_log.json").write_text("{}")  # as left by a final run stopped after its first validation
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train_verifier", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_or_reuse(train, val, out, _config(), log=log, code="v1")
    assert (out / PENDING_KEY).exists() and not (out / KEY_FILE).exists()
    monkeypatch.setattr(training, "train_verifier", lambda *a, resume=False: calls.append(resume) or real(*a))
    train_or_reuse(train, val, out, _config(), log=log, code="v1")
    assert calls == [False, True] and (out / KEY_FILE).exists() and not (out / PENDING_KEY).exists()
    assert not resumable(out, json.loads((out / KEY_FILE).read_text())) and not list(tmp_path.glob("*.replaced-*"))
    assert log.summary()["redone"] == [
        "verifier msv (absent; interrupted by an earlier run with the same key: resumed from its saved state)"
    ]

    monkeypatch.setattr(training, "train_verifier", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_or_reuse(train, val, out, _config(seed=1), log=log, code="v1")  # a finished fit moved aside first
    (out / "stale-file").write_text("")
    monkeypatch.setattr(training, "train_verifier", lambda *a, resume=False: calls.append(resume) or real(*a))
    train_or_reuse(train, val, out, _config(seed=2), log=log, code="v1")  # another key: started again
    assert calls[-1] is False and not (out / "stale-file").exists() and (out / KEY_FILE).exists()


def test_reuse_verifiers_keep_resumes_a_fit_interrupted_under_another_code_version(splits, tmp_path, monkeypatch):
    """A study spans several runs; a fit cut by one and resumed by the next after a training-code change is started
    again under ``matching``, and resumed under ``keep`` (its key keeps the code version that began it, so a later
    ``matching`` run trains it again); a pending fit with other settings is never resumed."""
    import hf_msv.training as training
    from hf_msv.reproduction.stages import PENDING_KEY

    train, val = splits
    out, calls = tmp_path / "msv", []
    real = training.train_verifier

    def interrupted(*args, resume=False):
        calls.append(resume)
        raise KeyboardInterrupt

    def cut(config, code):
        monkeypatch.setattr(training, "train_verifier", interrupted)
        with pytest.raises(KeyboardInterrupt):
            train_or_reuse(train, val, out, config, code=code)
        monkeypatch.setattr(training, "train_verifier", lambda *a, resume=False: calls.append(resume) or real(*a))

    cut(_config(), "v1")
    log = ReuseLog()
    train_or_reuse(train, val, out, _config(seed=1), log=log, code="v2", reuse="keep")  # other settings: not resumed
    assert calls[-1] is False and json.loads((out / KEY_FILE).read_text())["code"] == "v2"

    cut(_config(), "v1")  # the finished seed-1 fit moved aside first
    assert json.loads((out / PENDING_KEY).read_text())["code"] == "v1"
    log = ReuseLog()
    train_or_reuse(train, val, out, _config(), log=log, code="v2", reuse="keep")
    assert calls[-1] is True and not (out / PENDING_KEY).exists()
    assert json.loads((out / KEY_FILE).read_text())["code"] == "v1"
    assert [p.name for p in tmp_path.glob("*.replaced-*")] == ["msv.replaced-1"]  # the resumed fit was not
    assert log.summary()["redone"] == [
        "verifier msv (absent; interrupted by an earlier run of code version v1 "
        "(--reuse-verifiers keep): resumed from its saved state)"
    ]
    log = ReuseLog()
    train_or_reuse(train, val, out, _config(), log=log, code="v2")  # finished, but by v1: matching trains again
    assert calls[-1] is False and json.loads((out / KEY_FILE).read_text())["code"] == "v2"

    cut(_config(seed=3), "v1")
    train_or_reuse(train, val, out, _config(seed=3), code="v2")  # matching: started again, the state discarded
    assert calls[-1] is False and json.loads((out / KEY_FILE).read_text())["code"] == "v2"
