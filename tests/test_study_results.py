"""`hf_msv.evaluation.results.StudyResults` reads every committed study report and writes it back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_msv.evaluation.results import StopReliability, StudyResults

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
STUDY_REPORTS = sorted(
    path.relative_to(RESULTS).as_posix()
    for path in RESULTS.rglob("*.json")
    if {"title", "config", "terminal"} <= set(json.loads(path.read_text()))
)


def test_the_committed_study_reports_are_found():
    assert len(STUDY_REPORTS) >= 20


@pytest.mark.parametrize("name", STUDY_REPORTS)
def test_every_committed_study_report_round_trips(name):
    data = json.loads((RESULTS / name).read_text())
    typed = StudyResults.from_dict(data)
    assert typed.to_dict() == data
    assert bool(typed.stop_reliability) == ("stop_reliability" in data)  # absent from reports that predate it


def test_stop_reliability_is_written_when_present():
    data = json.loads((RESULTS / STUDY_REPORTS[0]).read_text())
    bins = {"confidence": [0.85, 0.97], "accuracy": [0.8, 1.0], "count": [5, 12]}
    data["stop_reliability"] = {"16": {"MSV_16": {"ltt": bins}}}
    typed = StudyResults.from_dict(data)
    assert typed.stop_reliability["16"]["MSV_16"]["ltt"] == StopReliability([0.85, 0.97], [0.8, 1.0], [5, 12])
    assert typed.to_dict() == data
