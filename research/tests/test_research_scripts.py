"""The research scripts behind docs/testbed.md's findings (``research/*.py``): run on a tiny LM and tiny shards.

Not collected by ``make test`` (its testpaths are ``tests``); run with
``python -m pytest -q research/tests``.
"""

import importlib.util
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from hf_msv.answers import ELICITATION_PROMPT
from hf_msv.testbed import TASKS, task_v2

CAP = task_v2.TaskKnobsV2().max_trace_tokens
RESEARCH = Path(__file__).resolve().parents[1]


def _script(name: str):
    """``research/<name>.py`` as a module (the research scripts are scripts, not a package)."""
    import sys

    spec = importlib.util.spec_from_file_location(name, RESEARCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_quality_benchmark_runs_a_v2_lm_on_v2_problems_up_to_the_cap(tiny_v2_lm, monkeypatch):
    bench = _script("testbed_quality")
    monkeypatch.setitem(TASKS, "v2", replace(TASKS["v2"], lm_dir=tiny_v2_lm[0]))  # the default --model-dir
    res = bench.main(
        [
            "--task",
            "v2",
            "--n-problems",
            "2",
            "--samples",
            "2",
            "--problems-per-call",
            "2",
            "--elicit-samples",
            "1",
            "--threads",
            "1",
        ]
    )
    assert res["task"] == "v2" and res["max_new_tokens"] == CAP and res["model_dir"] == str(tiny_v2_lm[0])
    assert res["n_problems"] == 2 and res["mean_trace_tokens"] <= CAP
    # the LM's traces are diagnosed beside the solver's; the solver never misreads, copies wrong or re-boxes
    solver = res["solver_trace_errors"]
    assert set(res["lm_trace_errors"]) == set(solver)
    assert solver["operand_misread"] == solver["copy_slip"] == 0.0
    assert res["targets_measured"] >= 5 and 0 <= res["targets_passed"] <= res["targets_measured"]


def test_shard_statistics_read_the_trace_targets_from_collected_shards(tmp_path):
    import numpy as np

    from hf_msv.data import CollectedProblem, write_shard

    # three sequences: (tau, sequence, terminal, text); "1" is right
    rows = [
        (4, 1, False, "1"),
        (5, 0, False, "2"),
        (6, 2, True, "2"),
        (8, 1, True, "2"),
        (9, 0, False, "1"),
        (12, 0, True, "1"),
    ]
    n = len(rows)
    problem = CollectedProblem(
        problem_id="q",
        gold="1",
        source="synthetic",
        question="q",
        hidden_states=torch.zeros(n, 4),
        token_ids=np.zeros(n, dtype=np.int64),
        token_logprobs=np.zeros(n, dtype=np.float32),
        answer_text=[r[3] for r in rows],
        answer_raw_text=[r[3] for r in rows],
        answer_trigger=["eos" if r[2] else "delimiter" for r in rows],
        answer_sequence=[r[1] for r in rows],
        answer_step=[0] * n,
        answer_tau=[r[0] for r in rows],
        answer_length=[1] * n,
        answer_class=[int(r[3]) - 1 for r in rows],
        answer_terminal=[r[2] for r in rows],
        answer_correct=[r[3] == "1" for r in rows],
        sequence_length=[13, 9, 7],
        sequence_finish=["eos", "budget", "eos"],
        cot_confidence=[],
        cot_token_ids=[],
    )
    write_shard(tmp_path / "shard-r000-00000.safetensors", [problem], info={"lm_name_or_path": "synthetic"})
    stats = _script("testbed_quality").shard_statistics(tmp_path)
    assert stats == {
        "shard_sequences": 3,
        "shard_pass_at_1": round(1 / 3, 4),
        "shard_maj": 0.0,
        "shard_pass_minus_maj": 1.0,
        "elicited_per_sequence": 2.0,
        "first_intermediate_acc": 0.5,
        "terminal_acc_same_sequences": 0.5,
        "waits_wrong": 0.5,
        "waits_right": 2.0,
        "shard_capped_rate": round(1 / 3, 4),
    }


def test_score_only_rescores_a_probe_dir_as_the_probe_run_scored_it(tmp_path):
    """--probe's shards and Probe, scored again by --score-only (as for a work directory brought back from a GPU
    machine), give the figures the --probe run computed, plus the shard rows; without --probe-dir it refuses."""
    bench = _script("testbed_quality")
    torch.set_num_threads(1)
    work = tmp_path / "probe"
    first = bench.probe_signal(
        TASKS["v2"], work, [4, 2, 6], samples=4, seed=0, max_new_tokens=96, problems_per_batch=6
    )
    assert first["probe_problems"] == [4, 2, 6]
    again = bench.main(["--score-only", "--probe-dir", str(work), "--samples", "4"])
    for key in ("probe_auroc_n1", "token_probs_auroc_n1", "probe_best_of_4", "sc_best_of_4", "probe_pass_at_1"):
        assert again[key] == first[key] or (math.isnan(again[key]) and math.isnan(first[key])), key
    assert again["shard_sequences"] == 24 and again["targets_measured"] >= 3
    assert set(again["lm_trace_errors"]) == set(again["solver_trace_errors"]) >= {"wait_after_false"}
    tempered = bench.main(
        ["--score-only", "--probe-dir", str(work), "--samples", "4", "--knobs", '{"notice_prob": 1.0}']
    )
    assert json.dumps(tempered["lm_trace_errors"]) == json.dumps(again["lm_trace_errors"])  # the same LM chains
    for name in ("probe", "token_probs"):  # the intervals' own pooled AUROC is the evaluation's, inside its interval
        est, (low, high) = again[f"{name}_auroc_n1_pooled"], again[f"{name}_auroc_n1_interval"]
        assert 0 < est < 1 and est == pytest.approx(again[f"{name}_auroc_n1"], abs=1e-4) and low <= est <= high
    # the N = 1 AUROC's parts: the difficulty-only bound (never below chance) and each scorer's within a problem
    low, high = again["difficulty_auroc_n1_interval"]
    assert 0.5 <= again["difficulty_auroc_n1"] <= 1 and low <= again["difficulty_auroc_n1"] <= high
    for name in ("probe", "token_probs"):
        within = again[f"{name}_within_auroc"]
        assert math.isnan(within) or 0 <= within <= 1
    # the bootstrap resamples each problem's AUROC, computed once: its estimate is the metric's on the shards
    from hf_msv.data import ShardDataset
    from hf_msv.evaluation.scoring import token_prob_scores
    from hf_msv.metrics import within_problem_auroc

    problems = ShardDataset(work / "evaluation", mode="terminal").read_problems(True)
    rows = [np.flatnonzero(p.answer_terminal) for p in problems]
    expected = within_problem_auroc(
        [token_prob_scores(p)[r] for p, r in zip(problems, rows)],
        [np.asarray(p.answer_correct, dtype=float)[r] for p, r in zip(problems, rows)],
    )
    assert again["token_probs_within_auroc"] == pytest.approx(expected, abs=1e-4, nan_ok=True)
    # --compare / --against: an LM against itself (twice) differs by nothing on every resample, and each group's
    # mean is the LM's pooled AUROC, so the problems were lined up by id
    paired = bench.main(["--compare", str(work), "--against", f"{work},{work}"])
    assert paired["shared_problems"] == 6
    for name in ("probe", "token_probs"):
        assert paired[name]["compare"] == pytest.approx(again[f"{name}_auroc_n1_pooled"], abs=1e-4)
        assert paired[name]["against"] == paired[name]["compare"]
        assert paired[name]["difference"] == 0 and paired[name]["interval"] == [0, 0]
    # --screen on a copy of the evaluation shards (collection resumes: nothing sampled) reports Token-Probs and the
    # shard rows, no Probe; such a directory is compared on Token-Probs alone
    screen = tmp_path / "screen"
    shutil.copytree(work / "evaluation", screen / "evaluation")
    screened = bench.main(
        ["--screen", "6", "--probe-dir", str(screen), "--samples", "4", "--max-new-tokens", "96", "--probe-batch", "6"]
    )
    assert screened["token_probs_auroc_n1"] == again["token_probs_auroc_n1_pooled"]
    assert screened["token_probs_within_auroc"] == again["token_probs_within_auroc"]
    assert screened["maj_at_4"] == again["shard_maj"] and screened["shard_sequences"] == 24
    assert "probe_auroc_n1" not in screened and "probe_within_auroc" not in screened
    assert not (screen / "probe").exists()
    mixed = bench.main(["--compare", str(screen), "--against", str(work)])
    assert "probe" not in mixed and mixed["token_probs"]["difference"] == 0
    with pytest.raises(SystemExit):
        bench.main(["--compare", str(work)])
    with pytest.raises(SystemExit):
        bench.main(["--score-only"])
    with pytest.raises(ValueError, match="pass the --seed they used"):  # the shards are seed 0's problems
        bench.main(["--score-only", "--probe-dir", str(work), "--samples", "2", "--seed", "5"])


def test_elicitation_fidelity_reads_the_lms_answer_probability_on_the_writers_traces(tiny_v2_lm, capsys):
    """``research/elicitation_fidelity.py``: batched, right-padded scoring gives each answer the log-probabilities
    an unpadded forward gives; the writer's self-evaluation ranks its answers better than the writer without it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bench = _script("elicitation_fidelity")
    lm_dir, _ = tiny_v2_lm
    model, tok = AutoModelForCausalLM.from_pretrained(lm_dir).eval(), AutoTokenizer.from_pretrained(lm_dir)
    rows = bench.writer_terminal_answers(task_v2.generate_problems("evaluation", 6, seed=0), traces=3, seed=1)
    batched = bench.lm_answer_logprobs(model, tok, rows, batch=4)
    for r, lp in zip(rows[:5], batched):
        context = [tok.bos_token_id] + tok(
            task_v2.format_prompt(r["problem"]) + r["text"] + ELICITATION_PROMPT, add_special_tokens=False
        ).input_ids
        answer = tok("{" + r["answer"] + "}", add_special_tokens=False).input_ids
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([context + answer])).logits[0].float(), -1)
        alone = logp[torch.arange(len(context) - 1, len(context) + len(answer) - 1), torch.tensor(answer)].numpy()
        assert np.allclose(lp, alone, atol=1e-4)
    bench.main(["--model-dir", str(lm_dir), "--problems", "24", "--traces", "4", "--threads", "1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["traces"] == 96 and 0 <= out["mean_lm"] < 1 and 0 < out["mean_writer"] < 1  # an untrained LM: ~0
    assert out["writer_auroc"] > out["writer_without_self_evaluation_auroc"] + 0.05
    assert out["knobs"] == {} and 0 < out["clause_taken_traces"] and 0 < out["clause_left_traces"]


def test_elicitation_fidelity_uses_the_writer_the_lm_was_trained_on_and_splits_by_clause_reading(tmp_path):
    """The benchmark's writer is the LM's (``training_log.json["knobs"]``); on problems with an irrelevant clause the
    writer's probability is lower where the chain took it (its self-evaluation hedges the misreading)."""
    bench = _script("elicitation_fidelity")
    assert bench.trained_knobs(tmp_path) == {}
    (tmp_path / "training_log.json").write_text(json.dumps({"knobs": {"self_check": 0.4}}))
    knobs = bench.trained_knobs(tmp_path)
    assert knobs == {"self_check": 0.4}
    rows = bench.writer_terminal_answers(
        task_v2.generate_problems("evaluation", 60, seed=2), traces=6, seed=3, knobs=knobs
    )
    default = bench.writer_terminal_answers(task_v2.generate_problems("evaluation", 60, seed=2), traces=6, seed=3)
    assert [r["text"] for r in rows] == [r["text"] for r in default]  # self_check draws nothing: the same traces
    assert [r["writer"] for r in rows] != [r["writer"] for r in default]  # the knob reached the writer's hedge
    taken = [r for r in rows if r["clause"] == "taken"]
    assert taken and all(r["problem"].meta["distractor"] for r in taken)
    writer = np.array([r["writer"] for r in rows])
    means = bench.clause_means(rows, writer, writer)
    assert means["clause_taken_traces"] == len(taken)
    assert means["writer_mean_clause_taken"] < means["writer_mean_clause_left"] - 0.03
    assert means["lm_mean_clause_taken"] == means["writer_mean_clause_taken"]
    # the reading's share of the unease: what is left is whole wrong steps; hedging it alone lies between the two
    for r in rows:
        assert r["writer"] - 1e-9 <= r["writer_reading"] <= r["writer_blind"] + 1e-9
    assert any(r["writer_reading"] < r["writer_blind"] for r in taken)
    assert all(r["writer_reading"] == r["writer_blind"] for r in rows if r["clause"] is None)
    right = np.array([r["right"] for r in rows])
    assert (
        roc_auc_score(right, [r["writer_reading"] for r in rows])
        > roc_auc_score(right, [r["writer_blind"] for r in rows]) + 0.05
    )


def _group(end, klass, correct, scores):
    from hf_msv.data import AnswerGroup

    end = np.asarray(end)
    seq = np.arange(len(end))
    return AnswerGroup(
        seq,
        end,
        np.asarray(klass),
        np.asarray(correct, bool),
        np.ones(len(end), bool),
        end.copy(),
        end - 1,
        {"m": np.asarray(scores, float)},
    )


def test_early_stop_diagnosis_counts_wrong_stops_and_the_clairvoyant_budget():
    diag = _script("early_stop_diagnosis")
    # group 0: a wrong answer scored 0.9 arrives at 10, the right class (two answers) at 50 and 60 and scores best;
    # group 1: right answer at 20 scored 0.95; group 2: never right.
    groups = [
        _group([10, 50, 60], [1, 0, 0], [0, 1, 1], [0.9, 0.6, 0.95]),
        _group([20, 80], [0, 1], [1, 0], [0.95, 0.2]),
        _group([30, 40], [1, 2], [0, 0], [0.3, 0.4]),
    ]
    r = diag.replays(groups, "m", [0.85])
    assert r["full_correct"].tolist() == [True, True, False]
    assert r["stopped"][:, 0].tolist() == [True, True, False] and r["correct"][:, 0].tolist() == [False, True, False]
    row = diag.at_budget(r, budget=100.0, lambdas=[0.85])
    assert row["lost_by_stopping"] == pytest.approx(1 / 3)  # group 0: stopped on the wrong answer, full is right
    assert row["accuracy_when_stopped"] == pytest.approx(0.5)
    # to be right on 2 of 3 groups a gold-knowing stopper pays 50 (group 0) + 20 (group 1) + 30 (group 2's first)
    assert diag.clairvoyant_steps(groups, 2 / 3) == pytest.approx((50 + 20 + 30) / 3)
    assert diag.evidence_at(groups, 25.0)["correct_available"] == pytest.approx(1 / 3)
    # class mean at arrival: the second right answer averages its logit with the first one's
    cm = diag.class_mean_scores(groups[0], "m")
    logit = lambda p: math.log(p / (1 - p))
    assert cm[0] == pytest.approx(0.9) and cm[2] == pytest.approx(1 / (1 + math.exp(-(logit(0.6) + logit(0.95)) / 2)))
    costly = diag.costly_stops(groups, r, 0)
    assert costly["share_of_groups"] == pytest.approx(1 / 3) and costly["median_class_support"] == 1


def test_guarantee_resplits_fit_on_one_part_choose_on_another_and_score_the_rest(tmp_path):
    """Each re-split fits the head on --head problems, chooses λ on --calibration others and scores it on the rest;
    the violation rate is the share of re-splits whose held-out loss exceeds ε, with its Monte-Carlo interval."""
    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier

    pool = write_split(tmp_path / "pool", 40, seed=3, num_sequences=4)
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    verifier.save_pretrained(tmp_path / "msv")
    out = _script("guarantee_resplits").main(
        ["--verifier", str(tmp_path / "msv"), "--pool", str(pool), "--resplits", "3", "--head", "12",
         "--calibration", "12", "--epsilon", "0.2", "--output", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert out["resplits"] == 3 and out["held_out_problems"] == 16 and out["calibration_problems"] == 12
    risks = [r["risk"] for r in out["runs"]]
    assert out["violation_rate"] == sum(r > 0.2 for r in risks) / 3
    low, high = out["violation_rate_interval"]
    assert 0.0 <= low <= out["violation_rate"] <= high <= 1.0
    assert json.loads((tmp_path / "r.json").read_text())["epsilon"] == 0.2


def test_default_vs_field_hull_values_are_the_interpolated_curve_per_problem():
    """Each problem's value on a rule's interpolated curve mixes the two hull vertices around the budget, so their
    mean is `interpolated_curve(...).at(budget)` (and a paired bootstrap between two rules' hulls is well defined);
    past the hull's peak it is the peak's setting."""
    from hf_msv.evaluation.early_stop import interpolated_curve
    from hf_msv.evaluation.field_rules import RuleCurve

    study = _script("default_vs_field")
    rng = np.random.default_rng(0)
    g = 40
    cot = np.stack([rng.integers(10, 20, g), rng.integers(30, 50, g), rng.integers(60, 80, g), np.full(g, 100)], 1)
    correct = rng.random((g, 4)) < np.array([0.3, 0.6, 0.75, 0.7])
    curve = RuleCurve(("a", "b", "c", "full"), correct, cot, cot, cot[:, -1], cot[:, -1], tuple(map(str, range(g))))
    hull = interpolated_curve(curve.tradeoff())
    for budget in (0.05, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0):
        values = study.hull_values(curve, budget)
        assert values.shape == (g,) and values.min() >= 0 and values.max() <= 1
        assert values.mean() == pytest.approx(hull.at(budget), abs=1e-9)
    peak = int(np.argmax(correct.mean(0)))
    assert np.array_equal(study.hull_values(curve, 1.0), correct[:, peak].astype(float))  # flat past the peak
    same = study.compare(study.hull_values(curve, 0.5), study.hull_values(curve, 0.5), 200)
    assert same["estimate"] == 0 and same["holds"]
    over = study.compare(np.zeros(g), np.ones(g), 200, rule_fits=False)
    assert not over["ahead"] and over["holds"]  # a rule over the budget is not ahead of anything


def test_default_vs_field_switched_curve_floors_only_below_the_switch_chosen_on_validation():
    """The switched curve takes the floored curve's settings below λ_s and the default's at and above it (full
    decoding included); λ_s is the grid λ under the certified one with the best mean hull over the budgets; pooled
    collections concatenate."""
    from hf_msv.evaluation.field_rules import RuleCurve

    study = _script("default_vs_field")
    settings = ("lambda=0.5", "lambda=0.9", "lambda=0.99", "full")
    g = 10
    cot = np.tile(np.array([30, 50, 70, 100]), (g, 1))
    plain = np.zeros((g, 4), bool)
    plain[:, 3] = plain[:7, 2] = True  # 0.0 at 0.3 and 0.5 of the tokens, 0.7 at 0.7, 1.0 at full
    floored = plain.copy()
    floored[:6, 0] = floored[:1, 1] = True  # the floor helps at 0.3 (0.6) and hurts nothing above it
    a = RuleCurve(settings, plain, cot, cot, cot[:, -1], cot[:, -1], tuple(map(str, range(g))), np.arange(4.0))
    b = RuleCurve(settings, floored, cot, cot, cot[:, -1], cot[:, -1], a.problem, -np.arange(4.0))
    mixed = study.switched(a, b, 0.9)
    assert np.array_equal(mixed.correct[:, 0], floored[:, 0]) and np.array_equal(mixed.correct[:, 1:], plain[:, 1:])
    assert mixed.pruned.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert np.array_equal(study.switched(a, b, 0.95).correct[:, :2], floored[:, :2])
    # Every λ_s in (0.5, 0.9] floors λ = 0.5 alone, the best: the smallest of them; the certified λ bounds it.
    assert study.choose_switch(a, b, 0.975) == pytest.approx(0.51)  # the grid steps by 0.01 there
    assert study.choose_switch(a, b, 0.2) < 0.2
    both = study.concatenated([a, b])
    assert both.correct.shape == (2 * g, 4) and both.problem == a.problem + b.problem
    with pytest.raises(ValueError, match="one grid"):
        study.switched(a, RuleCurve(settings[::-1], floored, cot, cot, cot[:, -1], cot[:, -1], a.problem), 0.9)


def test_pruning_candidates_crowd_clause_prunes_decoding_chains_of_a_held_settled_class():
    """The crowd clause prunes the chains still decoding whose held class K chains hold (ended ones count) at
    confidence ≥ C, beside the rule's own clauses; a spec without it is the plain `PruneRule`."""
    from hf_msv.pruning import DECODING, ENDED, PruneRule

    study = _script("pruning_candidates")
    # chains 0-2 hold class 7 (chain 1 has ended), chain 3 holds class 5; chain 3's last two answers agree
    sequence, step, end = np.array([0, 1, 2, 3, 3]), np.array([0, 0, 0, 0, 1]), np.array([3, 4, 5, 2, 5])
    klass, status = np.array([7, 7, 7, 5, 5]), np.array([DECODING, ENDED, DECODING, DECODING])
    rows = (np.array([7, 5]), np.array([0.9, 0.1]))
    _, decide = study.parse_rule("crowd=3,crowd_confidence=0.8")
    assert decide(5, sequence, step, end, klass, *rows, status).tolist() == [True, False, True, False]
    assert not decide(4, sequence, step, end, klass, *rows, status).any()  # chain 2 has not answered: 2 hold it
    _, strict = study.parse_rule("crowd=3,crowd_confidence=0.95")
    assert not strict(5, sequence, step, end, klass, *rows, status).any()
    describe, both = study.parse_rule("steady=2,crowd=3,crowd_confidence=0.8")
    assert both(5, sequence, step, end, klass, *rows, status).tolist() == [True, False, True, True]
    assert describe.startswith(PruneRule(steady=2).describe()) and "3 chains hold" in describe
    assert study.parse_rule("steady=2,min_answers=4") == (
        PruneRule(steady=2, min_answers=4).describe(),
        PruneRule(steady=2, min_answers=4),
    )


def test_default_on_new_problems_replays_what_from_verifier_deploys(tmp_path):
    """The default is the stored pair (its λ, its rule), the stop alone is `prune=False`'s λ without pruning; both
    against full decoding on the same problems, the stop alone pruning nothing."""
    from dataclasses import asdict

    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier
    from hf_msv.lambda_rule import LambdaChoice
    from hf_msv.pruning import PruneRule
    from hf_msv.stop_rules import StopHead

    def choice(lam):
        return LambdaChoice(lam, "guarantee", True, 0.1, 0.1, None, 12, 22, 0.5, 10.0, 0.0, 0.5, 20.0).to_dict()

    data = write_split(tmp_path / "eval", 12, seed=5, num_sequences=4)
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    head = StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4)
    verifier.config.early_stopping = {
        "stop_head": head.to_dict(),
        "lambda": choice(0.9),
        "pruning": {
            "rule": asdict(PruneRule(steady=2)),
            "lambda": choice(0.3),
            # a map that weighs the class's support at the stop: applied with the stop's features, as deployed
            "confidence_map": {"slope": 1.0, "intercept": 0.0, "weights": [0, 2.0, 0, 0, 0, 0, 0, 0]},
        },
    }
    verifier.save_pretrained(tmp_path / "msv")
    out = _script("default_on_new_problems").main(
        ["--verifier", str(tmp_path / "msv"), "--eval-dir", str(data), "--output", str(tmp_path / "d.json")]
    )
    assert out["problems"] == 12 and out["num_chains"] == 4
    assert out["default"]["lam"] == 0.3 and out["default"]["rule"] == PruneRule(steady=2).describe()
    assert out["stop_alone"]["lam"] == 0.9 and out["stop_alone"]["pruned_chains"] == 0
    for name in ("default", "stop_alone"):
        assert 0 < out[name]["cot_fraction"]["estimate"] <= 1 and 0 <= out[name]["stopped"] <= 1
        assert out[name]["full_accuracy"] == out["stop_alone"]["full_accuracy"]
    assert json.loads((tmp_path / "d.json").read_text())["default"]["lam"] == 0.3
    stops = out["default"]["stop_calibration"]["stops"]
    assert stops > 0 and out["default"]["ece_at_stop_recalibrated"] == out["default"]["stop_calibration"]["ece"]
    assert out["default"]["confidence_at_stop_recalibrated"] > out["default"]["confidence_at_stop"]  # support ≥ 0
    study = _script("default_on_new_problems")
    confidence = np.full(400, 0.9)
    honest = study.stop_calibration(confidence, (np.arange(400) % 10 != 0).astype(float), draws=50)
    assert honest["ece"] == pytest.approx(0.0) and honest["gap"]["low"] <= 0 <= honest["gap"]["high"]
    assert 0 < honest["ece_if_calibrated"]["mean"] < 0.05  # a calibrated confidence still shows sampling noise
    over = study.stop_calibration(confidence, (np.arange(400) % 2 == 0).astype(float), draws=50)
    assert over["ece"] == pytest.approx(0.4) and over["gap"]["low"] > 0.3


def test_stop_confidence_features_fits_each_map_on_calibration_and_scores_it_on_new_stops(tmp_path, monkeypatch):
    """Each candidate map is fitted on the calibration stops of the deployed default and scored on the new problems'
    stops; the chosen map is the one of lowest cross-fitted calibration log loss; ``--cache`` keeps the stops."""
    from dataclasses import asdict

    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier
    from hf_msv.lambda_rule import LambdaChoice
    from hf_msv.pruning import PruneRule
    from hf_msv.stop_rules import STOP_TIME_FEATURES, StopHead

    pair = LambdaChoice(0.3, "guarantee", True, 0.1, 0.1, None, 12, 22, 0.5, 10.0, 0.0, 0.5, 20.0).to_dict()
    cal = write_split(tmp_path / "cal", 24, seed=6, num_sequences=4)
    new = write_split(tmp_path / "new", 24, seed=8, num_sequences=4)
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    head = StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4)
    verifier.config.early_stopping = {
        "stop_head": head.to_dict(),
        "lambda": pair,
        "pruning": {
            "rule": asdict(PruneRule(steady=2)),
            "lambda": pair,
            "confidence_map": {"slope": 1, "intercept": 0},
        },
    }
    verifier.save_pretrained(tmp_path / "msv")
    study = _script("stop_confidence_features")
    args = ["--verifier", str(tmp_path / "msv"), "--calibration-dir", str(cal), "--eval-dir", str(new)]
    out = study.main([*args, "--cache", str(tmp_path / "cache")])
    assert out["calibration"]["problems"] == 24 and 0 < out["calibration"]["stops"] <= 24
    assert set(out["maps"]) == set(study.MAPS) and out["evaluation"]["stops"] == out["reported"]["stops"] > 0
    crossfit = {name: m["calibration_crossfit"]["log_loss"] for name, m in out["maps"].items()}
    assert out["chosen"] == min(crossfit, key=crossfit.get)
    errors = {name: m["calibration_crossfit"]["ece"] for name, m in out["maps"].items()}
    assert out["chosen_by_ece"] == min(errors, key=errors.get) and out["calibration"]["left_out"] == []
    assert "knots" in out["maps"]["confidence alone, isotonic step"]["map"]
    weighs = out["maps"]["+ support, answered"]["map"]["weights"]
    assert len(weighs) == len(STOP_TIME_FEATURES) and weighs[0] == 0.0 and weighs[1] != 0.0
    assert out["stored"]["evaluation"]["stops"] == out["evaluation"]["stops"]  # the verifier's own map, applied
    monkeypatch.setattr(study, "stops", lambda *a: pytest.fail("the cached stops are read back"))
    again = study.main([*args, "--cache", str(tmp_path / "cache")])
    assert again["maps"] == out["maps"]


def test_default_vs_field_cache_is_reused_only_for_the_same_rule_and_verifier(tmp_path, monkeypatch):
    """The default's replay is cached; the cache is read back for the same rule and stopping rule, and replayed
    again when either changed (a pair certified after the cache was written)."""
    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier
    from hf_msv.pruning import PRUNE_OFF, PruneRule
    from hf_msv.stop_rules import StopHead

    study = _script("default_vs_field")
    data = write_split(tmp_path / "eval", 6, seed=7, num_sequences=4)
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    head = StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4)
    verifier.config.early_stopping = {"stop_head": head.to_dict()}
    cache = tmp_path / "eval-default.npz"
    first = study.default_curve(str(data), verifier, PRUNE_OFF, 4, cache)
    assert cache.exists() and len(first.problem) == 6
    replays = []
    real = study.replay_sweep
    monkeypatch.setattr(study, "replay_sweep", lambda *a, **k: replays.append(1) or real(*a, **k))
    again = study.default_curve(str(data), verifier, PRUNE_OFF, 4, cache)
    assert replays == [] and np.array_equal(again.correct, first.correct)  # read back, not replayed
    study.default_curve(str(data), verifier, PruneRule(steady=2), 4, cache)
    assert replays  # another rule: replayed
    replays.clear()
    verifier.config.early_stopping = {"stop_head": head.to_dict(), "lambda": None}
    study.default_curve(str(data), verifier, PruneRule(steady=2), 4, cache)
    assert replays  # another stopping rule: replayed


