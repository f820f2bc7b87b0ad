"""Synthetic streaming answer groups shaped like the paper's largest setting, shared by the verifier benchmarks."""

import torch


def synthetic_stream(
    num_sequences: int,
    answers_per_sequence: int,
    answer_tokens: int,
    hidden_size: int,
    num_classes: int = 8,
    seed: int = 0,
    dtype=torch.float32,
):
    """One group of N sequences, each eliciting `answers_per_sequence` answers of `answer_tokens` tokens at
    random delimiter times. Returns the packed verifier inputs, answers sorted by end time."""
    g = torch.Generator().manual_seed(seed)
    gaps = torch.randint(50, 350, (num_sequences, answers_per_sequence), generator=g)
    ends = gaps.cumsum(1) + answer_tokens
    sequence = torch.arange(num_sequences).repeat_interleave(answers_per_sequence)
    step = torch.arange(answers_per_sequence).repeat(num_sequences)
    end = ends.flatten()
    order = torch.argsort(end, stable=True)
    num_answers = len(order)
    return dict(
        hidden_states=torch.randn(num_answers * answer_tokens, hidden_size, generator=g).to(dtype),
        token_answer=torch.arange(num_answers).repeat_interleave(answer_tokens),
        answer_group=torch.zeros(num_answers, dtype=torch.long),
        answer_sequence=sequence[order],
        answer_step=step[order],
        answer_end=end[order],
        answer_class=torch.randint(0, num_classes, (num_answers,), generator=g),
    )


def select_answers(inputs: dict, start: int, stop: int) -> dict:
    """Answers [start, stop) of a stream built by `synthetic_stream` (tokens are contiguous, in answer order)."""
    tokens_per_answer = int((inputs["token_answer"] == 0).sum())
    out = {k: v[start:stop] for k, v in inputs.items() if k.startswith("answer_")}
    out["hidden_states"] = inputs["hidden_states"][start * tokens_per_answer : stop * tokens_per_answer]
    out["token_answer"] = inputs["token_answer"][start * tokens_per_answer : stop * tokens_per_answer] - start
    return out


def arrival_batches(inputs: dict, max_answers: int):
    """Index ranges [start, stop) of at most ~`max_answers` answers that never split answers ending together
    (those see each other, so online scoring must receive them in one call)."""
    ends = inputs["answer_end"].tolist()
    start = 0
    while start < len(ends):
        stop = min(start + max_answers, len(ends))
        while stop < len(ends) and ends[stop] == ends[stop - 1]:
            stop += 1
        yield start, stop
        start = stop
