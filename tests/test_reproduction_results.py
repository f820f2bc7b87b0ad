"""`ReproductionResults`, the typed combined summary of `hf-msv reproduce`, on every committed summary (fast)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hf_msv.evaluation.results import SeedStat
from hf_msv.reproduction import ReproduceConfig, compute_claims, render_testbed
from hf_msv.reproduction.results import (
    LEGACY_PARTS_KEY,
    FitCounts,
    MainRow,
    ReproductionResults,
    ReuseRecord,
    as_reproduction_results,
    unmodelled_keys,
)

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
# The combined summaries (testbed.json-style: they hold the claims); the per-study results next to them are
# `StudyResults` (tests/test_results.py).
SUMMARIES = sorted(
    str(path.relative_to(RESULTS)) for path in RESULTS.rglob("*.json") if "claims" in json.loads(path.read_text())
)


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_the_committed_summaries_are_found():
    assert {"testbed.json", "testbed-v2.json", "plain-vote-start/testbed-v2.json"} <= set(SUMMARIES)


@pytest.mark.parametrize("name", SUMMARIES)
def test_every_committed_summary_round_trips_exactly(name):
    """Same keys, same order, same values: writing the typed summary back gives the committed file's text."""
    data = _load(name)
    written = ReproductionResults.from_json(data).to_json()
    assert written == data
    assert json.dumps(written, ensure_ascii=False) == json.dumps(data, ensure_ascii=False)


@pytest.mark.parametrize("name", SUMMARIES)
def test_every_key_of_a_committed_summary_is_modelled_but_the_settings(name):
    """A key renamed on the writing side would land in an ``extra``: only `ReproduceConfig` settings the report does
    not name may."""
    settings = {f.name for f in dataclasses.fields(ReproduceConfig)}
    unmodelled = unmodelled_keys(ReproductionResults.from_json(_load(name)))
    assert unmodelled, "the summaries record settings the report does not read"
    for path in unmodelled:
        section, key = path.split(".")
        assert section == "config" and key in settings, path


@pytest.mark.parametrize("name", SUMMARIES)
def test_the_typed_summary_renders_and_tests_claims_as_its_dict(name):
    data = _load(name)
    typed = ReproductionResults.from_json(data)
    assert render_testbed(typed) == render_testbed(data) == (RESULTS / name).with_suffix(".md").read_text()
    assert json.loads(json.dumps(compute_claims(typed))) == data["claims"]


def test_attributes_read_the_summary_numbers():
    data = _load("testbed.json")
    results = ReproductionResults.from_json(data)
    row = results.main.row(16)
    assert isinstance(row, MainRow) and row.msv == data["main"]["16"]["msv"]
    assert row.terminal[row.msv].mean("brier") == data["main"]["16"]["terminal"][row.msv]["brier"]["mean"]
    interval = row.interval("terminal", "Probe", "brier_ratio")
    assert interval.to_dict() == data["main"]["16"]["intervals"]["terminal"]["Probe"]["brier_ratio"]
    assert row.interval("terminal", "no such method", "brier") is None
    grouping = results.grouping.per_n["128"]
    assert grouping.early_stop.best_baseline == data["grouping"]["per_n"]["128"]["early_stop"]["best_baseline"]
    assert results.checkers.rows["random"].agreement == data["checkers"]["rows"]["random"]["agreement"]
    assert [claim.id for claim in results.claims] == [claim["id"] for claim in data["claims"]]
    assert results.config.task is None and not results.config.has("task")  # a summary of the v1 testbed
    assert results.vote_check[0].auroc == SeedStat.from_dict(data["vote_check"][0]["auroc"])


def test_missing_sections_read_as_none_and_are_not_written_back():
    data = {k: v for k, v in _load("testbed.json").items() if k not in ("masks", "reuse")}
    results = ReproductionResults.from_json(data)
    assert results.masks is None and results.reuse is None and not results.has("masks")
    assert list(results.to_json()) == list(data)


def test_unknown_keys_are_kept_in_order():
    data = {"device": "cpu", "future": {"a": 1}, "verifiers": {"trained": 2, "reused": 0, "skipped": 1}}
    results = ReproductionResults.from_json(data)
    assert results.extra == {"future": {"a": 1}} and results.verifiers.extra == {"skipped": 1}
    assert list(results.to_json()) == ["device", "future", "verifiers"] and results.to_json() == data
    assert unmodelled_keys(results) == ["future", "verifiers.skipped"]


def test_a_summary_built_in_code_writes_its_set_fields():
    built = ReproductionResults(device="cuda", verifiers=FitCounts(trained=3), reuse=ReuseRecord(reused=[], redone=[]))
    assert built.to_json() == {
        "verifiers": {"trained": 3},
        "device": "cuda",
        "reuse": {"reused": [], "redone": []},
    }
    assert built.has("device") and not built.has("main")


def test_as_reproduction_results_reads_a_dict_and_keeps_a_typed_summary():
    typed = as_reproduction_results(_load("testbed-v2.json"))
    assert as_reproduction_results(typed) is typed
    assert [part.git_commit for part in typed.report_parts()] == [
        part.get("git_commit") for part in _load("testbed-v2.json")["parts"]
    ]


def test_legacy_parts_are_read_under_their_old_name():
    data = _load("plain-vote-start/testbed-v2.json")
    legacy = {(LEGACY_PARTS_KEY if key == "parts" else key): value for key, value in data.items()}
    results = ReproductionResults.from_json(legacy)
    assert len(results.report_parts()) == len(data["parts"])
    assert results.to_json() == data  # written back under today's name