def test_stop_calibration_by_lambda_reads_the_stops_at_each_lambda():
    """Per λ: the stops of that λ's column, their mean reported and mapped confidence and their accuracy."""
    from types import SimpleNamespace

    from hf_msv.lambda_rule import LAMBDAS

    study = _script("stop_calibration_by_lambda")
    g = 4
    stopped = np.zeros((g, LAMBDAS.size), bool)
    confidence = np.zeros((g, LAMBDAS.size))
    correct = np.zeros((g, LAMBDAS.size), bool)
    j = int(np.argmin(np.abs(LAMBDAS - 0.97)))
    stopped[:3, j], confidence[:3, j], correct[:2, j] = True, [0.6, 0.8, 1.0], True
    replay = SimpleNamespace(stopped=stopped, confidence=confidence, correct=correct)
    k = [j, int(np.argmin(np.abs(LAMBDAS - 0.99)))]  # the swept-with-the-map replay at the grid's two λ
    mapped = SimpleNamespace(stopped=stopped[:, k], confidence=confidence[:, k] / 2)
    rows = study.by_lambda(replay, mapped, grid=(0.97, 0.99))
    assert rows[0]["stops"] == 3 and rows[0]["reported"] == pytest.approx(0.8)
    assert rows[0]["mapped"] == pytest.approx(0.4) and rows[0]["accuracy"] == pytest.approx(2 / 3)
    assert rows[1]["stops"] == 0 and rows[1]["accuracy"] is None


