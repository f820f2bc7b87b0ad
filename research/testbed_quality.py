"""How good a verifier testbed a testbed LM is: its sampled traces, answers and per-chain signal against targets.

Backs docs/testbed.md ("The shipped LM's statistics" and "Token-Probs stays near 0.63-0.69").

    python research/testbed_quality.py --quick                  # the default LM (v2), 64 problems x 16
    python research/testbed_quality.py --quick --probe          # + a Probe fit and Token-Probs (~18 min, 2 cores)
    python -m research.testbed_v1 quality --quick               # the first testbed, for comparison
    python research/testbed_quality.py --model-dir DIR --quick  # another LM trained on the task
    python research/testbed_quality.py --screen 96 --probe-batch 32 --probe-dir DIR   # Token-Probs, no Probe
    python research/testbed_quality.py --score-only --probe-dir DIR                   # re-score a --probe-dir
    python research/testbed_quality.py --compare D1,D2 --against D3                   # paired AUROC differences

Rows, on ``evaluation`` problems sampled at temperature 1: pass@1, maj@S, pass@S; Waits per trace; accuracy of the
answers elicited at a ``Wait`` vs the terminal ones; the share of traces cut at the cap; decode throughput; for v2,
where the LM's traces depart from its writer's (:func:`hf_msv.testbed.task_v2.trace_errors`). ``--probe`` collects
384 / 32 / 96 problems with ``hf-msv collect``, trains a terminal Probe with the defaults and runs ``hf-msv
evaluate``: Probe and Token-Probs AUROC at N = 1 with bootstrap intervals, the difficulty-only bound and the AUROC
within a problem (:func:`auroc_intervals`), Probe best-of-S, and the trace rows read back from the shards
(:func:`shard_statistics`). Each target row is printed PASS / FAIL; the last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from hf_msv.testbed import DEFAULT_TASK, DELIMITER, ELICITATION_PROMPT, TASKS
from hf_msv.testbed.task_v2 import error_rates, trace_errors


def parse_box(continuation: str) -> str | None:
    """Content of the box opened at the start of ``continuation`` (``{...}``); None when unclosed or empty."""
    if not continuation.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(continuation):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            content = continuation[1:i].strip()
            return content or None
    return None


def final_answer(trace: str) -> str | None:
    i = trace.rfind(ELICITATION_PROMPT)
    return None if i < 0 else parse_box(trace[i + len(ELICITATION_PROMPT) :])


def left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    att = torch.zeros((len(seqs), L), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, L - len(s) :] = torch.tensor(s)
        att[r, L - len(s) :] = 1
    return ids, att


def probe_signal(
    task,
    work_dir: Path,
    sizes: list[int],
    samples: int,
    seed: int,
    max_new_tokens: int,
    problems_per_batch: int | None = None,
) -> dict:
    """The per-chain signal, measured with the library as a user would: collect train / validation / evaluation
    shards from the task's LM (``sizes`` problems, ``samples`` sequences each), train a terminal Probe with the
    defaults, evaluate at N = 1 and N = ``samples``. Returns the Probe's and Token-Probs' terminal AUROC at N = 1 and
    the Probe's best-of-N against self-consistency's and pass@1. ``problems_per_batch``: collection's (``None``: its
    default of one problem a batch; on a GPU, batches of 32 are ~8x faster and sample other, equally valid chains)."""
    from hf_msv.training import MSVTrainingConfig, train_verifier

    dirs = {}
    for split, n in zip(("train", "validation", "evaluation"), sizes):
        dirs[split] = str(work_dir / split)
        collect_split(task, work_dir, split, n, samples, seed, max_new_tokens, problems_per_batch)
    train_verifier(
        dirs["train"],
        dirs["validation"],
        work_dir / "probe",
        MSVTrainingConfig(kind="probe", mode="terminal", seed=seed, progress=False),
    )
    return probe_scores(work_dir, samples) | {"probe_problems": sizes}


def collect_split(
    task,
    work_dir: Path,
    split: str,
    n_problems: int,
    samples: int,
    seed: int,
    max_new_tokens: int,
    problems_per_batch: int | None = None,
) -> None:
    """``hf-msv collect`` of ``n_problems`` of the task's ``split`` problems x ``samples`` from the task's LM into
    ``work_dir/split`` (resumed where already collected)."""
    from hf_msv.collect import CollectConfig, collect_from_config

    collect_from_config(
        CollectConfig(
            model=task.lm_name,
            output_dir=str(work_dir / split),
            num_samples=samples,
            problems=f"{task.lm_name}:{split}:{n_problems}:{seed}",
            seed=seed,
            max_new_tokens=max_new_tokens,
            progress=False,
            **({"problems_per_batch": problems_per_batch} if problems_per_batch else {}),
        )
    )


def screen_lm(
    task,
    work_dir: Path,
    n_problems: int,
    samples: int,
    seed: int,
    max_new_tokens: int,
    problems_per_batch: int | None = None,
) -> dict:
    """A cheaper look at an LM than :func:`probe_signal` (e.g. to compare training seeds before the full benchmark):
    collect ``n_problems`` evaluation problems x ``samples`` from the task's LM into ``work_dir/evaluation`` (the
    ones ``--probe`` evaluates on at the same ``--seed``; resumed where already collected) and report what needs no
    Probe: Token-Probs' N = 1 AUROC with its interval and parts, and the trace rows of :func:`shard_statistics`, whose
    pass@1, majority, pass@N and cap share stand in for the sampled rows (the same statistics of the same LM, from
    the collection's chains instead of ``--quick``'s own sampling)."""
    collect_split(task, work_dir, "evaluation", n_problems, samples, seed, max_new_tokens, problems_per_batch)
    res = auroc_intervals(work_dir) | shard_statistics(work_dir / "evaluation")
    res["token_probs_auroc_n1"] = res.pop("token_probs_auroc_n1_pooled")
    stats = {"pass_at_1": "shard_pass_at_1", f"maj_at_{samples}": "shard_maj", "capped_rate": "shard_capped_rate"}
    res |= {key: res[shard] for key, shard in stats.items()}
    res[f"pass_at_{samples}"] = round(res["shard_maj"] + res["shard_pass_minus_maj"], 4)
    return res | {
        "task": task.name,
        "screen_problems": n_problems,
        "samples_per_problem": samples,
        "probe_work_dir": str(work_dir),
    }


def probe_scores(work_dir: Path, samples: int) -> dict:
    """:func:`probe_signal`'s figures from its work directory (the Probe trained, the shards collected): evaluation
    at N = 1 and N = ``samples``. Separate so that shards and Probe brought back from another machine can be scored."""
    from hf_msv.evaluation import EvaluateConfig, evaluate_study

    evaluate_study(
        EvaluateConfig(
            eval_dir=str(work_dir / "evaluation"),
            val_dir=str(work_dir / "validation"),
            output_dir=str(work_dir / "report"),
            verifier=[f"Probe={work_dir / 'probe'}"],
            num_sequences=[1, samples],
            figures=False,
            progress=False,
        )
    )
    report = json.loads((work_dir / "report" / "report.json").read_text())
    one, many = report["terminal"]["1"], report["terminal"][str(samples)]

    def mean(table, method, metric):  # None where undefined (e.g. no right answer): nan, which fails every target
        value = table[method][metric]["mean"]
        return float("nan") if value is None else round(value, 4)

    return {
        "probe_auroc_n1": mean(one, "Probe", "auroc"),
        "token_probs_auroc_n1": mean(one, "Token Probs", "auroc"),
        f"probe_best_of_{samples}": mean(many, "Probe", "bon_accuracy"),
        f"sc_best_of_{samples}": mean(many, "Self-consistency", "bon_accuracy"),
        "probe_pass_at_1": round(report["data"]["eval"]["terminal_accuracy"], 4),
        "probe_work_dir": str(work_dir),
        **auroc_intervals(work_dir),
    }


def terminal_scores(work_dir: Path) -> tuple[list[str], dict, list]:
    """Per evaluation problem of a ``--probe`` (or ``--screen``) work directory: its id, the Probe's
    (``work_dir/probe``, scored as ``hf-msv evaluate`` scores; left out where no Probe was trained) and Token-Probs'
    scores of its terminal answers, and their labels (1 = right).
    Returns ``(ids, {"probe": [(n_p,)], "token_probs": [(n_p,)]}, [(n_p,)])``, one array per problem."""
    from hf_msv.data import ShardDataset
    from hf_msv.evaluation.scoring import score_problems, token_prob_scores
    from hf_msv.evaluation.verifiers import load_verifier

    problems = ShardDataset(work_dir / "evaluation", mode="terminal").read_problems(True)
    rows = [np.flatnonzero(p.answer_terminal) for p in problems]
    labels = [np.asarray(p.answer_correct, dtype=float)[r] for p, r in zip(problems, rows)]
    scores = {"token_probs": [token_prob_scores(p)[r] for p, r in zip(problems, rows)]}
    if (work_dir / "probe").exists():
        probe, _, _ = score_problems(load_verifier(work_dir / "probe"), problems, mode="terminal")
        scores["probe"] = [s[r] for s, r in zip(probe, rows)]
    return [p.problem_id for p in problems], scores, labels


def pooled_auroc(scores: list, labels: list, idx) -> float:
    """AUROC of the answers of problems ``idx`` (an index array, repeats allowed: a bootstrap resample) pooled, from
    per-problem ``scores`` and ``labels`` (one array each per problem)."""
    from hf_msv.metrics import auroc

    return auroc(np.concatenate([scores[i] for i in idx]), np.concatenate([labels[i] for i in idx]))


def auroc_intervals(work_dir: Path, n_boot: int = 1000) -> dict:
    """Percentile-bootstrap 95 % intervals over the evaluation problems of the Probe's and Token-Probs' terminal
    AUROC at N = 1 (every sequence's terminal answer on its own, pooled): how far a row's target is from its noise.
    The Probe in ``work_dir/probe`` scores the ``evaluation`` shards as ``hf-msv evaluate`` does.

    Beside them, the two parts of a pooled N = 1 AUROC: ``difficulty_auroc_n1``, a scorer that knows only each
    problem's accuracy (`hf_msv.metrics.difficulty_scores`: what telling easy problems from hard ones alone earns),
    and each scorer's ``<name>_within_auroc`` (`hf_msv.metrics.within_problem_auroc`: right from wrong answers of one
    problem, which no difficulty estimate can do)."""
    from hf_msv.metrics import bootstrap_interval, difficulty_scores, per_problem_auroc

    _, scores, labels = terminal_scores(work_dir)
    scores["difficulty"] = difficulty_scores(labels)

    def pooled(name):
        return lambda idx: pooled_auroc(scores[name], labels, idx)

    def within(name):  # each problem's AUROC once, not once per resample (1,000 x 96 sklearn calls took minutes)
        values = per_problem_auroc(scores[name], labels)
        return lambda idx: float(np.nanmean(values[idx]))  # within_problem_auroc of the resample (nan: none defined)

    statistics = {f"{name}_auroc_n1": pooled(name) for name in scores}
    statistics |= {f"{name}_within_auroc": within(name) for name in ("probe", "token_probs") if name in scores}
    reported = ("probe_auroc_n1", "token_probs_auroc_n1")  # the evaluation report's rows: recomputed as a check
    out = {}
    with warnings.catch_warnings():  # a resample may hold one class only: its AUROC is nan, counted as +inf
        warnings.simplefilter("ignore")
        for key, statistic in statistics.items():
            iv = bootstrap_interval(statistic, len(labels), n_boot=n_boot)
            out[f"{key}_interval"] = [round(iv["low"], 4), round(iv["high"], 4)]
            out[f"{key}_pooled" if key in reported else key] = round(iv["estimate"], 4)
    return out


def paired_lm_difference(compare: list[Path], against: list[Path], n_boot: int = 1000) -> dict:
    """Is one group of LMs' N = 1 AUROC above another's? ``compare`` and ``against``: ``--probe`` work directories
    (one per LM, e.g. seeds of two training recipes) collected on the same evaluation problems, or ``--screen``
    directories (Token-Probs only, as where any directory has no Probe). For the Probe and Token-Probs: each
    group's mean pooled N = 1 AUROC and the difference (``compare`` - ``against``) with a paired percentile-bootstrap
    95 % interval: every LM is scored on the same resample of the shared problems, so the problems' difficulty,
    which moves every LM's AUROC together, cancels out of the difference."""
    from hf_msv.metrics import bootstrap_interval

    loaded = [terminal_scores(d) for d in [*compare, *against]]
    shared = sorted(set.intersection(*(set(ids) for ids, _, _ in loaded)))
    if not shared:
        raise ValueError("the work directories share no evaluation problem: collect them at the same --seed")
    order = [{pid: i for i, pid in enumerate(ids)} for ids, _, _ in loaded]
    out = {"shared_problems": len(shared), "compare": [str(d) for d in compare], "against": [str(d) for d in against]}
    for name in [n for n in ("token_probs", "probe") if all(n in sc for _, sc, _ in loaded)]:  # --screen: no Probe
        per_lm = [
            ([sc[name][o[pid]] for pid in shared], [lab[o[pid]] for pid in shared])
            for (_, sc, lab), o in zip(loaded, order)
        ]

        def group_mean(lms, idx):
            return float(np.mean([pooled_auroc(s, y, idx) for s, y in lms]))

        def difference(idx, per_lm=per_lm):
            return group_mean(per_lm[: len(compare)], idx) - group_mean(per_lm[len(compare) :], idx)

        with warnings.catch_warnings():  # a resample with one class only: nan, counted as +inf by the bootstrap
            warnings.simplefilter("ignore")
            iv = bootstrap_interval(difference, len(shared), n_boot=n_boot)
        every = np.arange(len(shared))
        out[name] = {
            "compare": round(group_mean(per_lm[: len(compare)], every), 4),
            "against": round(group_mean(per_lm[len(compare) :], every), 4),
            "difference": round(iv["estimate"], 4),
            "interval": [round(iv["low"], 4), round(iv["high"], 4)],
        }
    return out


