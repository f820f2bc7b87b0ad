"""Tests of hf_msv.evaluation: a tiny synthetic shard set whose correctness is visible in the hidden states, tiny
verifiers trained for a few steps, and `evaluate_study` end to end — outputs exist and agree with each other and with
`hf_msv.baselines` / `hf_msv.metrics` / `hf_msv.evaluation.early_stop` computed directly on the same groups."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from transformers import HfArgumentParser

from helpers.evaluation import write_split
from hf_msv.baselines import self_consistency, streaming_weighted_voting, weighted_voting
from hf_msv.data import VERIFIER_INPUTS, ShardDataset, collate_groups
from hf_msv.evaluation import (
    EvaluateConfig,
    answer_group,
    draw_sequences,
    evaluate_study,
    evaluation_groups,
    lm_costs_from_info,
    load_split,
    load_verifier,
    measure_verifier_cost,
    parse_verifier_specs,
    score_problems,
    select_answers,
    token_prob_scores,
)
from hf_msv.evaluation.early_stop import LatencyCosts, tradeoff_curve
from hf_msv.evaluation.results import StudyResults
from hf_msv.metrics import best_of_n_metrics, calibration_metrics
from hf_msv.training import MSVTrainingConfig, train_verifier

NS = [1, 4, 8]
SEEDS = 2  # training seeds of MSV_4 (the other verifiers have one checkpoint, shared by both)
WV_R = 4


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluation")
    train = write_split(root / "train", 24, seed=1)
    val = write_split(root / "val", 10, seed=2)
    ev = write_split(root / "eval", 16, seed=3)
    verifiers: dict = {}
    for name, kind, n, mode in [
        ("Probe", "probe", 1, "streaming"),
        ("Probe", "probe", 1, "terminal"),
        ("MSV_1", "msv", 1, "streaming"),
        ("MSV_4", "msv", 4, "streaming"),
        ("MSV_4", "msv", 4, "terminal"),
    ]:
        out = root / f"{name}-{mode}"
        train_verifier(
            train,
            val,
            out,
            MSVTrainingConfig(
                kind=kind,
                num_sequences=n,
                mode=mode,
                batch_size=8,
                num_epochs=1,
                learning_rate=3e-3,
                probe_learning_rate=1e-2,
                architecture={"intermediate_size": 32},
                probe_hidden_size=32,
                progress=False,
            ),
        )
        verifiers.setdefault(name, {})[mode] = str(out)
    seed1 = {}
    for mode in ("streaming", "terminal"):  # a second training seed of MSV_4
        seed1[mode] = str(root / f"MSV_4-{mode}-seed1")
        train_verifier(
            train,
            val,
            seed1[mode],
            MSVTrainingConfig(
                kind="msv",
                num_sequences=4,
                mode=mode,
                batch_size=8,
                num_epochs=1,
                learning_rate=3e-3,
                architecture={"intermediate_size": 32},
                progress=False,
                seed=1,
            ),
        )
    out = root / "report"
    config = EvaluateConfig(
        eval_dir=str(ev),
        output_dir=str(out),
        val_dir=str(val),
        num_sequences=NS,
        wv_threshold=WV_R,
        deepconf_window=8,
        progress=False,
        bootstrap=200,
    )
    typed = evaluate_study(
        config, dict(verifiers, MSV_4=[verifiers["MSV_4"], seed1]), lm_costs=LatencyCosts(0.01, 0.002)
    )
    assert isinstance(typed, StudyResults)
    results = typed.to_dict()  # the tests below read the JSON's keys
    return {
        "root": root,
        "eval": ev,
        "val": val,
        "verifiers": verifiers,
        "seed1": seed1,
        "out": out,
        "results": results,
    }


# ----------------------------------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------------------------------


def test_outputs_exist_and_markdown_references_every_png(study):
    out, results = study["out"], study["results"]
    assert (out / "report.md").exists() and (out / "report.json").exists()
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == results
    assert list(on_disk) == [  # report order, as the committed results
        "title",
        "config",
        "data",
        "costs",
        "methods",
        "terminal",
        "streaming",
        "early_stop",
        "lambda_selection",
        "stop_reliability",
        "intervals",
        "brier_by_position",
        "by_difficulty",
        "figures",
    ]
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs, "no figures written"
    assert sorted(f["file"] for f in results["figures"]) == pngs
    markdown = (out / "report.md").read_text()
    referenced = set(re.findall(r"\]\(([^)]+\.png)\)", markdown))
    assert referenced == set(pngs)
    for kind in ("reliability_answers", "reliability_bon", "best_of_n", "tradeoff", "brier_position"):
        assert any(kind in p for p in pngs), kind


def test_json_keys_methods_and_ranges(study):
    r = study["results"]
    for n in NS:
        key = str(n)
        term, stream = r["terminal"][key], r["streaming"][key]
        expected = {"Token Probs", "DeepConf", "Probe", "MSV_1"}
        if n > 1:
            expected |= {"Self-consistency", "Probe+WV", "MSV_1+WV", "Token Probs+WV", "DeepConf+WV"}
        assert expected <= set(term)
        assert "Self-consistency" not in stream
        assert r["methods"][key]["msv"] == {1: "MSV_1", 4: "MSV_4", 8: "MSV_4 (grouped)"}[n]
        assert r["methods"][key]["msv"] in term and r["methods"][key]["msv"] in stream
        for table in (term, stream):
            for method, metrics in table.items():
                for name in ("auroc", "brier", "ece", "bon_accuracy", "bon_ece", "bon_brier"):
                    values = [v for v in metrics[name]["values"] if v is not None]
                    assert len(metrics[name]["values"]) == SEEDS
                    assert all(0.0 <= v <= 1.0 for v in values), (method, name, values)
                assert all(v >= 0 for v in metrics["nll"]["values"] if v is not None)
        for method, metrics in stream.items():
            for name in ("autc_tokens_norm", "autc_latency_norm", "full_accuracy", "peak_accuracy"):
                assert all(0.0 <= v <= 1.0 for v in metrics[name]["values"]), (method, name)
            assert metrics["peak_accuracy"]["mean"] >= metrics["full_accuracy"]["mean"] - 1e-12
        es = r["early_stop"][key]
        assert set(es["curves"]) == set(stream)
        assert es["msv"] == r["methods"][key]["msv"] and es["best_baseline"] in stream
        assert es["best_baseline"] != es["msv"]
        if n > 1:  # the field's stopping rules are streaming methods, replayed with the others
            assert {"Consensus (k of N)", "Adaptive-Consistency", "Probe stability (last 3 agree)"} <= set(stream)
            # the streaming MSVs were trained with `train_verifier`, which saves their stop head: it is reported
            # as its own method and is the budgets' reference
            assert es["msv"] + " + stop head" in stream
            b = es["budgets"]
            assert b["reference"] == es["msv"] + " + stop head" and set(b["interpolated"]) == set(stream)
            assert set(b["validation_chosen"]) == set(stream)
            for m, budgets in b["validation_chosen"].items():  # λ chosen per training seed on validation
                for chosen, hull in zip(budgets, b["interpolated"][m]):
                    assert len(chosen["lambda"]["values"]) == SEEDS
                    assert all(
                        0.0 <= v <= 1.0 for v in chosen["eval_accuracy"]["values"] + chosen["eval_fraction"]["values"]
                    )
                    assert (chosen["interval"] is None) == (m == b["reference"])
                    assert 0.0 <= hull["accuracy"] <= 1.0 and (hull["interval"] is None) == (m == b["reference"])
            assert b["full_decoding_target"]["baseline"] in stream
        lam = r["lambda_selection"][key]
        assert set(lam) == set(stream)
        for rules in lam.values():
            assert set(rules) == {"validation", "ltt"}
            for rule in rules.values():
                assert all(0.0 <= v <= 1.0 for v in rule["eval_accuracy"]["values"])
                assert all(v > 0 for v in rule["eval_tokens"]["values"])
                stopped = [v for v in rule["stop_rate"]["values"]]
                assert all(0.0 <= v <= 1.0 for v in stopped)
                for name in ("stop_accuracy", "stop_confidence", "stop_ece"):
                    values = rule[name]["values"]
                    assert all((v is None) == (s == 0) for v, s in zip(values, stopped)), (name, values, stopped)
                    assert all(0.0 <= v <= 1.0 for v in values if v is not None)
        assert len(r["brier_by_position"][key]["edges"]) == 9
    assert r["costs"]["lm"]["4"] == {"decode_step_s": 0.01, "elicit_s": 0.002, "verify_s": 0.0}
    online = r["costs"]["verifier_online_s_per_answer"]["4"]
    assert set(online) == {"Probe", "MSV_1", "MSV_4"} and all(v > 0 for v in online.values())
    assert set(r["costs"]["verifier_online_s_per_answer"]["8"]) == {"Probe", "MSV_1", "MSV_4 (grouped)"}


def test_stop_time_reliability_pools_the_stops_of_every_seed(study):
    results = study["results"]
    markdown = (study["out"] / "report.md").read_text()
    assert any(f["file"].startswith("report_stop_reliability_N") for f in results["figures"])
    checked = 0
    for key, per_method in results["stop_reliability"].items():
        reference = results["methods"][key]["msv"] + (" + stop head" if int(key) > 1 else "")
        assert reference in per_method and f"Reliability at the stop, {reference}, N = {key}" in markdown
        for method, rules in per_method.items():
            for rule, bins in rules.items():
                record = results["lambda_selection"][key][method][rule]
                rates = np.array(record["stop_rate"]["values"], dtype=float)
                counts = np.array(bins["count"])
                if not counts.size:
                    assert not rates.any()
                    continue
                assert all(c > 0 for c in counts) and all(0 <= a <= 1 for a in bins["accuracy"])
                # each bin's mean confidence lies in its tenth, bins ascending
                lows = [min(int(c * 10), 9) for c in bins["confidence"]]
                assert lows == sorted(set(lows))
                # pooled over seeds, the bins give back each seed's accuracy at the stop, weighted by its stops
                accs = np.array([np.nan if v is None else v for v in record["stop_accuracy"]["values"]])
                pooled = np.nansum(rates * accs) / rates.sum()
                assert math.isclose((counts * np.array(bins["accuracy"])).sum() / counts.sum(), pooled, rel_tol=1e-9)
                checked += 1
    assert checked


# ----------------------------------------------------------------------------------------------------------------
# Agreement with the building blocks on the same groups
# ----------------------------------------------------------------------------------------------------------------


def _groups(problems, n, setting, scores=None):
    """Every evaluation group at N (the fixed partition, problem-major), as `evaluate_study` builds them."""
    return [
        answer_group(p, seqs, setting, None if scores is None else {k: v[i] for k, v in scores.items()})
        for i, p in enumerate(problems)
        for seqs in evaluation_groups(8, n, i)
    ]


def _close(a, b):
    return (a is None and (b is None or math.isnan(b))) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_self_consistency_and_weighted_voting_match_baselines(study):
    import warnings

    problems, _ = load_split(study["eval"])
    probe_t = load_verifier(study["verifiers"]["Probe"]["terminal"])
    probe_s = load_verifier(study["verifiers"]["Probe"]["streaming"])
    probe_term, _, _ = score_problems(probe_t, problems, mode="terminal")
    probe_stream, _, _ = score_problems(probe_s, problems, mode="streaming")
    r = study["results"]
    for n in (4, 8):
        for seed in range(SEEDS):  # the Probe is shared by both training seeds: equal values
            groups = _groups(problems, n, "terminal", {"probe": probe_term})
            sc = [self_consistency(g.klass, g.is_terminal) for g in groups]
            wv = [weighted_voting(g.scores["probe"], g.klass, g.is_terminal) for g in groups]
            y = np.concatenate([g.correct for g in groups])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for name, scores in (("Self-consistency", sc), ("Probe+WV", wv)):
                    direct = calibration_metrics(np.concatenate(scores), y)
                    bon = best_of_n_metrics(groups, scores)
                    got = r["terminal"][str(n)][name]
                    for k, v in direct.items():
                        assert _close(got[k]["values"][seed], v), (n, seed, name, k)
                    for k, v in bon.items():
                        assert _close(got[f"bon_{k}"]["values"][seed], v), (n, seed, name, k)
            sgroups = _groups(problems, n, "streaming", {"probe": probe_stream})
            swv = [streaming_weighted_voting(g.scores["probe"], g.klass, g.end, R=WV_R) for g in sgroups]
            direct = calibration_metrics(np.concatenate(swv), np.concatenate([g.correct for g in sgroups]))
            for k, v in direct.items():
                assert _close(r["streaming"][str(n)]["Probe+WV"][k]["values"][seed], v), (n, seed, k)


def test_early_stop_curves_match_replay(study):
    problems, _ = load_split(study["eval"])
    costs = LatencyCosts(0.01, 0.002)
    r = study["results"]
    groups = _groups(problems, 4, "streaming")
    scores = [
        np.clip(np.nan_to_num(token_prob_scores(p), nan=0.5), 0, 1)[select_answers(p, s, "streaming")[0]]
        for i, p in enumerate(problems)
        for s in evaluation_groups(8, 4, i)
    ]
    curve = tradeoff_curve(groups, scores, costs=costs)
    got = r["early_stop"]["4"]["curves"]["Token Probs"]
    np.testing.assert_allclose(got["accuracy"], curve.accuracy)
    np.testing.assert_allclose(got["tokens"], curve.tokens)
    np.testing.assert_allclose(got["steps"], curve.steps)
    np.testing.assert_allclose(got["latency"], curve.latency)
    assert got["lambdas"][-1] is None  # ∞: full decoding


def test_msv_scores_match_the_training_collate_path(study):
    """Packing in `score_problems` gives the same probabilities as `collate_groups` (training/validation path)."""
    model = load_verifier(study["verifiers"]["MSV_4"]["streaming"])
    problems, _ = load_split(study["eval"])
    ds = ShardDataset(study["eval"], num_sequences=4, mode="streaming", seed=7)
    for item in range(3):
        p, chosen = ds.sequences_of(item)
        batch = collate_groups([ds[item]], "streaming")
        with torch.no_grad():
            expected = model(**{k: batch[k] for k in VERIFIER_INPUTS}).probabilities.numpy()
        scores, _, _ = score_problems(model, [problems[p]], [chosen], mode="streaming")
        rows, seq = select_answers(problems[p], chosen, "streaming")
        got = scores[0][rows]
        # collate orders answers by (end, sequence, step); match them up by those keys
        keys_got = list(zip(problems[p].answer_end[rows], seq, problems[p].answer_step[rows]))
        keys_exp = list(
            zip(batch["answer_end"].tolist(), batch["answer_sequence"].tolist(), batch["answer_step"].tolist())
        )
        order = [keys_got.index(k) for k in keys_exp]
        np.testing.assert_allclose(got[order], expected, rtol=1e-5, atol=1e-6)


def test_evaluation_groups_are_a_fixed_partition():
    groups = evaluation_groups(64, 16, 5)
    assert len(groups) == 4 and all(len(g) == 16 for g in groups)
    assert sorted(np.concatenate(groups).tolist()) == list(range(64))
    assert all(np.array_equal(a, b) for a, b in zip(groups, evaluation_groups(64, 16, 5)))
    assert len(evaluation_groups(10, 4, 0)) == 2  # ⌊S/N⌋ groups, the rest unused
    with pytest.raises(
        ValueError,
        match=r"N=8 but the validation split has only 4 sequences per problem: evaluate "
        r"at N <= 4 \(--num-sequences\), or collect that split with --num-samples 8",
    ):
        evaluation_groups(4, 8, 0, "validation")


def test_draw_sequences_are_seeded_subsets():
    a = draw_sequences(64, 16, 3, 5)
    assert len(set(a.tolist())) == 16 and a.max() < 64
    np.testing.assert_array_equal(a, draw_sequences(64, 16, 3, 5))
    assert not np.array_equal(a, draw_sequences(64, 16, 4, 5))
    with pytest.raises(ValueError, match="only 4 sequences were collected"):
        draw_sequences(4, 8, 0, 0)


def test_measure_verifier_cost_and_costs_from_info(study):
    problems, _ = load_split(study["eval"])
    model = load_verifier(study["verifiers"]["MSV_4"]["streaming"])
    seqs = [draw_sequences(p.num_sequences, 8, 0, i) for i, p in enumerate(problems)]
    assert measure_verifier_cost(model, problems, seqs, max_groups=2) > 0
    with pytest.raises(ValueError, match="streaming verifiers"):
        measure_verifier_cost(load_verifier(study["verifiers"]["MSV_4"]["terminal"]), problems, seqs)
    costs = lm_costs_from_info(
        {
            "latency": {
                "decode_step_s": 0.1,
                "elicit_s": 0.2,
                "by_num_sequences": {"16": {"decode_step_s": 0.3, "elicit_s": 0.4}},
            }
        }
    )
    assert costs[None] == LatencyCosts(0.1, 0.2) and costs[16] == LatencyCosts(0.3, 0.4)
    assert lm_costs_from_info({}) is None


def test_cli_and_checker_rederivation(study, tmp_path):
    problems_file = tmp_path / "problems.jsonl"
    problems_file.write_text(
        "".join(
            json.dumps({"id": f"eval/{i}", "question": "q", "gold": "1", "meta": {"level": i % 3}}) + "\n"
            for i in range(16)
        )
    )
    parser = HfArgumentParser(EvaluateConfig)
    specs = [
        f"Probe={study['verifiers']['Probe']['terminal']}",
        f"Probe={study['verifiers']['Probe']['streaming']}",
        f"MSV_4={study['verifiers']['MSV_4']['streaming']}",
    ]
    assert set(parse_verifier_specs(specs)["Probe"]) == {"terminal", "streaming"}
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--eval-dir",
            str(study["eval"]),
            "--output-dir",
            str(tmp_path / "cli"),
            "--num-sequences",
            "4",
            "--bootstrap",
            "20",
            "--no-figures",
            "--no-progress",
            "--checker",
            "random",
            "--decode-step-s",
            "0.5",
            "--problems",
            str(problems_file),
            "--difficulty-field",
            "level",
            *(arg for s in specs for arg in ("--verifier", s)),
        ]
    )
    results = evaluate_study(args).to_dict()
    assert results["config"]["checker"] == "random"
    # per-difficulty breakdown from a problems file's metadata: buckets partition the problems and average back
    by = results["by_difficulty"]["4"]
    assert list(by) == ["0", "1", "2"] and sum(v["problems"] for v in by.values()) == 16
    overall = results["terminal"]["4"]["MSV_4"]["bon_accuracy"]["mean"]
    assert sum(v["problems"] * v["MSV_4"]["bon_accuracy"] for v in by.values()) / 16 == pytest.approx(overall)
    assert "## By level" in (tmp_path / "cli" / "report.md").read_text()
    assert results["costs"]["lm"]["4"]["decode_step_s"] == 0.5
    assert results["lambda_selection"] == {} and results["figures"] == []
    assert "stop_reliability" not in results  # no validation split: no λ rule ran
    assert "MSV_4" in results["terminal"]["4"] and "Probe+WV" in results["streaming"]["4"]
    # DeepConf falls back to 2-fold cross-fitting without validation; SC changes under the random checker.
    assert results["config"]["deepconf_calibration"].startswith("platt, 2-fold")
    sc_random = results["terminal"]["4"]["Self-consistency"]["brier"]["values"][0]
    assert sc_random != study["results"]["terminal"]["4"]["Self-consistency"]["brier"]["values"][0]
    assert (tmp_path / "cli" / "report.md").exists()


def _stored_order_scores(model, problem, sequences, mode, group_size):
    """The packing evaluation used before it went through `collate_groups`: the group's answers in stored order
    (τ, sequence, step), γ left to the verifier. Kept here as the reference the new path must reproduce."""
    from hf_msv.modeling_msv import split_into_groups

    rows, seq = select_answers(problem, sequences, mode)
    starts, lengths = problem.answer_token_start[rows], problem.answer_length[rows]
    token_rows = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))
    step = problem.answer_step[rows] if mode == "streaming" else np.zeros(len(rows), dtype=np.int64)
    long = lambda x: torch.from_numpy(np.asarray(x).astype(np.int64))
    group, sequence = torch.zeros(len(rows), dtype=torch.long), long(seq)
    if group_size is not None and int(sequence.max()) >= group_size:
        group, sequence = split_into_groups(group, sequence, group_size)
    with torch.no_grad():
        out = model(
            hidden_states=problem.hidden_states[long(token_rows)],
            token_answer=torch.repeat_interleave(torch.arange(len(rows)), long(lengths)),
            answer_group=group,
            answer_sequence=sequence,
            answer_step=long(step),
            answer_end=long(problem.answer_end[rows]),
            answer_class=long(problem.answer_class[rows]),
        )
    return rows, out.probabilities.float().numpy()


@pytest.mark.parametrize(
    "name,mode,n",
    [("MSV_4", "streaming", 4), ("MSV_4", "terminal", 4), ("MSV_4", "streaming", 8), ("Probe", "streaming", 8)],
)
def test_collate_path_scores_equal_the_old_stored_order_packing(study, name, mode, n):
    """Scoring now packs with `collate_groups` (answers by end time); the old evaluation packed in stored order.
    The verifier sorts tokens itself, so the scores agree to float precision, grouped MSV_M (N > M) included, and
    reading through `ShardDataset` gives exactly the scores of records read with their hidden states."""
    model = load_verifier(study["verifiers"][name][mode])
    problems, _ = load_split(study["eval"])
    dataset = ShardDataset(study["eval"])
    seqs = [draw_sequences(p.num_sequences, n, 1, i) for i, p in enumerate(problems)]
    scores, seconds, count = score_problems(model, dataset, seqs, mode=mode, max_tokens=64)  # several packed calls
    same, _, _ = score_problems(model, problems, seqs, mode=mode)
    group_size = None if name == "Probe" else 4
    for i, p in enumerate(problems):
        rows, expected = _stored_order_scores(model, p, seqs[i], mode, group_size)
        np.testing.assert_allclose(scores[i][rows], expected, rtol=1e-5, atol=1e-6)
        assert np.isnan(np.delete(scores[i], rows)).all()
        np.testing.assert_allclose(same[i], scores[i], rtol=1e-5, atol=1e-6)
    assert count == sum(len(select_answers(p, s, mode)[0]) for p, s in zip(problems, seqs)) and seconds > 0


def test_main_builds_flags_from_the_config(study, tmp_path, capsys):
    from hf_msv.evaluation import main

    typed = main(
        [
            "--eval-dir",
            str(study["eval"]),
            "--output-dir",
            str(tmp_path / "main"),
            "--num-sequences",
            "1",
            "--bootstrap",
            "0",
            "--no-figures",
            "--no-progress",
            "--verifier",
            f"Probe={study['verifiers']['Probe']['terminal']}",
            "--checker-kwargs",
            "{}",
        ]
    )
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["report"].endswith("main/report.md") and (tmp_path / "main" / "report.md").exists()
    assert typed.num_sequences == [1] and "Probe" in typed.terminal["1"]


def test_n_defaults_to_the_grid_the_samples_allow_and_too_large_n_is_a_clear_error(study, tmp_path):
    """A user who collected 16 samples per problem runs ``hf-msv evaluate`` without --num-sequences: N = 1, 4, 16,
    not an error about N = 64; asking for more than was collected names what can be asked for, before any work."""
    from hf_msv.evaluation import default_num_sequences, main

    assert default_num_sequences(64) == [1, 4, 16, 64] and default_num_sequences(16) == [1, 4, 16]
    assert default_num_sequences(8) == [1, 4, 8] and default_num_sequences(1) == [1]
    assert default_num_sequences(300) == [1, 4, 16, 64, 256, 300]
    flags = [
        "--eval-dir",
        str(study["eval"]),
        "--bootstrap",
        "0",
        "--no-figures",
        "--no-progress",
        "--verifier",
        f"Probe={study['verifiers']['Probe']['terminal']}",
    ]
    results = main(flags + ["--output-dir", str(tmp_path / "default")]).to_dict()
    assert results["config"]["num_sequences_list"] == [1, 4, 8]  # the fixture collected 8 sequences per problem
    assert set(results["terminal"]) == {"1", "4", "8"}
    with pytest.raises(ValueError, match=r"only 8 sequences: ask for N <= 8 \(e\.g\. --num-sequences 1 4 8"):
        main(flags + ["--output-dir", str(tmp_path / "too-many"), "--num-sequences", "16"])
    assert not (tmp_path / "too-many").exists()


def test_an_n_above_the_validation_split_names_it_and_what_to_do_before_any_work(study, tmp_path):
    """16 sequences per evaluation problem, 8 per validation problem, N = 16: the error names the validation split
    and its directory, says which N it allows and how to collect more, and leaves no output directory behind."""
    from hf_msv.evaluation import main

    ev16 = write_split(tmp_path / "eval16", 3, seed=5, num_sequences=16)
    out = tmp_path / "report"
    with pytest.raises(ValueError, match="has only 8 sequences per problem") as error:
        main(
            [
                "--eval-dir",
                str(ev16),
                "--val-dir",
                str(study["val"]),
                "--num-sequences",
                "1",
                "16",
                "--bootstrap",
                "0",
                "--no-figures",
                "--no-progress",
                "--output-dir",
                str(out),
            ]
        )
    message = str(error.value)
    assert f"the validation split ({study['val']}) has only 8 sequences per problem" in message
    assert "--num-sequences 1" in message and "--num-samples 16 or more" in message
    assert not out.exists()


@pytest.mark.parametrize("bad", ["missing", "empty", "file", "no-equals"])
def test_a_bad_verifier_is_a_clear_error_that_leaves_no_output_directory(study, tmp_path, bad):
    from hf_msv.evaluation import main

    target = tmp_path / "verifier"
    if bad == "empty":
        target.mkdir()
    elif bad == "file":
        target.write_text("{}")
    spec = str(target) if bad == "no-equals" else f"x={target}"
    expected = {
        "missing": (FileNotFoundError, "no such verifier directory"),
        "empty": (FileNotFoundError, "holds no config.json: not a verifier checkpoint"),
        "file": (NotADirectoryError, "a verifier is a directory"),
        "no-equals": (ValueError, "--verifier takes NAME=PATH"),
    }[bad]
    out = tmp_path / "report"
    with pytest.raises(expected[0], match=expected[1]) as error:
        main(["--eval-dir", str(study["eval"]), "--verifier", spec, "--output-dir", str(out), "--no-progress"])
    assert str(target) in str(error.value) and not out.exists()


def test_an_input_given_both_in_the_config_and_as_an_argument_is_refused(tmp_path):
    """The verifiers and LM costs come either in the `EvaluateConfig` (as the command line names them) or as
    `evaluate_study` arguments: both is an error before any work, not one of them silently ignored."""
    out = tmp_path / "report"
    config = EvaluateConfig(
        eval_dir=str(tmp_path / "eval"),
        output_dir=str(out),
        num_sequences=4,
        verifier=["Probe=verifiers/probe"],
        decode_step_s=0.1,
        figures=False,
    )
    assert config.num_sequences == [4]  # one N is a list of one
    with pytest.raises(ValueError, match=r"verifiers both as an argument and as EvaluateConfig\.verifier"):
        evaluate_study(config, {"Probe": "verifiers/probe"})
    with pytest.raises(ValueError, match="lm_costs both as an argument"):
        evaluate_study(config, lm_costs=LatencyCosts(0.1, 0.0))
    assert not out.exists()


def test_figures_without_matplotlib_fail_first_naming_the_extra(study, tmp_path, monkeypatch):
    """Figures need matplotlib, an optional extra: without it, one line naming the extra before any work (no output
    directory); ``--no-figures`` still evaluates."""
    import importlib.util

    from hf_msv.evaluation import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    flags = ["--eval-dir", str(study["eval"]), "--num-sequences", "1", "--bootstrap", "0", "--no-progress"]
    with pytest.raises(ModuleNotFoundError, match=r'pip install "hf-msv\[report\]" \(or pass --no-figures') as error:
        main(flags + ["--output-dir", str(tmp_path / "figures")])
    assert "\n" not in str(error.value) and not (tmp_path / "figures").exists()
    assert main(flags + ["--no-figures", "--output-dir", str(tmp_path / "plain")]).figures == []


def test_training_seeds_new_baselines_and_intervals(study):
    r = study["results"]
    assert r["config"]["training_seeds"] == SEEDS and r["config"]["stacked_probe"] == "Probe"
    for n in (4, 8):
        term, stream = r["terminal"][str(n)], r["streaming"][str(n)]
        assert {"Self-consistency (calibrated)", "Stacked (vote + Probe)"} <= set(term)
        assert {"Latest-answer vote", "Latest-answer vote (calibrated)", "Stacked (vote + Probe)"} <= set(stream)
        msv = r["methods"][str(n)]["msv"]
        # MSV_4 has two training seeds: its values differ; the Probe's (one checkpoint) do not
        assert len(set(term[msv]["brier"]["values"])) == 2
        assert len(set(term["Probe"]["brier"]["values"])) == 1 and term["Probe"]["brier"]["std"] == 0
        # intervals: MSV − every other method, the estimate equals the seed-mean difference of pooled Brier
        iv = r["intervals"][str(n)]["terminal"]
        assert set(iv) == set(term) - {msv}
        est = iv["Probe"]["brier"]
        assert est["estimate"] == pytest.approx(term[msv]["brier"]["mean"] - term["Probe"]["brier"]["mean"])
        assert est["low"] <= est["estimate"] <= est["high"]
        assert iv["Self-consistency"]["bon_accuracy"]["estimate"] == pytest.approx(
            term[msv]["bon_accuracy"]["mean"] - term["Self-consistency"]["bon_accuracy"]["mean"]
        )
        es = r["early_stop"][str(n)]["comparisons"]
        assert es["single_sequence"]["baseline"] in r["methods"][str(n)]["single_sequence"]
        assert es["all"]["baseline_peak_accuracy"] >= es["single_sequence"]["baseline_peak_accuracy"]
        for comp in es.values():
            for axis in ("steps", "tokens", "latency"):
                assert len(comp[axis]["per_seed"]) == SEEDS and comp[axis]["interval"]["n_boot"] == 200
        for metrics in stream.values():
            assert 0 <= metrics["autc_steps_norm"]["mean"] <= 1
    # calibrated SC on the same groups is Platt-scaled SC: same ranking (AUROC) whatever the fitted slope sign
    t4 = r["terminal"]["4"]
    assert t4["Self-consistency (calibrated)"]["auroc"]["mean"] == pytest.approx(
        t4["Self-consistency"]["auroc"]["mean"]
    ) or t4["Self-consistency (calibrated)"]["auroc"]["mean"] == pytest.approx(
        1 - t4["Self-consistency"]["auroc"]["mean"]
    )
    md = (study["out"] / "report.md").read_text()
    assert "the best single-sequence baseline (the paper's comparison)" in md and "Δ Brier" in md


def test_verifier_specs_with_training_seeds(study):
    v, s1 = study["verifiers"]["MSV_4"], study["seed1"]
    specs = [
        f"MSV_4={v['terminal']}",
        f"MSV_4={v['streaming']}",
        f"MSV_4={s1['streaming']}",
        f"MSV_4={s1['terminal']}",
    ]
    assert parse_verifier_specs(specs) == {"MSV_4": [v, s1]}
    from hf_msv.evaluation import load_verifier_seeds

    seeds = load_verifier_seeds({"MSV_4": [v, s1], "Probe": study["verifiers"]["Probe"]})
    assert len(seeds) == 2 and seeds[0][1] is seeds[1][1]  # the single Probe is shared
    assert seeds[0][0].models["streaming"] is not seeds[1][0].models["streaming"]
    with pytest.raises(ValueError, match="same number"):
        load_verifier_seeds({"MSV_4": [v, s1], "Probe": [study["verifiers"]["Probe"]] * 3})


def test_stacked_baseline_without_a_probe_uses_a_linear_probe(study, tmp_path):
    config = EvaluateConfig(
        eval_dir=str(study["eval"]),
        output_dir=str(tmp_path),
        num_sequences=4,
        bootstrap=0,
        figures=False,
        progress=False,
        deepconf_window=8,
    )
    res = evaluate_study(config, {"MSV_4": study["verifiers"]["MSV_4"]}, lm_costs=LatencyCosts(0.01, 0.002)).to_dict()
    assert (
        res["config"]["stacked_probe"] == "linear probe on mean-pooled answer states, fitted on eval (2-fold "
        "cross-fit)"
    )
    for setting in ("terminal", "streaming"):
        stacked = res[setting]["4"]["Stacked (vote + Probe)"]
        assert 0 <= stacked["brier"]["mean"] <= 1 and "linear probe" not in res[setting]["4"]
    # the hidden states carry correctness, so the stack beats the raw vote
    term = res["terminal"]["4"]
    assert term["Stacked (vote + Probe)"]["auroc"]["mean"] > term["Self-consistency"]["auroc"]["mean"]
    assert res["intervals"] == {} and res["early_stop"]["4"]["comparisons"]["all"]["steps"]["interval"] is None


def test_claims_from_an_evaluation_with_intervals(study):
    """The reproduction's claims on `evaluate_study` results: verdicts need the whole interval to clear the target."""
    from hf_msv.reproduction import ReproduceConfig
    from hf_msv.reproduction.claims import main_claims
    from hf_msv.reproduction.summary import main_summary

    s = {"main": main_summary(study["results"], NS).to_json()}
    claims = {c["id"]: c for c in main_claims(s, ReproduceConfig(num_sequences=tuple(NS)))}
    assert {
        "terminal_brier_N8",
        "terminal_brier_vs_votes_N8",
        "best_of_8",
        "early_stop_N8",
        "early_stop_all_N8",
        "streaming_brier_N4",
        "bon_ece_N8",
    } <= set(claims)
    assert "t*" in claims["early_stop_N8"]["sentence"] and "95 % interval" in claims["terminal_brier_N8"]["sentence"]
    r = s["main"]["8"]
    base = claims["terminal_brier_N8"]["numbers"]["best_baseline"]
    bb = claims["terminal_brier_N8"]["numbers"]["best_baseline_value"]
    r["terminal"][r["msv"]]["brier"]["mean"] = 0.7 * bb  # the point estimate clears the target ...
    iv = r["intervals"]["terminal"][base]["brier_ratio"]
    iv.update(low=0.55, high=0.85)  # ... the interval does not

    def held(cid):
        return next(c for c in main_claims(s, ReproduceConfig(num_sequences=tuple(NS))) if c["id"] == cid)["held"]

    assert held("terminal_brier_N8") is False
    iv["high"] = 0.79
    assert held("terminal_brier_N8") is True
    comp = r["early_stop_comparisons"]["single_sequence"]["steps"]
    comp.update(fraction=0.3, interval={"estimate": 0.3, "low": 0.2, "high": 0.45})
    assert held("early_stop_N8") is False
    comp["interval"]["high"] = None  # ∞: MSV misses the peak in some resamples
    assert held("early_stop_N8") is False
    comp["interval"]["high"] = 0.39
    assert held("early_stop_N8") is True