def test_fit_regret_writes_a_head_the_rule_syntax_reads(tmp_path):
    """research/fit_regret.py fits the regret statistic on a split's groups and writes a `RegretHead` that
    ``regret=R`` in the candidates' rule syntax reads back; a regret rule without a head is refused."""
    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier
    from hf_msv.pruning import PruneRule
    from hf_msv.stop_rules import StopHead

    data = write_split(tmp_path / "val", 12, seed=3, num_sequences=4)
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    head = StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4)
    verifier.config.early_stopping = {"stop_head": head.to_dict()}
    verifier.save_pretrained(tmp_path / "msv")
    out = _script("fit_regret").main(
        ["--verifier", str(tmp_path / "msv"), "--data-dir", str(data), "--output", str(tmp_path / "r.json")]
    )
    assert out["head"]["groups"] == 12 and out["head"]["rows"] > out["head"]["positives"] >= 0
    assert 0 <= out["two_fold"]["positive_rate"] < 1
    study = _script("pruning_study")
    regret = study.read_regret(tmp_path / "r.json")
    rule = study.parse_rule("steady=2,regret=0.1,min_answers=2", regret)
    assert rule == regret.rule(0.1, PruneRule(steady=2, min_answers=2)) and rule.regret_coef == regret.coef
    with pytest.raises(ValueError, match="--regret-head"):
        study.parse_rule("regret=0.1")
    _, same = _script("pruning_candidates").parse_rule("regret=0.1", regret)
    assert same == regret.rule(0.1)
    # The ceiling's label: full decoding's output class replayed per group, no gold read.
    argv = ["--verifier", str(tmp_path / "msv"), "--data-dir", str(data), "--output", str(tmp_path / "o.json")]
    output = _script("fit_regret").main([*argv, "--target", "output"])
    assert output["head"]["target"] == "output" and output["head"]["rows"] == out["head"]["rows"]
    assert output["head"]["positives"] != out["head"]["positives"]