def shard_statistics(eval_dir: Path) -> dict:
    """The testbed's trace-level targets, read from collected evaluation shards as any user's data would be: per
    sequence its terminal answer, its intermediate answers (one per ``Wait``) in order and whether the length cap cut
    it; per problem the majority of the terminal answers (classes of the collection's checker)."""
    from hf_msv.data import list_shards, read_shard

    seqs, maj, cov = [], [], []  # seqs: (terminal right, intermediate rights in order, capped)
    for shard in list_shards(eval_dir):
        for p in read_shard(shard, hidden=False)[0]:
            votes, right_class = Counter(), {}
            for n, finish in enumerate(p.sequence_finish):
                mine = np.flatnonzero(p.answer_sequence == n)
                mine = mine[np.argsort(p.answer_tau[mine], kind="stable")]
                term = [a for a in mine if p.answer_terminal[a]]
                inter = [bool(p.answer_correct[a]) for a in mine if not p.answer_terminal[a]]
                right = bool(term) and bool(p.answer_correct[term[-1]])
                seqs.append((right, inter, finish != "eos"))
                if term and p.answer_text[term[-1]] is not None:
                    c = int(p.answer_class[term[-1]])
                    votes[c] += 1
                    right_class[c] = right
            maj.append(bool(votes) and right_class[votes.most_common(1)[0][0]])
            cov.append(any(right_class.values()))
    right = np.array([s[0] for s in seqs])
    waits = np.array([len(s[1]) for s in seqs], dtype=float)
    firsts = [(s[1][0], s[0]) for s in seqs if s[1]]
    return {
        "shard_sequences": len(seqs),
        "shard_pass_at_1": round(float(right.mean()), 4),
        "shard_maj": round(float(np.mean(maj)), 4),
        "shard_pass_minus_maj": round(float(np.mean(cov) - np.mean(maj)), 4),
        "elicited_per_sequence": round(float(waits.mean() + 1), 3),
        "first_intermediate_acc": round(float(np.mean([f for f, _ in firsts])), 4),
        "terminal_acc_same_sequences": round(float(np.mean([t for _, t in firsts])), 4),
        "waits_wrong": round(float(waits[~right].mean()), 3) if (~right).any() else float("nan"),
        "waits_right": round(float(waits[right].mean()), 3) if right.any() else float("nan"),
        "shard_capped_rate": round(float(np.mean([s[2] for s in seqs])), 4),
    }


