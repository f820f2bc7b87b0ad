"""The reproduction's summary entries, testbed.md and command line, on the committed ``docs/results`` (fast).

The committed summary (testbed.json) was built from the committed per-study results (testbed-*.json,
studies/*.json) by `hf_msv.reproduction.summary`, and testbed.md rendered from it by `render_testbed`: both are
recomputed here from the files, without re-running anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hf_msv.reproduction import STUDIES, ReproduceArguments, ReproduceConfig, parse_arguments, render_testbed
from hf_msv.reproduction.results import ReproductionResults, SummarySettings
from hf_msv.reproduction.summary import autc_row, grouping_summary, main_summary, size_row
from hf_msv.testbed import task_v2

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _json(x):
    """`x` (a typed summary entry: its JSON) as loaded back from disk."""
    return json.loads(json.dumps(x.to_json() if hasattr(x, "to_json") else x))


def _settings(config: dict) -> SummarySettings:
    """A config as a summary records it (through JSON: tuples become lists)."""
    return SummarySettings.from_json(_json(config))


@pytest.fixture(scope="module")
def committed() -> dict:
    return _load("testbed.json")


def test_render_testbed_of_the_committed_summary_is_the_committed_report(committed):
    assert render_testbed(committed, _load("testbed-main.json")) == (RESULTS / "testbed.md").read_text()
    assert render_testbed(committed) == (RESULTS / "testbed.md").read_text()  # main results are not read


@pytest.mark.parametrize("report", ["testbed-v2", "plain-vote-start/testbed-v2"])
def test_committed_v2_reports_are_their_summaries_rendered(report):
    """Each committed v2 report (the six-study one was written while the run went on, in several parts) is its
    summary rendered."""
    assert render_testbed(_load(f"{report}.json")) == (RESULTS / f"{report}.md").read_text()


def test_a_resumed_run_says_its_time_is_its_last_runs(committed):
    """A run that reused artefacts timed only itself, so the header must not give that as the whole report's time."""
    first = committed["timing_s"]["total"] / 60
    assert f"in {first:.1f} min, with" in render_testbed(dict(committed, reuse={"reused": [], "redone": []}))
    resumed = render_testbed(
        dict(committed, reuse={"reused": ["verifier msv16-terminal (same settings)"], "redone": []})
    )
    assert f"in {first:.1f} min" not in resumed
    assert (
        "over several runs in one work directory (the last run reused the earlier ones' artefacts and "
        f"took {first:.1f} min; the stage times below are its own)" in resumed
    )


def test_report_names_studies_not_run(committed):
    s = dict(committed, studies=["main", "checkers"])
    for study in ("masks", "delimiters", "grouping", "training_size"):
        del s[study]
    text = render_testbed(s)
    assert "Not run this time: masks, delimiters, grouping, training_size (`hf-msv reproduce --studies ...`)." in text
    assert "## 5. Robustness to the equivalence checker" in text and "## 6." not in text and "## 9." not in text


def test_interim_report_is_written_with_the_studies_still_pending(committed, tmp_path):
    """`write_summary` before a study (a run of several hours): the report so far, saying what is still to run."""
    from hf_msv.reproduction.claims import config_of
    from hf_msv.reproduction.context import ReproductionContext
    from hf_msv.reproduction.pipeline import write_summary

    done = {
        k: v
        for k, v in committed.items()
        if k not in ("masks", "delimiters", "grouping", "training_size", "claims", "timing_s", "reuse", "vote_check")
    }
    ctx = ReproductionContext(config_of(committed), tmp_path / "work", tmp_path)
    ctx.vote_checks = [row for row in committed["vote_check"] if row["study"] in ("main", "checkers")]
    typed = write_summary(ctx, done, started=0.0, pending=["masks", "grouping"])
    written = typed.to_json()
    assert json.loads((tmp_path / "testbed.json").read_text()) == written and typed.pending == ["masks", "grouping"]
    assert written["pending"] == ["masks", "grouping"] and "pending" not in done  # the caller's dict is untouched
    # the claims of the finished studies, as the full run computed them; none of the studies not run
    later = ("masks", "delimiters", "grouping", "training_size")
    assert written["claims"] == [c for c in committed["claims"] if not c["id"].startswith(later)]
    text = (tmp_path / "testbed.md").read_text()
    assert (
        "**Interim report.** Written before the masks study of a run still in progress; not run yet: masks, "
        "grouping." in text
    )
    assert "## 5. Robustness to the equivalence checker" in text and "## 6." not in text
    # the final report (nothing pending) has no such line
    assert "Interim report" not in render_testbed(committed)