def test_budget_ceiling_reads_each_curve_at_each_budget(tmp_path):
    """research/budget_ceiling.py replays the stop alone, the verifier's pruning rule, the gold-knowing pruner and
    the rules of ``--rules`` over the λ grid and reads each interpolated curve at 30 / 50 / 70 %: an upper hull
    never falls as the budget grows."""
    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier
    from hf_msv.pruning import PruneRule
    from hf_msv.stop_rules import StopHead

    data = write_split(tmp_path / "eval", 10, seed=5, num_sequences=4)
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    head = StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4)
    verifier.config.early_stopping = {"stop_head": head.to_dict(), "pruning": {"rule": PruneRule(steady=2).to_dict()}}
    verifier.save_pretrained(tmp_path / "msv")
    args = ["--verifier", str(tmp_path / "msv"), "--data-dir", str(data), "--rules", "steady=3"]
    out = _script("budget_ceiling").main(args)
    assert out["groups"] == 10 and "last 2 answers" in out["default_rule"]
    curves = out["interpolated_accuracy"]
    assert set(curves) == {"stop alone", "default", "ceiling", "steady=3"}
    for values in curves.values():
        assert list(values) == ["0.3", "0.5", "0.7"] and values["0.3"] <= values["0.5"] <= values["0.7"] + 1e-12
        assert all(0 <= v <= 1 for v in values.values())