def shard_chains(eval_dir: Path, task, seed: int) -> list[tuple]:
    """(problem, chain texts) of collected v2 evaluation shards (their sampled tokens), the problems regenerated from
    the shards' ids (the ``evaluation`` split at ``seed``, as ``--probe`` collects it)."""
    from hf_msv.data import list_shards, read_shard
    from hf_msv.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    chains = {
        p.problem_id: [tok.decode(ids.tolist(), skip_special_tokens=True) for ids in p.cot_token_ids]
        for shard in list_shards(eval_dir)
        for p in read_shard(shard, hidden=False)[0]
    }
    problems = {q.id: q for q in task.generate_problems("evaluation", len(chains), seed=seed)}
    if set(chains) - set(problems):
        raise ValueError(
            f"{eval_dir}: problems {sorted(set(chains) - set(problems))[:3]} are not the first "
            f"{len(chains)} of {task.name}'s evaluation split at seed {seed}: pass the --seed they used"
        )
    return [(problems[pid], texts) for pid, texts in chains.items()]


def writer_comparison(chains, task, knobs: dict, seed: int) -> dict:
    """:func:`~hf_msv.testbed.task_v2.trace_errors`' rates of the LM's chains (``(problem, texts)`` pairs) and of as
    many traces of the task's writer for the same problems (``lm_trace_errors`` / ``solver_trace_errors``)."""
    rng, lm, solver = random.Random(seed), Counter(), Counter()
    for problem, texts in chains:
        lm += trace_errors(texts, problem)
        solver += trace_errors([task.module.sample_trace(problem, rng, **knobs).capped_text for _ in texts], problem)
    return {"lm_trace_errors": error_rates(lm), "solver_trace_errors": error_rates(solver)}


