"""Has a testbed v2 LM learnt its writer's elicitation rule? (the Token-Probs ceiling; CPU, ~10 s)

Backs docs/testbed.md ("Token-Probs stays near 0.63-0.69: no LM learns its writer's self-evaluation").

    python research/elicitation_fidelity.py                    # the shipped LM (hf_msv/testbed/lm-v2)
    python research/elicitation_fidelity.py --model-dir DIR    # another v2 LM

On the *writer's* capped traces (the LM's training distribution; nothing depends on how the LM samples) it feeds
each trace and the elicitation prompt to the LM and reads the LM's probability of the writer's most likely terminal
answer, beside the writer's exact one (:func:`hf_msv.testbed.task_v2.answer_distribution`). Rows: AUROC of terminal
correctness for the writer's probability, the writer without its self-evaluation's unease, the writer with its
clause reading's unease alone, the LM's probability and its per-token geometric mean (Token-Probs' score); the
Spearman correlation of the LM's probabilities with the writer's; on problems with an irrelevant clause, both mean
probabilities for chains that took it and chains that left it. The writer is the one the LM was trained on (the
``knobs`` of its ``training_log.json``). The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from hf_msv.answers import ELICITATION_PROMPT
from hf_msv.testbed import TESTBED_V2_LM_DIR, load_testbed_lm, task_v2


def writer_terminal_answers(problems, traces: int, seed: int, knobs: dict | None = None) -> list[dict]:
    """Per writer trace (``knobs``: the writer's, those the LM was trained on): its capped text, the most likely
    terminal answer, whether it is right, the writer's probability of it with and without self-evaluation's unease,
    and how the chain read the irrelevant clause (``clause``: ``"taken"``, ``"left"``, or None without one)."""
    rng, rows, knobs = random.Random(seed), [], dict(knobs or {})
    for p in problems:
        for _ in range(traces):
            t = task_v2.sample_trace(p, rng, **knobs)
            dist = task_v2.answer_distribution(t.terminal, p, **knobs)
            answer = max(dist, key=dist.get)
            blind = task_v2.answer_distribution(dataclasses.replace(t.terminal, unease=0.0), p, **knobs)
            reading = task_v2.answer_distribution(
                dataclasses.replace(t.terminal, unease=t.terminal.reading_unease), p, **knobs
            )
            clause = ("taken" if t.took_clause else "left") if p.meta.get("distractor") else None
            rows.append(
                dict(
                    problem=p,
                    text=t.capped_text,
                    answer=answer,
                    right=answer == p.gold,
                    writer=dist[answer],
                    writer_blind=blind.get(answer, 0.0),
                    writer_reading=reading.get(answer, 0.0),
                    clause=clause,
                )
            )
    return rows


@torch.no_grad()
def lm_answer_logprobs(model, tok, rows: list[dict], batch: int = 32) -> list[np.ndarray]:
    """Per row, `(L,)` the LM's log-probabilities of the answer's tokens (``{``, digits, ``}``) after the prompt,
    the capped trace and the elicitation prompt; right-padded batches (causal: pads never reach real positions)."""
    seqs = []
    for r in rows:
        context = [tok.bos_token_id] + tok(
            task_v2.format_prompt(r["problem"]) + r["text"] + ELICITATION_PROMPT, add_special_tokens=False
        ).input_ids
        seqs.append((context, tok("{" + r["answer"] + "}", add_special_tokens=False).input_ids))
    out: list = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    for lo in range(0, len(order), batch):
        idx = order[lo : lo + batch]
        width = max(len(seqs[i][0]) + len(seqs[i][1]) for i in idx)
        ids = torch.full((len(idx), width), tok.pad_token_id, dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, : len(seqs[i][0]) + len(seqs[i][1])] = torch.tensor(seqs[i][0] + seqs[i][1])
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
        for row, i in enumerate(idx):
            context, answer = seqs[i]
            at = torch.arange(len(context) - 1, len(context) - 1 + len(answer))
            out[i] = logp[row, at, torch.tensor(answer)].numpy()
    return out


def fidelity(model, tok, problems, traces: int = 8, seed: int = 0, knobs: dict | None = None) -> dict:
    rows = writer_terminal_answers(problems, traces, seed, knobs)
    logprobs = lm_answer_logprobs(model, tok, rows)
    right = np.array([r["right"] for r in rows])
    writer, blind = np.array([r["writer"] for r in rows]), np.array([r["writer_blind"] for r in rows])
    reading = np.array([r["writer_reading"] for r in rows])
    lm = np.array([np.exp(lp.sum()) for lp in logprobs])
    geo = np.array([np.exp(lp.mean()) for lp in logprobs])
    return {
        "traces": len(rows),
        "terminal_accuracy": round(float(right.mean()), 4),
        "writer_auroc": round(roc_auc_score(right, writer), 4),
        "writer_without_self_evaluation_auroc": round(roc_auc_score(right, blind), 4),
        "writer_reading_only_auroc": round(roc_auc_score(right, reading), 4),
        "lm_auroc": round(roc_auc_score(right, lm), 4),
        "lm_token_probs_auroc": round(roc_auc_score(right, geo), 4),
        "spearman_lm_writer": round(float(spearmanr(lm, writer)[0]), 4),
        "mean_abs_lm_minus_writer": round(float(np.abs(lm - writer).mean()), 4),
        "mean_writer": round(float(writer.mean()), 4),
        "mean_lm": round(float(lm.mean()), 4),
        **clause_means(rows, writer, lm),
    }


def clause_means(rows: list[dict], writer: np.ndarray, lm: np.ndarray) -> dict:
    """Mean writer / LM probability of the terminal answer on problems with an irrelevant clause, for chains that
    took it (a misreading the writer's self-evaluation hedges) and chains that left it: does the LM hedge too?"""
    out = {}
    for reading in ("taken", "left"):
        m = np.array([r["clause"] == reading for r in rows])
        out[f"clause_{reading}_traces"] = int(m.sum())
        out[f"writer_mean_clause_{reading}"] = round(float(writer[m].mean()), 4) if m.any() else None
        out[f"lm_mean_clause_{reading}"] = round(float(lm[m].mean()), 4) if m.any() else None
    return out


def trained_knobs(model_dir: Path) -> dict:
    """The writer knobs an LM was trained with (``training_log.json["knobs"]``; {} when it has no log)."""
    log = model_dir / "training_log.json"
    return json.loads(log.read_text()).get("knobs", {}) if log.exists() else {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=None, help="a v2 LM (default: the shipped one)")
    ap.add_argument("--problems", type=int, default=96, help="evaluation problems (the benchmark's seed-0 ones)")
    ap.add_argument("--traces", type=int, default=8, help="writer traces per problem")
    ap.add_argument("--seed", type=int, default=0, help="the problems' seed (the traces are drawn with seed + 11)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model_dir:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(a.model_dir).eval()
        tok = AutoTokenizer.from_pretrained(a.model_dir)
    else:
        model, tok = load_testbed_lm()
    knobs = trained_knobs(Path(a.model_dir or TESTBED_V2_LM_DIR))
    t0 = time.time()
    problems = task_v2.generate_problems("evaluation", a.problems, seed=a.seed)
    out = fidelity(model, tok, problems, a.traces, a.seed + 11, knobs)
    out.update(model=a.model_dir or "testbed", knobs=knobs, problems=a.problems, wall_s=round(time.time() - t0, 1))
    print(
        f"writer AUROC {out['writer_auroc']} (without self-evaluation {out['writer_without_self_evaluation_auroc']},"
        f" its clause reading's unease alone {out['writer_reading_only_auroc']});"
        f" LM {out['lm_auroc']} (Token-Probs {out['lm_token_probs_auroc']}); Spearman LM-writer "
        f"{out['spearman_lm_writer']}; on a taken / left clause: writer {out['writer_mean_clause_taken']} / "
        f"{out['writer_mean_clause_left']}, LM {out['lm_mean_clause_taken']} / {out['lm_mean_clause_left']}"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