def test_pruning_losses_finds_a_group_lost_to_a_class_one_chain_holds():
    """Chains 0–2 hold the right class 0, scored 0.6 early and 0.95 late; chain 3 answers class 1 once, late, at
    0.9. Pruned after their first answers, chains 0–2 hold the early scores and the lone class wins the final
    snapshot (σ of the class's mean logit); with the support floor it does not."""
    from hf_msv.pruning import PRUNE_OFF
    from hf_msv.stop_rules import StopHead
    from hf_msv.training.pruned_replay import ReplayGroup, replay_pruning

    sequence, step = np.array([0, 1, 2, 0, 1, 2, 3]), np.array([0, 0, 0, 1, 1, 1, 0])
    start = np.array([10, 11, 12, 40, 41, 42, 50])
    klass, score = np.array([0, 0, 0, 0, 0, 0, 1]), np.array([0.6, 0.6, 0.6, 0.95, 0.95, 0.95, 0.9])
    terminal = np.array([False, False, False, True, True, True, True])
    group = ReplayGroup(sequence, step, start + 2, start, klass, klass == 0, terminal, np.array([40, 41, 42, 50]), "p")
    scorer = lambda groups, keeps: [np.where(k, score, np.nan) for k in keeps]

    def first_answers(t, seq, st, end, k, rk, rc, status):  # prune chains 0-2 once they have answered
        return np.isin(np.arange(4), [0, 1, 2]) & (status == 0) & np.isin(np.arange(4), seq[end <= t])

    study = _script("pruning_losses")
    found = {}
    for share in (0.0, 0.5):
        head = StopHead(coef=(1.0, 0, 0, 0, 0, 0), intercept=0.0, num_chains=4, min_share=share)
        full = replay_pruning(PRUNE_OFF, head, [group], scorer, [score])
        pruned = replay_pruning(first_answers, head, [group], scorer, [score])
        assert (pruned[0].cut[:3] < group.seq_len[:3]).all()
        found[share] = study.losses([group], full, pruned, head)
    assert len(found[0.0]) == 1 and found[0.5] == []
    row = found[0.0][0]
    assert row["output_class_support"] == {"full": 1, "pruned": 1}
    assert row["right_class_support"] == {"full": 3, "pruned": 3} and row["pruned_chains"] == 3