def targets(res: dict) -> list[tuple[str, str, str, bool]]:
    """The testbed's target rows that ``res`` measured: (row, target, measured, passed)."""
    rows = []

    def row(name, target, keys, text, ok):
        if all(k in res for k in keys):
            rows.append((name, target, text(), bool(ok())))

    S = res["samples_per_problem"]

    def with_interval(key):  # the estimate and, when measured, its 95 % interval over problems
        iv = res.get(key + "_interval")
        return f"{res[key]:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")

    row(
        "Probe terminal AUROC, N = 1",
        ">= 0.80",
        ["probe_auroc_n1"],
        lambda: with_interval("probe_auroc_n1"),
        lambda: res["probe_auroc_n1"] >= 0.80,
    )
    row(
        "Token-Probs AUROC, N = 1",
        ">= 0.70",
        ["token_probs_auroc_n1"],
        lambda: with_interval("token_probs_auroc_n1"),
        lambda: res["token_probs_auroc_n1"] >= 0.70,
    )
    bon = f"probe_best_of_{S}"
    row(
        f"Probe best-of-{S} vs pass@1",
        "+0.10",
        [bon, "probe_pass_at_1"],
        lambda: f"{res[bon]:.3f} vs {res['probe_pass_at_1']:.3f}",
        lambda: res[bon] >= res["probe_pass_at_1"] + 0.10,
    )
    maj, cover = f"maj_at_{S}", f"pass_at_{S}"
    row(f"majority right (maj@{S})", "<= 0.75", [maj], lambda: f"{res[maj]:.3f}", lambda: res[maj] <= 0.75)
    row(
        f"pass@{S} - maj@{S}",
        ">= 0.15",
        [maj, cover],
        lambda: f"{res[cover] - res[maj]:.3f}",
        lambda: res[cover] - res[maj] >= 0.15,
    )
    row(
        "elicited answers / sequence",
        ">= 6",
        ["elicited_per_sequence"],
        lambda: f"{res['elicited_per_sequence']:.2f}",
        lambda: res["elicited_per_sequence"] >= 6,
    )
    row(
        "first intermediate acc vs terminal",
        ">= 10 pp below",
        ["first_intermediate_acc", "terminal_acc_same_sequences"],
        lambda: f"{res['first_intermediate_acc']:.3f} vs {res['terminal_acc_same_sequences']:.3f}",
        lambda: res["terminal_acc_same_sequences"] - res["first_intermediate_acc"] >= 0.10,
    )
    row(
        "Waits / trace, wrong vs right",
        "wrong higher",
        ["waits_wrong", "waits_right"],
        lambda: f"{res['waits_wrong']:.2f} vs {res['waits_right']:.2f}",
        lambda: res["waits_wrong"] > res["waits_right"],
    )
    row(
        "cap-binding share",
        "0.10-0.40",
        ["capped_rate"],
        lambda: f"{res['capped_rate']:.3f}",
        lambda: 0.10 <= res["capped_rate"] <= 0.40,
    )
    row(
        "pass@1",
        "0.30-0.60",
        ["pass_at_1"],
        lambda: f"{res['pass_at_1']:.3f}",
        lambda: 0.30 <= res["pass_at_1"] <= 0.60,
    )
    row(
        "mean trace tokens",
        "<= 400",
        ["mean_trace_tokens"],
        lambda: f"{res['mean_trace_tokens']:.0f}",
        lambda: res["mean_trace_tokens"] <= 400,
    )
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--task",
        choices=sorted(TASKS),
        default=DEFAULT_TASK,
        help="v2: the testbed; v1: the first testbed, once research/testbed_v1 registered it",
    )
    ap.add_argument("--model-dir", default=None, help="default: the task's LM (v2: hf_msv/testbed/lm-v2)")
    ap.add_argument("--quick", action="store_true", help="64 problems instead of 448")
    ap.add_argument("--n-problems", type=int, default=None)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--problems-per-call", type=int, default=16)
    ap.add_argument("--elicit-samples", type=int, default=2, help="samples per problem whose Waits are elicited")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: v1 224, v2 its length cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--knobs", default="{}", help="JSON dict of the task's knobs for the evaluation problems")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="decode_tokens_per_s is only meaningful for the machine named")
    ap.add_argument(
        "--probe",
        action="store_true",
        help="also measure the per-chain signal with the library: collect "
        "shards from the task's LM, train a terminal Probe, evaluate (probe_signal; needs the LM in the "
        "task's directory, not --model-dir)",
    )
    ap.add_argument(
        "--probe-problems",
        default="384,32,96",
        help="train,validation,evaluation problems for --probe (96,32,96 takes ~7 min less on 2 cores, "
        "but a Probe on 96 x 16 training sequences has not learnt which problems are hard)",
    )
    ap.add_argument(
        "--probe-batch",
        type=int,
        default=None,
        help="problems per collection batch for --probe (default: collection's, one; 32 on a GPU)",
    )
    ap.add_argument("--probe-dir", default=None, help="--probe's shards and report (default: a temporary directory)")
    ap.add_argument(
        "--score-only",
        action="store_true",
        help="score the shards and Probe already in --probe-dir "
        "(e.g. brought back from a GPU machine) and sample nothing: the Probe and shard rows only",
    )
    ap.add_argument(
        "--screen",
        type=int,
        default=None,
        metavar="N",
        help="only collect N evaluation problems from "
        "the task's LM (into --probe-dir, batches of --probe-batch) and report the rows that need no Probe "
        "(Token-Probs, the shard rows): a cheaper look, e.g. to compare training seeds (screen_lm)",
    )
    ap.add_argument(
        "--compare",
        default=None,
        help="comma-separated --probe-dirs of one group of LMs (e.g. seeds of "
        "one recipe), scored against --against's on their shared evaluation problems: paired difference of "
        "the N = 1 AUROC with a bootstrap interval; samples nothing",
    )
    ap.add_argument(
        "--against", default=None, help="comma-separated --probe-dirs of the group --compare is measured against"
    )
    a = ap.parse_args(argv)
    if a.compare or a.against:
        if not (a.compare and a.against):
            ap.error("--compare and --against go together")
        res = paired_lm_difference([Path(d) for d in a.compare.split(",")], [Path(d) for d in a.against.split(",")])
        print(json.dumps(res))
        return res
    task, knobs = TASKS[a.task], json.loads(a.knobs)
    if a.score_only:
        if not a.probe_dir:
            ap.error("--score-only scores an existing --probe-dir")
        work, res = Path(a.probe_dir), {"samples_per_problem": a.samples}
        if a.task == "v2":  # first: it refuses shards of other problems than --seed's
            res |= writer_comparison(shard_chains(work / "evaluation", task, a.seed), task, knobs, a.seed)
        return print_targets(res | probe_scores(work, a.samples) | shard_statistics(work / "evaluation"))
    if a.probe and a.model_dir and Path(a.model_dir).resolve() != task.lm_dir.resolve():
        ap.error(f"--probe collects from the task's LM directory ({task.lm_dir}): copy the LM there")
    if a.threads:
        torch.set_num_threads(a.threads)
    max_new_tokens = a.max_new_tokens or task.sampling_cap(knobs) or 224
    if a.screen:
        import tempfile

        work = Path(a.probe_dir) if a.probe_dir else Path(tempfile.mkdtemp(prefix="testbed-screen-"))
        return print_targets(screen_lm(task, work, a.screen, a.samples, a.seed, max_new_tokens, a.probe_batch))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_start = time.time()
    model_dir = a.model_dir or str(task.lm_dir)
    format_prompt = task.module.format_prompt
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(a.device).eval()
    wait_id = tok.convert_tokens_to_ids(DELIMITER)
    n_problems = a.n_problems or (64 if a.quick else 448)
    problems = task.generate_problems("evaluation", n_problems, seed=a.seed, **knobs)
    torch.manual_seed(a.seed)
    S = a.samples
    gen_kw = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )

    # ---- sampling
    traces = []  # per problem: list of (prompt ids, generated ids)
    capped, t0 = 0, time.time()
    for c in range(0, len(problems), a.problems_per_call):
        chunk = problems[c : c + a.problems_per_call]
        enc = tok([format_prompt(p) for p in chunk], return_tensors="pt", padding=True).to(a.device)
        with torch.no_grad():
            out = model.generate(**enc, num_return_sequences=S, **gen_kw)
        P = enc.input_ids.shape[1]
        for i in range(len(chunk)):
            prompt = enc.input_ids[i][enc.attention_mask[i].bool()].tolist()
            rows = []
            for s in range(S):
                g = out[i * S + s, P:].tolist()
                if tok.eos_token_id in g:
                    g = g[: g.index(tok.eos_token_id)]
                else:
                    capped += 1  # ran into max_new_tokens (v2: its length cap)
                g = [t for t in g if t != tok.pad_token_id]
                rows.append((prompt, g))
            traces.append(rows)
        print(
            f"sampled {min(c + a.problems_per_call, len(problems))}/{len(problems)} problems "
            f"({time.time() - t0:.0f}s)",
            flush=True,
        )
    sample_s = time.time() - t0

    p1 = maj_k = cover_k = 0.0
    n_traces = with_wait = n_waits = boxed = gen_tokens = 0
    finals = []
    for p, rows in zip(problems, traces):
        answers = [final_answer(tok.decode(g, skip_special_tokens=True)) for _, g in rows]
        finals.append(answers)
        correct = [x == p.gold for x in answers]
        p1 += sum(correct) / S
        cover_k += any(correct)
        votes = Counter(x for x in answers if x is not None)
        maj_k += bool(votes) and votes.most_common(1)[0][0] == p.gold
        for _, g in rows:
            w = g.count(wait_id)
            n_traces += 1
            with_wait += w > 0
            n_waits += w
            gen_tokens += len(g)
        boxed += sum(x is not None for x in answers)

    # ---- elicitation at every Wait of the first few samples per problem, and at the end of the same traces
    elicit_prompt = tok(ELICITATION_PROMPT, add_special_tokens=False).input_ids
    jobs = []  # (prefix ids, gold, trace index, is_terminal)
    sampled_final = {}  # trace index -> the final box the trace itself sampled
    for pi, (p, rows, answers) in enumerate(zip(problems, traces, finals)):
        for si, ((prompt, g), fin) in enumerate(list(zip(rows, answers))[: a.elicit_samples]):
            key = (pi, si)
            sampled_final[key] = fin
            for j, t in enumerate(g):
                if t == wait_id:
                    jobs.append((prompt + g[: j + 1] + elicit_prompt, p.gold, key, False))
            # terminal answer, elicited as the paper (and the collection) does: the prompt appended to the
            # finished trace, its own final answer line included
            jobs.append((prompt + g + elicit_prompt, p.gold, key, True))
    t1 = time.time()
    elicited = {}  # job index -> answer
    for c in range(0, len(jobs), 256):
        batch = jobs[c : c + 256]
        ids, att = left_pad([j[0] for j in batch], tok.pad_token_id)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(a.device),
                attention_mask=att.to(a.device),
                do_sample=False,
                max_new_tokens=40,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        for k, row in enumerate(out[:, ids.shape[1] :]):
            elicited[c + k] = parse_box(tok.decode(row, skip_special_tokens=True))
    terminal = {j[2]: elicited[i] for i, j in enumerate(jobs) if j[3]}
    inter = [(elicited[i], j[1], j[2]) for i, j in enumerate(jobs) if not j[3]]
    parsed = sum(x is not None for x, _, _ in inter)
    inter_correct = sum(x == gold for x, gold, _ in inter)
    # paired with each intermediate answer: the answer its trace ends with (elicited / sampled)
    term_correct = sum(terminal[key] == gold for _, gold, key in inter)
    sampled_correct = sum(sampled_final[key] == gold for _, gold, key in inter)
    # the paper's terminal elicitation must give back the answer the trace wrote itself
    agreement = sum(terminal[k] == sampled_final[k] for k in terminal) / max(len(terminal), 1)
    elicit_s = time.time() - t1

    # ---- decode throughput, 64 sequences in parallel
    enc = tok([format_prompt(problems[0])], return_tensors="pt").to(a.device)
    with torch.no_grad():
        model.generate(**enc, num_return_sequences=64, **{**gen_kw, "max_new_tokens": 16})  # warm-up
        t2 = time.time()
        out = model.generate(**enc, num_return_sequences=64, **gen_kw)
        dt = time.time() - t2
    new = out[:, enc.input_ids.shape[1] :]
    n_new = int(((new != tok.pad_token_id) & (new != tok.eos_token_id)).sum())

    nE = max(len(inter), 1)
    res = {
        "task": task.name,
        "n_problems": len(problems),
        "knobs": knobs,
        "samples_per_problem": S,
        "pass_at_1": round(p1 / len(problems), 4),
        f"maj_at_{S}": round(maj_k / len(problems), 4),  # at the --samples drawn per problem
        f"pass_at_{S}": round(cover_k / len(problems), 4),
        "final_box_rate": round(boxed / n_traces, 4),
        "wait_trace_rate": round(with_wait / n_traces, 4),
        "waits_per_trace": round(n_waits / n_traces, 3),
        "mean_trace_tokens": round(gen_tokens / n_traces, 1),
        "max_new_tokens": max_new_tokens,
        "capped_rate": round(capped / n_traces, 4),
        "n_elicited": len(inter),
        "elicit_parse_rate": round(parsed / nE, 4),
        "intermediate_acc": round(inter_correct / nE, 4),
        "terminal_acc": round(term_correct / nE, 4),
        "terminal_sampled_acc": round(sampled_correct / nE, 4),
        "terminal_elicit_agreement": round(agreement, 4),
        "decode_tokens_per_s": round(n_new / dt, 1),
        "decode_sequences": 64,
        "sample_s": round(sample_s, 1),
        "elicit_s": round(elicit_s, 1),
        "wall_s": round(time.time() - t_start, 1),
        "torch_threads": torch.get_num_threads(),
        "device": str(model.device),
        "model_dir": str(Path(model_dir)),
    }
    if a.probe:
        import tempfile

        sizes = [int(x) for x in a.probe_problems.split(",")]
        work = Path(a.probe_dir) if a.probe_dir else Path(tempfile.mkdtemp(prefix="testbed-probe-"))
        res |= probe_signal(task, work, sizes, S, a.seed, max_new_tokens, a.probe_batch)
        res |= shard_statistics(work / "evaluation")
        res["wall_s"] = round(time.time() - t_start, 1)
    if task.name == "v2":  # where the LM's traces depart from its solver's, on the same problems
        res |= writer_comparison(
            [(p, [tok.decode(g, skip_special_tokens=True) for _, g in rows]) for p, rows in zip(problems, traces)],
            task,
            knobs,
            a.seed,
        )
    return print_targets(res)


def print_targets(res: dict) -> dict:
    """Print the target rows that ``res`` measured (PASS / FAIL), then ``res`` as the JSON last line."""
    rows = targets(res)
    if rows:
        print(f"{'testbed target':<40} {'target':<16} {'measured':<24} verdict")
        for name, target, measured, ok in rows:
            print(f"{name:<40} {target:<16} {measured:<24} {'PASS' if ok else 'FAIL'}")
        res["targets_passed"], res["targets_measured"] = sum(r[3] for r in rows), len(rows)
    if "difficulty_auroc_n1" in res:  # not a target: where the N = 1 AUROC rows come from
        parts = [
            ("difficulty only", "difficulty_auroc_n1"),
            ("Probe within a problem", "probe_within_auroc"),
            ("Token-Probs within a problem", "token_probs_within_auroc"),
        ]
        print(
            "N = 1 AUROC parts: "
            + "; ".join(
                f"{name} {res[key]:.3f} [{res[key + '_interval'][0]:.3f}, {res[key + '_interval'][1]:.3f}]"
                for name, key in parts
                if key in res
            )
        )
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
