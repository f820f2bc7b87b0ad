"""Synthetic collected problems and shard directories shaped like collected data (the shard, dataset, CLI and
training tests): `make_problem` builds one `CollectedProblem` of random answers, `write_dataset` a directory of
shards; `D` is their hidden size."""

from __future__ import annotations

import numpy as np
import torch

from hf_msv.data import CollectedProblem, write_shard

D = 16


def make_problem(
    pid: str, num_sequences: int = 6, seed: int = 0, d: int = D, max_answers: int = 4, none_rate: float = 0.15
) -> CollectedProblem:
    """A synthetic problem shaped like collected data: each sequence has 1..max_answers answers at increasing τ
    (the last one terminal), answers of 1..5 tokens, a few "no answer"s, classes by online assignment of texts."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in range(num_sequences):
        k_count = int(rng.integers(1, max_answers + 1))
        taus = np.sort(rng.choice(np.arange(1, 60), size=k_count, replace=False))
        for k, tau in enumerate(taus):
            text = None if rng.random() < none_rate else str(int(rng.integers(0, 4)))
            rows.append((int(tau), n, k, k == k_count - 1, text, int(rng.integers(1, 6))))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))  # elicitation order
    classes, seen = [], {}
    for r in rows:
        if r[4] is None:
            classes.append(1000 + len(classes))  # "no answer": a class of its own
        else:
            classes.append(seen.setdefault(r[4], len(seen)))
    lengths = [r[5] for r in rows]
    t = sum(lengths)
    seq_len = [max(r[0] for r in rows if r[1] == n) + 1 for n in range(num_sequences)]
    return CollectedProblem(
        problem_id=pid,
        gold="1",
        source="synthetic",
        question=f"What is {pid}?",
        hidden_states=torch.from_numpy(rng.normal(size=(t, d)).astype(np.float32)) * 3,
        token_ids=rng.integers(0, 100, size=t),
        token_logprobs=-rng.random(t).astype(np.float32),
        answer_text=[r[4] for r in rows],
        answer_raw_text=[f"{{{r[4]}}}" if r[4] else "{" for r in rows],
        answer_trigger=["eos" if r[3] else "delimiter" for r in rows],
        answer_sequence=[r[1] for r in rows],
        answer_step=[r[2] for r in rows],
        answer_tau=[r[0] for r in rows],
        answer_length=lengths,
        answer_class=classes,
        answer_terminal=[r[3] for r in rows],
        answer_correct=[r[4] == "1" for r in rows],
        sequence_length=seq_len,
        sequence_finish=["eos"] * num_sequences,
        cot_confidence=[rng.random(n).astype(np.float32) for n in seq_len],
        cot_token_ids=[rng.integers(0, 50_000, size=n) for n in seq_len],
    )


def write_dataset(directory, num_problems=5, per_shard=2, num_sequences=6, seed=0, d=D):
    problems = [make_problem(f"q{i}", num_sequences, seed * 1000 + i, d) for i in range(num_problems)]
    for s in range(0, num_problems, per_shard):
        write_shard(
            directory / f"shard-r000-{s // per_shard:05d}.safetensors",
            problems[s : s + per_shard],
            info={"lm_name_or_path": "synthetic", "lm_num_attention_heads": 2, "checker": "exact"},
        )
    return problems


def steady_problem(pid: str, rng, num_sequences: int = 8, d: int = D, answers: int = 6, strength: float = 0.6):
    """A streaming problem whose chains settle at once: chain n answers its one class `answers` times, 25 tokens
    apart, the last time at its end (3 candidate answers, the correct one by chance; each answer's tokens carry a
    noisy ±`strength` mark on dimension 0, + for the correct answer). Pruning a chain once its answers repeat
    saves tokens and changes no answer: a pruning rule certifies on a few problems."""
    texts = ["a", "b", "c"]
    correct = texts[int(rng.integers(0, 3))]
    weights = rng.dirichlet([1.0, 1.0, 1.0])
    held = [texts[int(rng.choice(3, p=weights))] for _ in range(num_sequences)]
    rows = []  # (τ, sequence, step, terminal, text, length)
    for n in range(num_sequences):
        base = int(rng.integers(5, 20))
        rows += [(base + 25 * k, n, k, k == answers - 1, held[n], int(rng.integers(2, 4))) for k in range(answers)]
    rows.sort(key=lambda r: (r[0], r[1], r[2]))  # elicitation order
    lengths = np.array([r[5] for r in rows])
    states = rng.normal(size=(int(lengths.sum()), d)).astype(np.float32)
    states[:, 0] += np.repeat([2 * strength if r[4] == correct else -2 * strength for r in rows], lengths)
    classes = {a: i for i, a in enumerate(dict.fromkeys(r[4] for r in rows))}
    ends = {r[1]: r[0] for r in rows if r[3]}
    t = int(lengths.sum())
    return CollectedProblem(
        problem_id=pid,
        gold=correct,
        source="synthetic",
        hidden_states=torch.from_numpy(states),
        token_ids=np.zeros(t, dtype=np.int64),
        token_logprobs=np.zeros(t, dtype=np.float32),
        answer_text=[r[4] for r in rows],
        answer_raw_text=[r[4] for r in rows],
        answer_trigger=["eos" if r[3] else "delimiter" for r in rows],
        answer_sequence=[r[1] for r in rows],
        answer_step=[r[2] for r in rows],
        answer_tau=[r[0] for r in rows],
        answer_length=lengths,
        answer_class=[classes[r[4]] for r in rows],
        answer_terminal=[r[3] for r in rows],
        answer_correct=[r[4] == correct for r in rows],
        sequence_length=[ends[n] + 1 for n in range(num_sequences)],
        sequence_finish=["eos"] * num_sequences,
    )