def test_stop_confidence_features_finds_a_testbed_problem_two_seeds_drew(tmp_path):
    """Problem 105 of `testbed:evaluation:1024:5151` is problem 54 of `testbed:evaluation:1232:7373` (the same
    arithmetic and distractor): a calibration collection holding it loses it to the new problems' collection."""
    study = _script("stop_confidence_features")
    for name, ids in (("cal", ["5151/104", "5151/105"]), ("new", ["7373/53", "7373/54"]), ("other", ["6161/0"])):
        shard = {"shard-r000-00000.safetensors": [f"testbed-arith-v2/evaluation/{i}" for i in ids]}
        (tmp_path / name).mkdir()
        (tmp_path / name / "index-r000.json").write_text(json.dumps({"problems": 2, "rank": 0, "shards": shard}))
    assert study.shared_problems([tmp_path / "cal"], [tmp_path / "new"]) == {"testbed-arith-v2/evaluation/5151/105"}
    assert study.shared_problems([tmp_path / "cal"], [tmp_path / "other"]) == frozenset()


def test_net_test_power_holds_the_level_at_the_null_and_rejects_a_clear_gain():
    """research/net_test_power.py simulates the library's net-loss test: at the null's boundary (net loss = ε) it
    rejects no more often than its level allows, a net gain of 5 pp it rejects almost always, and the z-test's
    problem count grows with the churn."""
    module = _script("net_test_power")
    null = module.power(1024, churn=0.2, mean=0.01, epsilon=0.01, level=0.05, draws=200, seed=1)
    assert null["interval"][0] <= 0.05 and null["power"] <= 0.1
    gain = module.power(1024, churn=0.2, mean=-0.05, epsilon=0.01, level=0.05, draws=50, seed=2)
    assert gain["power"] >= 0.95 and gain["z_power"] > 0.99
    assert module.z_problems(0.036, 0.0, 0.01, 0.025, 0.8) < module.z_problems(0.076, 0.0, 0.01, 0.025, 0.8)
    out = module.main(["--quick"])
    assert len(out["rows"]) == 8 and all(0 <= r["power"] <= 1 for r in out["rows"])


