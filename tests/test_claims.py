"""The reproduction's claims (`hf_msv.reproduction.claims`) on the committed ``docs/results/testbed.json``.

The verdicts printed in testbed.md and the README come from `compute_claims`: recomputing them from the committed
summary must give the committed claims, and each verdict must flip when its number crosses the target.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest

from hf_msv.reproduction import PAPER, ReproduceConfig, compute_claims
from hf_msv.reproduction.claims import config_of, make_claim

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((RESULTS / "testbed.json").read_text())


@pytest.fixture
def summary(committed) -> dict:
    """A copy of the committed summary a test may edit."""
    return copy.deepcopy(committed)


@pytest.fixture
def point_summary(summary) -> dict:
    """The committed summary without intervals and early-stop comparisons: verdicts on point estimates, as for
    summaries written before the training-seed protocol (the interval verdicts are tested on an evaluation's
    results in test_evaluation.py::test_claims_from_an_evaluation_with_intervals)."""
    for r in (v for v in summary["main"].values() if isinstance(v, dict)):
        r.pop("intervals", None)
        r.pop("early_stop_comparisons", None)
    return summary


def _claim(summary: dict, cid: str) -> dict:
    return next(c for c in compute_claims(summary) if c["id"] == cid)


def _held(summary: dict, cid: str):
    return _claim(summary, cid)["held"]


def _set_mean(stat: dict, value: float) -> None:
    stat["mean"] = value


# ----------------------------------------------------------------------------------------------------------------
# The committed claims
# ----------------------------------------------------------------------------------------------------------------


def test_claims_recomputed_from_the_committed_summary_equal_the_committed_ones(committed):
    claims = json.loads(json.dumps(compute_claims(committed)))  # through JSON, as the summary was written
    assert claims == committed["claims"]
    # the config stored in the summary is the one the claims were computed with
    explicit = json.loads(json.dumps(compute_claims(committed, config_of(committed))))
    assert explicit == committed["claims"]
    # the committed run is at the paper's sizes, with the training-set-size study at 112 and 224 problems only (and
    # problems batched by 4, the default then)
    assert config_of(committed) == ReproduceConfig(task="v1", training_sizes=(112, 224), problems_per_batch=4)


@pytest.mark.parametrize("report", ["testbed-v2", "plain-vote-start/testbed-v2"])
def test_claims_recomputed_from_each_committed_v2_summary_equal_its_claims(report):
    """The v2 summaries (one of them written in several parts) recompute to the claims they record."""
    summary = json.loads((RESULTS / f"{report}.json").read_text())
    assert json.loads(json.dumps(compute_claims(summary))) == summary["claims"]


def test_every_claim_has_a_verdict_sentence(committed):
    claims = compute_claims(committed)
    assert len({c["id"] for c in claims}) == len(claims)
    for c in claims:
        verdict = {True: "Held", False: "Did not hold", None: "Not testable"}[c["held"]]
        assert c["sentence"].startswith(f"{verdict}: ")
        assert c["claim"] and c["paper"]


def test_make_claim_verdicts():
    assert make_claim("x", "t", "p", True, "s.", a=1) == {
        "id": "x",
        "claim": "t",
        "paper": "p",
        "held": True,
        "sentence": "Held: s.",
        "numbers": {"a": 1},
    }
    assert make_claim("x", "t", "p", False, "s.")["sentence"] == "Did not hold: s."
    assert make_claim("x", "t", "p", None, "s.")["sentence"] == "Not testable: s."


def test_studies_not_run_have_no_claims(summary):
    ids = [c["id"] for c in compute_claims(summary)]
    for study in ("checkers", "masks", "delimiters", "grouping", "training_size"):
        del summary[study]
    main_only = [c["id"] for c in compute_claims(summary)]
    assert main_only == ids[: len(main_only)]
    assert main_only == [
        "terminal_brier_N16",
        "terminal_brier_N64",
        "terminal_brier_vs_votes_N16",
        "terminal_brier_vs_votes_N64",
        "best_of_64",
        "early_stop_N16",
        "early_stop_all_N16",
        "early_stop_N64",
        "early_stop_all_N64",
        "streaming_brier_N4",
        "streaming_brier_N16",
        "streaming_brier_N64",
        "bon_ece_N16",
        "bon_ece_N64",
    ]


# ----------------------------------------------------------------------------------------------------------------
# Each verdict flips when its number crosses the target
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", ["16", "64"])
def test_c1_terminal_brier_needs_20_percent_lower(point_summary, n):
    best = _claim(point_summary, f"terminal_brier_N{n}")["numbers"]["best_baseline_value"]
    stat = point_summary["main"][n]["terminal"][f"MSV_{n}"]["brier"]
    _set_mean(stat, 0.79 * best)
    assert _held(point_summary, f"terminal_brier_N{n}") is True
    _set_mean(stat, 0.81 * best)
    claim = _claim(point_summary, f"terminal_brier_N{n}")
    assert claim["held"] is False and "19% lower" in claim["sentence"]
    _set_mean(stat, 1.1 * best)
    assert "10% higher" in _claim(point_summary, f"terminal_brier_N{n}")["sentence"]
    stat["mean"] = None  # no number: not testable
    assert _held(point_summary, f"terminal_brier_N{n}") is None


def test_c2_best_of_n_needs_2pp(point_summary):
    best = _claim(point_summary, "best_of_64")["numbers"]["best_baseline_value"]
    stat = point_summary["main"]["64"]["terminal"]["MSV_64"]["bon_accuracy"]
    _set_mean(stat, best + 0.021)
    assert _held(point_summary, "best_of_64") is True
    _set_mean(stat, best + 0.019)
    assert _held(point_summary, "best_of_64") is False


def test_c2_compares_against_every_other_method(point_summary):
    """Raising any baseline's best-of-N above MSV_64's changes the comparison to that baseline."""
    term = point_summary["main"]["64"]["terminal"]
    _set_mean(term["MSV_64"]["bon_accuracy"], 0.95)
    assert _held(point_summary, "best_of_64") is True
    _set_mean(term["Self-consistency"]["bon_accuracy"], 0.94)
    claim = _claim(point_summary, "best_of_64")
    assert claim["held"] is False and claim["numbers"]["best_baseline"] == "Self-consistency"


@pytest.mark.parametrize("n", ["16", "64"])
def test_c3_early_stop_needs_040_of_the_tokens(point_summary, n):
    r = point_summary["main"][n]
    r["early_stop_token_fraction"] = 0.39
    assert _held(point_summary, f"early_stop_N{n}") is True
    r["early_stop_token_fraction"] = 0.41
    assert _held(point_summary, f"early_stop_N{n}") is False
    r["early_stop_token_fraction"] = None  # never reaches the baseline's peak
    claim = _claim(point_summary, f"early_stop_N{n}")
    assert claim["held"] is False and "fraction ∞" in claim["sentence"]
    r["early_stop_best_baseline"] = None  # no baseline to compare with
    assert _held(point_summary, f"early_stop_N{n}") is None


@pytest.mark.parametrize("n", ["4", "16", "64"])
def test_c4_streaming_brier_below_every_single_sequence_baseline(point_summary, n):
    claim = _claim(point_summary, f"streaming_brier_N{n}")
    assert claim["held"] is True
    base = claim["numbers"]["best_baseline"]
    _set_mean(point_summary["main"][n]["streaming"][base]["brier"], 0.9 * claim["numbers"]["msv"])
    assert _held(point_summary, f"streaming_brier_N{n}") is False


def test_c1_compares_with_single_sequence_verifiers_only(point_summary):
    """C1 is against the single-sequence verifiers: a better terminal Brier of a multi-sequence baseline
    (self-consistency, weighted voting) does not decide it; one of a single-sequence verifier does."""
    term = point_summary["main"]["16"]["terminal"]
    for m in ("Self-consistency", "Probe+WV"):
        _set_mean(term[m]["brier"], 0.0)
    assert _held(point_summary, "terminal_brier_N16") is True
    _set_mean(term["Probe"]["brier"], term["MSV_16"]["brier"]["mean"])
    claim = _claim(point_summary, "terminal_brier_N16")
    assert claim["held"] is False and claim["numbers"]["best_baseline"] == "Probe"


@pytest.mark.parametrize("n", ["16", "64"])
def test_c5_best_of_n_ece_below_every_baseline(point_summary, n):
    _set_mean(point_summary["main"][n]["terminal"][f"MSV_{n}"]["bon_ece"], 0.001)
    claim = _claim(point_summary, f"bon_ece_N{n}")
    assert claim["held"] is True
    _set_mean(point_summary["main"][n]["terminal"]["Self-consistency"]["bon_ece"], 0.5 * claim["numbers"]["msv"])
    claim = _claim(point_summary, f"bon_ece_N{n}")
    assert claim["held"] is False and claim["numbers"]["best_baseline"] == "Self-consistency"


def test_checker_robustness_needs_at_most_12pp_drop(summary):
    rows = summary["checkers"]["rows"]
    key = "MSV_64 (trained with checker)"
    ref = rows["reference"][key]["mean"]
    for c in ("exact", "jaccard", "embedding", "random"):
        _set_mean(rows[c][key], ref - 0.011)
    assert _held(summary, "checker_robustness") is True
    _set_mean(rows["embedding"][key], ref - 0.013)
    claim = _claim(summary, "checker_robustness")
    assert claim["held"] is False and "(embedding)" in claim["sentence"]


def test_no_weak_checker_is_not_testable(summary):
    rows = summary["checkers"]["rows"]
    summary["checkers"]["rows"] = {"reference": rows["reference"]}
    claim = _claim(summary, "checker_robustness")
    assert claim["held"] is None and claim["sentence"] == "Not testable: no weak checker"


def test_logit_averaging_claim(summary):
    without = summary["checkers"]["rows"]["reference"]["MSV_64 (trained with checker)"]["mean"]
    stat = summary["main"]["64"]["terminal"]["MSV_64"]["bon_accuracy"]
    _set_mean(stat, without + 0.001)
    assert _held(summary, "best_of_logit_averaging") is True
    _set_mean(stat, without)
    assert _held(summary, "best_of_logit_averaging") is False


def test_random_checker_against_probe_wv(summary):
    rows = summary["checkers"]["rows"]
    key = "MSV_64 (trained with checker)"
    wv_drop = rows["reference"]["Probe+WV"]["mean"] - rows["random"]["Probe+WV"]["mean"]
    _set_mean(rows["random"][key], rows["reference"][key]["mean"] - 0.5 * wv_drop)
    assert _held(summary, "checker_random_vs_wv") is True
    _set_mean(rows["random"][key], rows["reference"][key]["mean"] - 1.5 * wv_drop)
    assert _held(summary, "checker_random_vs_wv") is False
    del rows["random"]
    assert "checker_random_vs_wv" not in {c["id"] for c in compute_claims(summary)}


def test_masks_every_removal_must_raise_the_brier(summary):
    rows = summary["masks"]["rows"]
    full = rows["MSV_16"]["brier"]["mean"]
    for k in rows:
        if k != "MSV_16":
            _set_mean(rows[k]["brier"], full + 0.001)
    assert _held(summary, "masks") is True
    _set_mean(rows["w/o within_answer"]["brier"], full)  # no increase
    assert _held(summary, "masks") is False


def test_delimiters_msv_above_probe_in_every_row(summary):
    rows = summary["delimiters"]["rows"]
    for r in rows.values():  # the normalised AUTC over t* (in [0, 1])
        _set_mean(r["MSV_N"]["autc_steps_norm"], r["Probe"]["autc_steps_norm"]["mean"] + 0.01)
    assert _held(summary, "delimiters") is True
    r = rows["every 40 tokens"]
    _set_mean(r["MSV_N"]["autc_steps_norm"], r["Probe"]["autc_steps_norm"]["mean"] - 0.01)
    assert _held(summary, "delimiters") is False


def test_grouping_msv_matches_the_best_baseline_above_m(summary):
    per_n = summary["grouping"]["per_n"]
    assert _held(summary, "grouping") is True
    r = per_n["256"]
    best = max(r["autc_latency_norm"][m]["mean"] for m in r["autc_latency_norm"] if m != r["msv"])
    _set_mean(r["autc_latency_norm"][r["msv"]], best - 0.001)
    assert _held(summary, "grouping") is False
    # N = 64 = M is not "large N": it does not enter the verdict
    r64 = per_n["64"]
    _set_mean(r64["autc_latency_norm"][r64["msv"]], 0.0)
    _set_mean(r["autc_latency_norm"][r["msv"]], best)
    assert _held(summary, "grouping") is True


def test_grouping_cost_per_answer_at_most_doubles(summary):
    per_n = summary["grouping"]["per_n"]
    small = per_n["64"]["verifier_online_s_per_answer"]["MSV_64"]
    per_n["256"]["verifier_online_s_per_answer"]["MSV_64 (grouped)"] = 1.9 * small
    assert _held(summary, "grouping_linear") is True
    per_n["256"]["verifier_online_s_per_answer"]["MSV_64 (grouped)"] = 2.1 * small
    claim = _claim(summary, "grouping_linear")
    assert claim["held"] is False and math.isclose(claim["numbers"]["ratio"], 2.1)


def _sizes(summary) -> tuple[str, str]:
    """The second-largest and the largest training-set size of the committed study."""
    sizes = sorted(summary["training_size"]["per_size"], key=int)
    return sizes[-2], sizes[-1]


def test_training_size_probe_plateau(summary):
    per = summary["training_size"]["per_size"]
    base, top = _sizes(summary)
    b0 = per[base]["terminal"]["Probe"]["brier"]["mean"]
    _set_mean(per[top]["terminal"]["Probe"]["brier"], 0.96 * b0)
    assert _held(summary, "training_size_probe") is True
    _set_mean(per[top]["terminal"]["Probe"]["brier"], 0.94 * b0)
    assert _held(summary, "training_size_probe") is False


def test_training_size_msv_targets(summary):
    _, top_k = _sizes(summary)
    top = summary["training_size"]["per_size"][top_k]
    top["bon_gain"], top["early_stop_token_fraction"] = 0.021, 0.39
    assert _held(summary, "training_size_msv") is True
    top["bon_gain"] = 0.019
    assert _held(summary, "training_size_msv") is False
    top["bon_gain"], top["early_stop_token_fraction"] = 0.021, None
    claim = _claim(summary, "training_size_msv")
    assert claim["held"] is False and re.search(rf"{top_k} problems: .* token fraction ∞", claim["sentence"])


def test_training_size_claims_need_two_sizes(summary):
    per = summary["training_size"]["per_size"]
    for k in _sizes(summary)[1:] + tuple(sorted(per, key=int)[:-2]):
        del per[k]
    assert len(per) == 1
    ids = {c["id"] for c in compute_claims(summary)}
    assert not {"training_size_probe", "training_size_msv"} & ids


def test_paper_targets_in_the_claims(committed):
    """The paper column quotes `PAPER` (C1 at N=16: 30 % lower than the best single-sequence verifier)."""
    c1 = _claim(committed, "terminal_brier_N16")
    assert c1["paper"] == (
        f"AIME: MSV_N {PAPER['terminal']['16']['MSV_N']['brier']} vs best single-sequence "
        f"{PAPER['terminal']['1']['MSV_1']['brier']} (30% lower)"
    )
    assert _claim(committed, "early_stop_N64")["paper"] == PAPER["early_stop"]["token_fraction_statement"]