def test_testbed_report_renders_a_summary_of_the_training_seed_protocol(study):
    """`render_testbed` and `compute_claims` on a main study evaluated with training seeds and intervals (the
    committed testbed.json predates them): every claim's sentence is in the report, with both early-stop verdicts,
    the protocol line and the reuse lines."""
    from pathlib import Path

    from hf_msv.reproduction import compute_claims, render_testbed
    from hf_msv.reproduction.summary import main_summary
    from hf_msv.utils import json_safe

    committed = json.loads((Path(__file__).resolve().parents[1] / "docs" / "results" / "testbed.json").read_text())
    s = {
        k: v for k, v in committed.items() if k not in ("checkers", "masks", "delimiters", "grouping", "training_size")
    }
    config = {k: v for k, v in committed["config"].items() if k != "seeds"}
    s |= {
        "studies": ["main"],
        "config": config | {"num_sequences": NS, "training_seeds": SEEDS},
        "main": json_safe(main_summary(study["results"], NS).to_json()),
        "reuse": {
            "reused": ["verifier probe-terminal (same settings, data and code)"],
            "redone": ["verifier msv4-terminal (changed: code)"],
        },
    }
    s["claims"] = json_safe(compute_claims(s))
    text = render_testbed(s)
    assert {"early_stop_N8", "early_stop_all_N8"} <= {c["id"] for c in s["claims"]}
    for c in s["claims"]:
        assert c["sentence"] in text, c["id"]
    assert "fixed partition" in text and "t* fraction" in text and "single-sequence" in text
    assert "msv4-terminal (changed: code)" in text


def test_linear_probe_cross_fit_scores_each_problem_out_of_fold():
    """The stacked baseline's fallback probe: a problem's scores come from a regression that never saw its labels
    (flipping them changes nothing), while the other half's scores do change."""
    from hf_msv.evaluation.methods import _cross_fit_linear_probe

    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(30, 6)).astype(np.float32) for _ in range(6)]
    ys = [x[:, 0] + 0.5 * rng.normal(size=30) > 0 for x in xs]
    base = _cross_fit_linear_probe(xs, ys)
    flipped = _cross_fit_linear_probe(xs, [~ys[0]] + ys[1:])
    np.testing.assert_allclose(flipped[0], base[0])  # problem 0 is scored by the fit on problems 1, 3, 5
    assert not np.allclose(flipped[1], base[1])  # problem 1 by the fit on 0, 2, 4, which saw the flip
    assert all(len(s) == 30 and ((s > 0) & (s < 1)).all() for s in base)