def test_main_summary_from_the_committed_main_study(committed):
    ns = committed["config"]["num_sequences"]
    assert _json(main_summary(_load("testbed-main.json"), ns)) == committed["main"]


def test_grouping_summary_from_the_committed_grouping_study(committed):
    cfg = committed["config"]
    res = _load("testbed-grouping.json")
    assert _json(grouping_summary(res, cfg["grouping_ns"], cfg["grouping_m"])) == committed["grouping"]


def test_training_size_rows_from_the_committed_studies(committed):
    ts = committed["training_size"]
    for k, row in ts["per_size"].items():
        assert _json(size_row(_load(f"studies/testbed-size-{k}.json"), ts["n"])) == row, k


def test_delimiter_rows_from_the_committed_studies(committed):
    d = committed["delimiters"]
    n, methods = d["n"], ("Probe", "MSV_1", f"MSV_{d['n']}")
    every_k = _load("studies/testbed-every-k.json")
    for name, res in (
        ("Wait", _load("testbed-main.json")),
        (f"every {committed['config']['every_k_tokens']} tokens", every_k),
    ):
        expected = {k: v for k, v in d["rows"][name].items() if k != "answers_per_sequence"}
        assert _json(autc_row(res, n, methods)) == expected
        assert d["rows"][name]["answers_per_sequence"] == res["data"]["eval"]["answers_per_sequence"]


def test_checker_rows_from_the_committed_studies(committed):
    c = committed["checkers"]
    for checker, row in c["rows"].items():
        term = _load(f"studies/testbed-checker-{checker}.json")["terminal"][str(c["n"])]
        for method, stat in row.items():
            if method != "agreement":
                assert term[method]["bon_accuracy"] == stat, (checker, method)


# ----------------------------------------------------------------------------------------------------------------
# Configuration and command line
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ReproduceConfig, ReproduceArguments])
def test_every_option_has_help(cls):
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f.name


def test_command_line_defaults():
    args = parse_arguments([])
    assert args == ReproduceArguments()
    assert args.output_dir == "docs/results" and args.progress and not args.quick and args.studies is None
    assert args.reproduce_config() == ReproduceConfig()
    assert ReproduceConfig().studies == STUDIES


def test_command_line_flags():
    args = parse_arguments(
        [
            "--quick",
            "--output-dir",
            "out",
            "--work-dir",
            "work",
            "--studies",
            "masks",
            "training_size",
            "--training-seeds",
            "3",
            "--threads",
            "2",
            "--device",
            "cpu",
            "--problems-per-batch",
            "32",
            "--no-progress",
            "--shipped-verifier",
            "--reuse-shards",
            "keep",
            "--train-workers",
            "2",
            "--reuse-verifiers",
            "keep",
        ]
    )
    assert args == ReproduceArguments(
        output_dir="out",
        quick=True,
        work_dir="work",
        studies=["masks", "training_size"],
        training_seeds=3,
        threads=2,
        device="cpu",
        problems_per_batch=32,
        progress=False,
        shipped_verifier=True,
        reuse_shards="keep",
        train_workers=2,
        reuse_verifiers="keep",
    )
    cfg = args.reproduce_config()
    assert cfg == dataclasses.replace(ReproduceConfig.quick_config(), training_seeds=3, problems_per_batch=32)
    assert ReproduceConfig().training_seeds == 3
    with pytest.raises(SystemExit):
        parse_arguments(["--reuse-shards", "sometimes"])
    with pytest.raises(SystemExit):
        parse_arguments(["--reuse-verifiers", "always"])
    with pytest.raises(ValueError, match="training_seeds"):
        ReproduceConfig(training_seeds=0)


