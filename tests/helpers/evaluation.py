"""Synthetic collected splits whose correctness is visible in the hidden states (the evaluation and reuse tests, and
research/tests): `synth_problem` builds one `CollectedProblem` whose correct answers shift hidden dimension 0,
`write_split` a directory of shards of them; `D` is their hidden size."""

from __future__ import annotations

import numpy as np
import torch

from hf_msv.data import CollectedProblem, write_shard

D = 16


def synth_problem(pid: str, num_sequences: int = 8, seed: int = 0, d: int = D, signal: float = 1.5):
    """Answers "1" (correct, gold) or "2".."4" (wrong) or no answer; correctness shifts hidden dim 0 by ±signal."""
    rng = np.random.default_rng(seed)
    p_correct = rng.uniform(0.1, 0.9)
    rows = []
    for n in range(num_sequences):
        k_count = int(rng.integers(1, 4))
        taus = np.sort(rng.choice(np.arange(2, 80), size=k_count, replace=False))
        for k, tau in enumerate(taus):
            u = rng.random()
            text = "1" if u < p_correct else (None if u > 0.95 else str(int(rng.integers(2, 5))))
            rows.append((int(tau), n, k, k == k_count - 1, text, int(rng.integers(1, 4))))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    classes, seen = [], {}
    for r in rows:
        classes.append(1000 + len(classes) if r[4] is None else seen.setdefault(r[4], len(seen)))
    lengths = [r[5] for r in rows]
    correct = np.array([r[4] == "1" for r in rows])
    h = rng.normal(size=(sum(lengths), d)).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for a, (s, length) in enumerate(zip(starts, lengths)):
        h[s : s + length, 0] += signal * (1 if correct[a] else -1)
    seq_len = [max(r[0] for r in rows if r[1] == n) for n in range(num_sequences)]
    logp = np.log(np.clip(0.5 * rng.random(len(h)) + 0.45 * np.repeat(correct, lengths), 1e-3, 1.0))
    return CollectedProblem(
        problem_id=pid,
        gold="1",
        source="synthetic",
        hidden_states=torch.from_numpy(h),
        token_ids=rng.integers(0, 100, size=len(h)),
        token_logprobs=logp.astype(np.float32),
        answer_text=[r[4] for r in rows],
        answer_raw_text=[f"{{{r[4]}}}" for r in rows],
        answer_trigger=["eos" if r[3] else "delimiter" for r in rows],
        answer_sequence=[r[1] for r in rows],
        answer_step=[r[2] for r in rows],
        answer_tau=[r[0] for r in rows],
        answer_length=lengths,
        answer_class=classes,
        answer_terminal=[r[3] for r in rows],
        answer_correct=correct,
        sequence_length=[s + 1 for s in seq_len],
        sequence_finish=["eos"] * num_sequences,
        cot_confidence=[rng.random(s + 1).astype(np.float32) + 0.5 for s in seq_len],
    )


def write_split(directory, count: int, seed: int, num_sequences: int = 8, per_shard: int = 8, info=None):
    directory.mkdir(parents=True, exist_ok=True)
    problems = [synth_problem(f"{directory.name}/{i}", num_sequences, seed * 10000 + i) for i in range(count)]
    for s in range(0, count, per_shard):
        write_shard(
            directory / f"shard-r000-{s // per_shard:05d}.safetensors",
            problems[s : s + per_shard],
            info=info
            or {
                "lm_name_or_path": "synthetic",
                "lm_num_attention_heads": 2,
                "checker": "exact",
                "delimiters": ["Wait"],
                "num_samples": num_sequences,
            },
        )
    return directory
