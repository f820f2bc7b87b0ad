"""`hf-msv reproduce --continue-report`: a new part, in an empty work directory, continues the committed v2 report.

The committed six-study v2 report (docs/results/plain-vote-start/testbed-v2.json, its main study's results beside
it) is continued in a temporary directory with the study functions replaced by recorders: no LM sampling, no
training. What is checked is
what the new part keeps, what it runs, what it refuses, and what the report then says.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hf_msv.reproduction import ReproduceArguments, ReproduceConfig, parse_arguments, pipeline, render_testbed
from hf_msv.reproduction.results import DelimiterStudy, ReproductionResults

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
SIX_STUDIES = RESULTS / "plain-vote-start"  # the committed v2 report with all six studies, in five parts


@pytest.fixture
def report_dir(tmp_path) -> Path:
    """A copy of the committed v2 report (summary, main results) as an output directory, with the studies of its
    later parts (delimiters, masks, grouping, training size) taken out (entries, claims, report links, vote checks,
    parts), so that a new part has a study to run and the report reads as after its first part."""
    out = tmp_path / "results"
    out.mkdir()
    shutil.copy(SIX_STUDIES / "testbed-v2-main.json", out / "testbed-v2-main.json")
    s = json.loads((SIX_STUDIES / "testbed-v2.json").read_text())
    later = ("delimiters", "masks", "grouping", "training_size")
    first = ("main", "checker")  # the first part's studies, as named in reports and vote checks
    for study in later:
        s.pop(study, None)
    s["reports"] = {k: v for k, v in s["reports"].items() if k.startswith(first)}
    s["claims"] = [c for c in s["claims"] if not c["id"].startswith(later)]
    s["vote_check"] = [row for row in s["vote_check"] if row["study"].startswith(first)]
    s["parts"] = [x for x in s["parts"] if not set(x["studies"]) & set(later)]
    (out / "testbed-v2.json").write_text(json.dumps(s))
    return out


def continuing(report_dir: Path, work_dir: Path, **options) -> ReproduceArguments:
    """The run options of a quiet part continuing the report in `report_dir` from `work_dir`."""
    return ReproduceArguments(
        output_dir=str(report_dir), work_dir=str(work_dir), continue_report=True, progress=False, **options
    )


@pytest.fixture
def recorded(monkeypatch):
    """The delimiter study replaced by a recorder returning v1's committed delimiter entry (same shape), and no LM."""
    import hf_msv.collect

    class LM:
        device = "cpu"

    calls = []

    def delimiters(ctx):
        calls.append(
            {
                "main_results": ctx.main_results,
                "collections": dict(ctx.collections),
                "lm_costs": dict(ctx.lm_costs),
                "vote_checks": list(ctx.vote_checks),
            }
        )
        return DelimiterStudy.from_json(json.loads((RESULTS / "testbed.json").read_text())["delimiters"])

    monkeypatch.setattr(hf_msv.collect, "load_lm", lambda *a, **k: (LM(), None))
    monkeypatch.setattr(pipeline, "STUDY_STAGES", {**pipeline.STUDY_STAGES, "delimiters": (delimiters, "delimiters")})
    return calls


def test_a_new_part_keeps_the_report_and_runs_only_what_it_lacks(report_dir, recorded, tmp_path):
    earlier = json.loads((report_dir / "testbed-v2.json").read_text())
    work = tmp_path / "fresh-work-dir"
    typed = pipeline.reproduce(continuing(report_dir, work, studies=["checkers", "delimiters"]))
    assert isinstance(typed, ReproductionResults)
    summary = typed.to_json()

    (call,) = recorded  # the delimiter study ran once; the checker study, already in the report, did not
    assert call["main_results"].to_dict() == json.loads((SIX_STUDIES / "testbed-v2-main.json").read_text())
    assert call["collections"] == {} and not (work / "data").exists()  # it needs no main collection: none made
    assert call["vote_checks"] == earlier["vote_check"]
    assert {str(n): c.decode_step_s for n, c in call["lm_costs"].items()} == {
        n: c["decode_step_s"] for n, c in earlier["lm_costs"].items()
    }  # the costs the main study was scored with
    for kept in ("config", "main", "checkers", "lm_costs"):
        assert summary[kept] == earlier[kept], kept
    assert summary["delimiters"] and "masks" not in summary and "pending" not in summary
    assert summary["studies"] == ["main", "checkers", "delimiters"]  # the report names the others as not run
    assert summary["reports"] == earlier["reports"]  # the recorder writes no report of its own
    *before, last = summary["parts"]
    assert before == earlier["parts"]
    assert last["studies"] == ["delimiters"] and last["verifiers"] == {"trained": 0, "reused": 0}
    assert [c for c in summary["claims"] if not c["id"].startswith("delimiters")] == earlier["claims"]
    assert any(c["id"].startswith("delimiters") for c in summary["claims"])

    text = (report_dir / "testbed-v2.md").read_text()
    assert text == render_testbed(summary) == render_testbed(typed)
    assert (
        f"in {len(before) + 1} parts (each part after the first continued the committed report with "
        "`--continue-report`; the last ran delimiters in" in text
    )
    assert (
        "* Parts: 1. main, checkers on `cpu`, " in text
        and f"; {len(before) + 1}. delimiters on `cpu`, 0 min, 0 fits trained, commit " in text
        and "(the first part's time and fits are its last resumption's" in text
    )
    assert "* Part 1: Reused from an earlier run" in text and "* Part 2: Redone although present" in text
    assert text.count("verifier msv64-streaming-seed1 (kept by --reuse-verifiers keep") == 1  # part 1's, kept
    assert "LM costs measured by the part that ran the main study" in text
    assert "## 7. Delimiter sensitivity" in text and "## 6." not in text  # rendered beside the kept ones
    assert "Not run this time: masks, grouping, training_size (`hf-msv reproduce --continue-report --studies" in text
    assert "Interim report" not in text

    # a third part with nothing left to run rewrites the report and adds itself, nothing else
    again = pipeline.reproduce(continuing(report_dir, work, studies=["delimiters"])).to_json()
    assert len(recorded) == 1 and len(again["parts"]) == len(before) + 2 and again["parts"][-1]["studies"] == []
    assert again["delimiters"] == summary["delimiters"]