def test_task_flag_picks_testbed_v2_its_cap_its_work_dir_and_report_stem():
    from hf_msv.reproduction.report import _config_changes

    # the settings of v1's committed reports (testbed*.md) are read without v1 registered (research/testbed_v1)
    v1 = ReproduceConfig(task="v1")
    assert (v1.task, v1.stem, v1.default_work_dir, v1.max_new_tokens) == ("v1", "testbed", "outputs/reproduce", 320)
    default = parse_arguments([]).reproduce_config()
    assert (default.task, default.stem, default.default_work_dir) == ("v2", "testbed-v2", "outputs/reproduce-v2")
    cfg = parse_arguments(["--task", "v2", "--quick"]).reproduce_config()
    assert cfg == ReproduceConfig.quick_config(task="v2") == parse_arguments(["--quick"]).reproduce_config()
    # v2's LM has no positions far beyond its trace cap: the reproduction samples up to the cap
    assert cfg.max_new_tokens == task_v2.TaskKnobsV2().max_trace_tokens
    # a smaller budget given explicitly is kept (it used to be overwritten by the cap); one beyond the cap is an error
    assert ReproduceConfig(task="v2", max_new_tokens=128).max_new_tokens == 128
    with pytest.raises(ValueError, match="length cap 272"):
        ReproduceConfig(task="v2", max_new_tokens=400)
    assert ReproduceConfig(task="v1", max_new_tokens=400).max_new_tokens == 400
    assert (cfg.stem, cfg.default_work_dir) == ("testbed-v2-quick", "outputs/reproduce-v2-quick")
    # a v2 run's report lists only what differs from v2's own defaults
    assert _config_changes(_settings(dataclasses.asdict(cfg))) == []
    with pytest.raises(SystemExit):
        parse_arguments(["--task", "v3"])
    with pytest.raises(ValueError, match="unknown testbed task"):
        ReproduceConfig(task="v3")


def test_every_study_can_be_selected():
    assert parse_arguments(["--studies", *STUDIES]).studies == list(STUDIES)
    with pytest.raises(SystemExit):
        parse_arguments(["--studies", "no-such-study"])


def test_every_study_passes_one_checkpoint_per_training_seed(monkeypatch, tmp_path):
    """The studies' wiring with training seeds: each verifier name reaches `evaluate_study` as one spec per training
    seed (training and evaluation replaced by recorders; no LM, no data)."""
    import hf_msv.evaluation as evaluation
    from hf_msv.evaluation import load_verifier_seeds
    from hf_msv.reproduction import context, studies
    from hf_msv.reproduction.context import ReproductionContext

    class Stop(Exception):
        pass

    class Recorder(ReproductionContext):
        def train(self, train_dir, name, config, val_dir=None):
            self.names.append(name)
            return [name if s == 0 else f"{name}-seed{s}" for s in range(self.config.training_seeds)]

        def evaluate(self, eval_dir, verifiers, ns, val_dir=None, **kwargs):
            self.evaluated = verifiers
            raise Stop

    monkeypatch.setattr(studies, "collect_splits", lambda *a, **k: None)
    monkeypatch.setattr(context, "collect_splits", lambda *a, **k: None)
    monkeypatch.setattr(context, "data_fingerprint", lambda *a: "fingerprint")
    monkeypatch.setattr(studies, "collect_problems", lambda *a, **k: None)
    monkeypatch.setattr(evaluation, "load_split", lambda *a, **k: ([], {}))
    monkeypatch.setattr(studies, "checker_agreement", lambda *a, **k: 1.0)
    cfg = ReproduceConfig.quick_config()
    ctx = Recorder(cfg, tmp_path, tmp_path)
    ctx.names = []
    studies.train_main_verifiers(ctx)
    assert ctx.verifiers["MSV_4"]["terminal"] == ["msv4-terminal", "msv4-terminal-seed1"]
    for study in (
        studies.main_study,
        studies.checkers_study,
        studies.masks_study,
        studies.delimiters_study,
        studies.grouping_study,
        studies.training_size_study,
    ):
        with pytest.raises(Stop):
            study(ctx)
        for name, specs in ctx.evaluated.items():
            assert isinstance(specs, list) and len(specs) == cfg.training_seeds, (study.__name__, name)
            seed1 = specs[1] if isinstance(specs[1], str) else next(iter(specs[1].values()))
            assert seed1.endswith("-seed1"), (study.__name__, name, specs)
    with pytest.raises(ValueError, match="training seeds"):
        load_verifier_seeds({"a": ["x", "y"], "b": ["x", "y", "z"]})