def test_pruning_study_pools_several_calibration_and_evaluation_collections(tmp_path):
    """research/pruning_study.py certifies on every --calibration-dir and evaluates on every --eval-dir, pooled."""
    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier
    from hf_msv.lambda_rule import LambdaChoice
    from hf_msv.stop_rules import StopHead

    dirs = [write_split(tmp_path / name, 6, seed=s, num_sequences=4) for name, s in (("c1", 1), ("c2", 2), ("e", 3))]
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    head = StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4)
    lam = LambdaChoice(0.9, "guarantee", True, 0.1, 0.1, None, 12, 22, 0.5, 10.0, 0.0, 0.5, 20.0).to_dict()
    verifier.config.early_stopping = {"stop_head": head.to_dict(), "lambda": lam}
    verifier.save_pretrained(tmp_path / "msv")
    args = ["--verifier", str(tmp_path / "msv"), "--calibration-dir", str(dirs[0]), str(dirs[1])]
    args += ["--eval-dir", str(dirs[2]), "--rules", "steady=2", "--no-alternatives", "--loss", "net"]
    out = _script("pruning_study").main(args)
    assert out["calibration_problems"] == 12 and out["evaluation_problems"] == 6
    assert [c["describe"] for c in out["candidates"]] == [
        "no pruning",
        "prune a chain whose last 2 answers are one class",
    ]