def test_continuing_refuses_other_settings_and_a_missing_report(report_dir, recorded, tmp_path):
    with pytest.raises(ValueError, match=r"other settings \(training_seeds\)"):
        pipeline.reproduce(continuing(report_dir, tmp_path / "w"), replace(ReproduceConfig(), training_seeds=2))
    with pytest.raises(ValueError, match=r"other settings \(training_seeds\)"):
        pipeline.reproduce(continuing(report_dir, tmp_path / "w", training_seeds=2))
    with pytest.raises(FileNotFoundError, match="no report"):
        pipeline.reproduce(continuing(tmp_path / "empty", tmp_path / "w"))
    (report_dir / "testbed-v2-main.json").unlink()
    with pytest.raises(FileNotFoundError, match="no finished main study"):
        pipeline.reproduce(continuing(report_dir, tmp_path / "w"))
    assert recorded == [] and not (tmp_path / "w").exists()  # refused before any work


def test_a_part_records_the_main_collection_it_made_and_where_it_differs_from_the_main_studys():
    main = {"studies": ["main", "checkers"], "collections": {"data/train": "a", "data/eval": "e"}}
    assert pipeline.part_collections([main], {}) == {}  # made none (e.g. the delimiter study alone)
    assert pipeline.part_collections([main], {"data/train": "a", "data/eval": "e"}) == {
        "collections": {"data/train": "a", "data/eval": "e"}
    }
    assert pipeline.part_collections([main, {"studies": ["masks"]}], {"data/train": "a", "data/eval": "x"}) == {
        "collections": {"data/train": "a", "data/eval": "x"},
        "collections_differ_from_main": ["data/eval"],
    }
    # a main study from before fingerprints were recorded: nothing to compare with, nothing claimed
    assert pipeline.part_collections([{"studies": ["main"]}], {"data/eval": "x"}) == {
        "collections": {"data/eval": "x"}
    }
    summary = json.loads((SIX_STUDIES / "testbed-v2.json").read_text())
    summary["parts"] = [
        dict(summary["parts"][0], studies=["main"]),
        {
            "studies": ["masks"],
            "timing_s": {"total": 60.0},
            "git_commit": "0123456789abc",
            "collections_differ_from_main": ["data/eval"],
        },
    ]
    assert (
        "2. masks on `cpu`, 1 min, commit 0123456789 (its re-made main collection differs from the main "
        "study's in data/eval)" in render_testbed(summary)
    )


def test_a_run_stopped_before_finishing_a_study_is_not_counted_as_a_part():
    """An interim report's last part is the snapshot written before its first study: when that run stopped before
    finishing one, the continuing part does not list it (0 min, 0 fits); a part that finished studies, or the last
    part of a finished report, stays."""
    first, snapshot = {"studies": ["main"]}, {"studies": []}
    assert pipeline.earlier_parts({"parts": [first, snapshot], "pending": ["grouping"]}) == [first]
    masks = {"studies": ["masks"]}
    assert pipeline.earlier_parts({"parts": [first, masks], "pending": ["grouping"]}) == [first, masks]
    assert pipeline.earlier_parts({"parts": [first, snapshot]}) == [first, snapshot]
    assert pipeline.earlier_parts({}) == []


def test_a_report_written_with_the_old_field_name_loads_renders_and_continues(report_dir, recorded, tmp_path):
    """Reports written before the field was named ``parts`` (the same list under `LEGACY_PARTS_KEY`) render the
    same text, and a continued one is written back with ``parts`` only."""
    from hf_msv.reproduction.report import LEGACY_PARTS_KEY

    path = report_dir / "testbed-v2.json"
    summary = json.loads(path.read_text())
    legacy = {(LEGACY_PARTS_KEY if k == "parts" else k): v for k, v in summary.items()}
    main = json.loads((report_dir / "testbed-v2-main.json").read_text())
    assert render_testbed(legacy, main) == render_testbed(summary, main)
    assert pipeline.earlier_parts(legacy) == summary["parts"]
    path.write_text(json.dumps(legacy))
    continued = pipeline.reproduce(continuing(report_dir, tmp_path / "w", studies=["delimiters"])).to_json()
    written = json.loads(path.read_text())
    assert LEGACY_PARTS_KEY not in written and written["parts"][:-1] == summary["parts"]
    assert continued["parts"][-1]["studies"] == ["delimiters"]


def test_continue_report_flag():
    assert parse_arguments(["--continue-report", "--studies", "masks"]).continue_report
    assert not parse_arguments([]).continue_report
