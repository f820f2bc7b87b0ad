"""The quick reproduction end to end (slow: a few minutes on 2 CPU cores; `make test-slow`).

Runs ``hf-msv reproduce --quick`` with the shipped testbed LM: collection, LM cost measurement, training of every
verifier, every study, and the report. Checks that the outputs exist and hang together, not what the numbers are
(the quick run's data is far too small for the paper's claims).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings

import pytest

from hf_msv.testbed import TESTBED_LM_DIR

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (TESTBED_LM_DIR / "config.json").exists(), reason="testbed LM not shipped"),
]


@pytest.mark.timeout(2400)  # two training seeds per verifier; ~20 min for main + checkers on 2 shared cores
def test_quick_reproduction(tmp_path):
    from hf_msv.reproduction import ReproductionResults
    from hf_msv.reproduction import main as run_main

    def reproduce_main(argv: list[str]) -> dict:
        """`hf-msv reproduce` with `argv`: its summary's JSON."""
        summary = run_main(argv)
        assert isinstance(summary, ReproductionResults)
        return summary.to_json()

    out, work = tmp_path / "results", tmp_path / "work"
    # two fits at a time in worker processes (--train-workers): every study must wait for its own fits
    summary = reproduce_main(
        ["--quick", "--output-dir", str(out), "--work-dir", str(work), "--no-progress", "--train-workers", "2"]
    )

    md, js = out / "testbed-v2-quick.md", out / "testbed-v2-quick.json"  # v2: the default testbed
    assert md.exists() and js.exists()
    data = json.loads(js.read_text())
    assert data == summary
    assert summary["config"]["quick"] and summary["config"]["num_sequences"] == [1, 4]
    assert summary["config"]["training_seeds"] == 2
    assert (work / "verifiers" / "msv4-terminal-seed1" / "training_log.json").exists()
    assert (work / "verifiers" / "msv4-terminal" / "reuse_key.json").exists()
    assert (work / "data" / "eval" / "reuse_key.json").exists()
    assert set(summary["studies"]) == {"main", "checkers", "masks", "delimiters", "grouping", "training_size"}

    # main study: MSV_N and every baseline, terminal and streaming, plus the early-stop fraction
    for n in ("1", "4"):
        main = summary["main"][n]
        assert main["msv"] == f"MSV_{n}"
        for method in ("Token Probs", "DeepConf", "Probe", "MSV_1", main["msv"]):
            for key in ("brier", "auroc", "bon_accuracy"):
                assert 0 <= main["terminal"][method][key]["mean"] <= 1
            for key in ("brier", "auroc"):
                assert 0 <= main["streaming"][method][key]["mean"] <= 1
        assert "early_stop_token_fraction" in main
    assert {"Self-consistency", "Probe+WV", "MSV_1+WV"} <= set(summary["main"]["4"]["terminal"])
    assert summary["main"]["4"]["lambda_selection"]["MSV_4"].keys() == {"validation", "ltt"}

    # studies
    assert set(summary["checkers"]["rows"]) == {"reference", "random"}
    assert summary["checkers"]["rows"]["reference"]["agreement"] == 1.0
    assert set(summary["masks"]["rows"]) == {"MSV_4", "w/o equivalence"}
    assert set(summary["delimiters"]["rows"]) == {"Wait", "every 40 tokens"}
    assert summary["grouping"]["per_n"]["8"]["msv"] == "MSV_4 (grouped)"
    # training-set size: 8 = a prefix of the main training split, 24 = it plus 8 problems collected for the study
    sizes = summary["training_size"]["per_size"]
    assert set(sizes) == {"8", "16", "24"}
    for k in ("8", "24"):
        log = json.loads((work / "verifiers" / f"size{k}-msv4-terminal" / "training_log.json").read_text())
        assert f"Training: {k} problems" in log["training_data"]
    assert 0 <= sizes["24"]["terminal"]["MSV_4"]["bon_accuracy"]["mean"] <= 1

    # claims are generated, each with a verdict sentence
    ids = {c["id"] for c in summary["claims"]}
    assert {
        "terminal_brier_N4",
        "best_of_4",
        "early_stop_N4",
        "checker_robustness",
        "masks",
        "delimiters",
        "grouping",
        "training_size_probe",
        "training_size_msv",
    } <= ids
    for c in summary["claims"]:
        assert re.match(r"^(Held|Did not hold|Not testable): ", c["sentence"])
        assert c["held"] in (True, False, None)

    # every figure the report references exists, every linked report exists
    text = md.read_text()
    for png in re.findall(r"\]\(([^)]+\.png)\)", text):
        assert (out / png).exists(), png
    for link in re.findall(r"\]\(([^)]+\.md)\)", text):
        assert (out / link).exists(), link
    assert (work / "lm_costs.json").exists()

    # resumable: a second run reuses the shards, verifiers and costs (no collection or training left to do)
    summary2 = reproduce_main(
        [
            "--quick",
            "--output-dir",
            str(tmp_path / "again"),
            "--work-dir",
            str(work),
            "--no-progress",
            "--studies",
            "main",
        ]
    )
    assert summary2["studies"] == ["main"]
    assert summary2["verifiers"]["trained"] == 0 and summary2["reuse"]["redone"] == []
    assert any(r.startswith("shards data/eval") for r in summary2["reuse"]["reused"])
    assert summary2["timing_s"]["collect"] < summary["timing_s"]["collect"]
    assert summary2["timing_s"]["train main"] < summary["timing_s"]["train main"]
    # ... and the main study's evaluation: same results, its report and figures put into the new output directory
    assert "evaluation testbed-v2-quick-main (same settings, data and code)" in summary2["reuse"]["reused"]
    assert summary2["main"] == summary["main"]
    again = (tmp_path / "again" / "testbed-v2-quick.md").read_text()
    for linked in re.findall(r"\]\(([^)]+\.(?:png|md))\)", again):
        assert (tmp_path / "again" / linked).exists(), linked

    # a new part in an empty work directory (--continue-report) runs a study the report lacks: it re-makes the main
    # collection, which is the first part's data (same fingerprints), and the main fit the study needs, and keeps
    # everything else the report holds
    later, fresh = tmp_path / "later", tmp_path / "fresh-work"
    later.mkdir()
    shutil.copy(out / "testbed-v2-quick-main.json", later)
    lacking = {k: v for k, v in summary.items() if k != "masks"}
    lacking["parts"] = [dict(x, studies=[k for k in x["studies"] if k != "masks"]) for x in summary["parts"]]
    (later / "testbed-v2-quick.json").write_text(json.dumps(lacking))
    continued = reproduce_main(
        [
            "--quick",
            "--output-dir",
            str(later),
            "--work-dir",
            str(fresh),
            "--no-progress",
            "--continue-report",
            "--studies",
            "masks",
            "delimiters",
        ]
    )
    made = continued["parts"][1]
    assert made["collections"] == summary["parts"][0]["collections"]  # deterministic on one machine
    assert "collections_differ_from_main" not in made
    assert sorted(p.name for p in (fresh / "verifiers").iterdir()) == [
        "msv4-streaming",
        "msv4-streaming-no-equivalence",
        "msv4-streaming-no-equivalence-seed1",
        "msv4-streaming-seed1",
    ]  # only what the mask study needs; the delimiter study was kept, not re-run
    assert set(continued["masks"]["rows"]) == {"MSV_4", "w/o equivalence"}
    for kept in ("main", "checkers", "delimiters", "grouping", "training_size"):
        assert continued[kept] == summary[kept], kept
    assert [x["studies"] for x in continued["parts"]] == [
        ["main", "checkers", "delimiters", "grouping", "training_size"],
        ["masks"],
    ]
    assert "in 2 parts (each part after the first continued" in (later / "testbed-v2-quick.md").read_text()

    # the shipped verifier's recipe on the same shards: collection is reused, the card and weights are written
    from hf_msv import MSVVerifier
    from hf_msv.reproduction import ReproduceConfig, train_shipped_verifier

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shipped = train_shipped_verifier(work, tmp_path / "shipped", config=ReproduceConfig.quick_config())
    assert not [w for w in caught if "no LM decode/elicitation costs" in str(w.message)]  # λ is chosen on tokens
    verifier = MSVVerifier.from_pretrained(shipped)
    assert (verifier.config.num_sequences, verifier.config.mode) == (8, "streaming")
    assert "validation auroc" in (shipped / "README.md").read_text()
    # its stopping rule: fitted on validation by the one λ function, recorded beside it, in its config and card
    from hf_msv.lambda_rule import LAMBDAS, LambdaChoice
    from hf_msv.reproduction import SHIPPED_LAMBDA_FILE

    stopping = json.loads((shipped / SHIPPED_LAMBDA_FILE).read_text())
    choice = LambdaChoice.from_dict(stopping["choice"])
    assert choice.lam in list(LAMBDAS) and stopping["num_sequences"] == 8
    # the quick split certifies nothing: the verifier decodes in full by default (λ = ∞), never the target's λ
    assert choice.rule == "guarantee" and not stopping["guarantee"]["reached"] and choice.lam == float("inf")
    assert 0 <= choice.accuracy <= 1 and stopping["rule"] == choice.describe()
    assert verifier.config.early_stopping["lambda"] == stopping["choice"]
    card = (shipped / "README.md").read_text()
    assert "Early stopping (calibration problems held out from the stop head's):" in card
    assert not list(shipped.glob("*.py"))
    assert (work / "verifiers" / "msv8-streaming" / "training_log.json").exists()