def test_net_test_power_reads_a_studys_calibration_curve(tmp_path):
    """``--study``: gains are read from each λ's accuracy against full decoding's (no pruning at λ = ∞), and a λ
    that moves more outcomes for no better net has less power."""
    curve = lambda *points: [dict(zip(("lam", "losses", "accuracy", "cot_fraction"), p)) for p in points]
    study = {
        "calibration_problems": 1000,
        "candidates": [
            {"describe": "no pruning", "calibration_curve": curve((None, 0, 0.8, 1.0))},
            {"describe": "steady", "calibration_curve": curve((None, 5, 0.805, 0.6), (0.9, 40, 0.8, 0.4))},
        ],
    }
    path = tmp_path / "study.json"
    path.write_text(json.dumps(study))
    out = _script("net_test_power").main(["--study", str(path), "--draws", "60"])
    calm, busy = out["rows"]
    assert (calm["losses"], calm["gains"], busy["losses"], busy["gains"]) == (5, 10, 40, 40)
    assert calm["power"]["3072"]["power"] > busy["power"]["3072"]["power"]
    assert calm["power"]["1024"]["z_power"] <= calm["power"]["6144"]["z_power"]


def test_churn_by_collection_splits_the_net_change_into_problems_lost_and_gained(tmp_path):
    """Lost: full decoding right and the rule wrong; gained: the reverse; the net change is their difference, on
    hand-built outcomes and on a replayed collection (the stored pair and the stop alone at each λ)."""
    from dataclasses import asdict

    from helpers.evaluation import D, write_split
    from helpers.generation import tiny_verifier
    from hf_msv.lambda_rule import LambdaChoice
    from hf_msv.pruning import PruneRule
    from hf_msv.stop_rules import StopHead

    study = _script("churn_by_collection")
    full = np.array([1, 1, 1, 0, 0, 0, 1, 0], bool)
    rule = np.array([1, 0, 1, 1, 1, 0, 0, 0], bool)
    out = study.churn(rule, full, np.ones(8, bool))
    assert out["lost"]["estimate"] == 2 / 8 and out["gained"]["estimate"] == 2 / 8 and out["net"]["estimate"] == 0
    assert out["net"]["low"] < 0 < out["net"]["high"] and out["stopped"] == 1.0

    data = write_split(tmp_path / "eval", 12, seed=5, num_sequences=4)
    verifier = tiny_verifier(num_sequences=4, hidden=D)
    choice = LambdaChoice(0.3, "guarantee", True, 0.1, 0.1, None, 12, 22, 0.5, 10.0, 0.0, 0.5, 20.0).to_dict()
    verifier.config.early_stopping = {
        "stop_head": StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4).to_dict(),
        "lambda": choice,
        "pruning": {"rule": asdict(PruneRule(steady=2)), "lambda": choice},
    }
    verifier.save_pretrained(tmp_path / "msv")
    result = study.main(["--verifier", str(tmp_path / "msv"), "--data-dir", str(data), "--lambdas", "0.3", "0.9"])
    got = result[str(data)]
    assert got["problems"] == 12 and got["rule"] == PruneRule(steady=2).describe()
    for name in ("pair", "stop_alone"):
        for row in got[name].values():
            net, lost, gained = (row[k]["estimate"] for k in ("net", "lost", "gained"))
            assert net == pytest.approx(gained - lost)
            assert lost <= got["full_accuracy"] and gained <= 1 - got["full_accuracy"]