def test_vote_check_rows_compare_every_msv_fit_with_the_vote_of_its_setting():
    """Each MSV fit of an evaluation against the vote with the same classes (terminal: self-consistency,
    streaming: latest-answer vote), within 0.005; the interval only for the primary MSV_N."""
    from hf_msv.reproduction.report import _vote_check
    from hf_msv.reproduction.summary import vote_check_rows

    stat = lambda m: {"mean": m, "std": 0.0, "values": [m]}
    res = {
        "methods": {"16": {"msv": "MSV_16", "multi_sequence": ["MSV_16", "w/o full"]}},
        "terminal": {
            "16": {
                "Self-consistency": {"auroc": stat(0.90)},
                "MSV_16": {"auroc": stat(0.91)},
                "w/o full": {"auroc": stat(0.8949)},
                "Probe": {"auroc": stat(0.6)},
            }
        },
        "streaming": {"16": {"Latest-answer vote": {"auroc": stat(0.80)}, "MSV_16": {"auroc": stat(0.796)}}},
    }
    rows = vote_check_rows(res, "masks")
    got = {(r["setting"], r["method"]): r for r in rows}
    assert set(got) == {("terminal", "MSV_16"), ("terminal", "w/o full"), ("streaming", "MSV_16")}
    assert got["terminal", "MSV_16"]["at_vote"] and not got["terminal", "w/o full"]["at_vote"]
    assert got["streaming", "MSV_16"]["at_vote"] and got["streaming", "MSV_16"]["vote"] == "Latest-answer vote"
    assert got["streaming", "MSV_16"]["difference"] == pytest.approx(-0.004)
    text = "\n".join(_vote_check(ReproductionResults.from_json({"vote_check": rows})))
    assert "2 of 3 fits are at or above the vote; below it: masks w/o full (terminal, N=16, -0.005)" in text
    assert "| masks | 16 | terminal | MSV_16 | 0.910 ± 0.000 | 0.900 (Self-consistency) | +0.010 | yes |" in text
    assert _vote_check(ReproductionResults()) == []


def test_report_header_names_the_settings_changed_from_the_defaults():
    from dataclasses import asdict

    from hf_msv.reproduction.report import _config_changes

    assert _config_changes(_settings(asdict(ReproduceConfig()))) == []
    cfg = _settings(asdict(ReproduceConfig(training_sizes=(56, 112, 224))))
    assert _config_changes(cfg) == ["* Settings changed from the defaults: training_sizes=(56, 112, 224)."]
    assert _config_changes(_settings(asdict(ReproduceConfig.quick_config()))) == []


def test_the_package_verifier_is_built_and_loaded_for_the_task_the_demo_pairs_it_with(tmp_path):
    """The shipped verifier reads its own LM's hidden states: `load_default` pairs it with the LM of
    `TESTBED_VERIFIER_TASK`, which is the LM its card names, and building the package's verifier for another task
    stops before collecting anything."""
    from hf_msv.demo import load_default
    from hf_msv.reproduction import train_shipped_verifier
    from hf_msv.testbed import TASKS, TESTBED_VERIFIER_TASK

    other = next(name for name in (*TASKS, "v1") if name != TESTBED_VERIFIER_TASK)
    with pytest.raises(ValueError, match="TESTBED_VERIFIER_TASK"):
        train_shipped_verifier(tmp_path, config=ReproduceConfig(task=other))
    assert not any(tmp_path.iterdir())
    model, _, verifier = load_default("cpu")
    lm_dir = TASKS[TESTBED_VERIFIER_TASK].lm_dir
    assert Path(model.name_or_path).resolve() == lm_dir.resolve()
    assert verifier.config.base_model_name_or_path.endswith(f"(hf_msv/testbed/{lm_dir.name})")
