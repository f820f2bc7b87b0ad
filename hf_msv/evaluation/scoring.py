"""Scores of collected answers: trained verifiers over groups (offline, packed by `hf_msv.data.collate_groups`),
their online cost, the verifier-free baselines' raw scores, and the LM's latency costs.

Groups are read with `hf_msv.data.ShardDataset.group` (or `hf_msv.data.read_group` on records that carry their
hidden states) and packed by `collate_groups`: the same reader and packer as training, so a verifier sees at
evaluation exactly the inputs it was trained and validated on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..baselines import deepconf_streaming, token_prob_score
from ..data import CollectedProblem, ShardDataset, collate_groups, read_group
from .early_stop import LatencyCosts

__all__ = [
    "score_problems",
    "measure_verifier_cost",
    "token_prob_scores",
    "deepconf_scores",
    "lm_costs_from_info",
    "lm_cost_for",
]


def _columns(problems: ShardDataset | Sequence[CollectedProblem], i: int):
    """Answer columns of problem i (`AnswerColumns` or the `CollectedProblem` itself)."""
    return problems.answer_columns(i) if isinstance(problems, ShardDataset) else problems[i]


def _read(problems: ShardDataset | Sequence[CollectedProblem], i: int, sequences, mode: str) -> dict:
    """The dataset item of problem i's group of `sequences` in `mode` (`hf_msv.data.read_group`)."""
    if isinstance(problems, ShardDataset):
        return problems.group(i, sequences, mode)
    problem = problems[i]
    if problem.hidden_states is None:
        raise ValueError(f"problem {problem.problem_id!r} was read without hidden states")
    return read_group(problem, problem.hidden_states, sequences, mode)


def _num_problems(problems: ShardDataset | Sequence[CollectedProblem]) -> int:
    return problems.num_problems if isinstance(problems, ShardDataset) else len(problems)


def _group_size(model) -> int | None:
    """M of an MSV_M (groups of more sequences are split into sub-groups of M); None for the Probe."""
    return None if model.config.model_type == "msv_probe" else int(model.config.num_sequences)


def _forward(model, items: list[dict], mode: str, group_size: int | None) -> tuple[np.ndarray, dict]:
    """`(A,)` float64 probabilities of the answers of `collate_groups(items)` in the batch's order, and the batch."""
    from ..modeling_msv import split_into_groups

    batch = collate_groups(items, mode, gamma=False)  # γ depends on the groups, which may be split below
    answer_group, sequence = batch["answer_group"], batch["answer_sequence"]
    if group_size is not None and len(sequence) and int(sequence.max()) >= group_size:
        answer_group, sequence = split_into_groups(answer_group, sequence, group_size)
    out = model(
        hidden_states=batch["hidden_states"],
        token_answer=batch["token_answer"],
        answer_group=answer_group,
        answer_sequence=sequence,
        answer_step=batch["answer_step"],
        answer_end=batch["answer_end"],
        answer_class=batch["answer_class"],
    )
    return out.probabilities.float().cpu().numpy().astype(np.float64), batch


@torch.no_grad()
def score_problems(
    model,
    problems: ShardDataset | Sequence[CollectedProblem],
    sequences: Sequence[np.ndarray] | None = None,
    mode: str | None = None,
    max_tokens: int = 32768,
) -> tuple[list[np.ndarray], float, int]:
    """Score each problem's group with `model` (offline, packed): ``(scores, seconds, answers scored)``.

    Args:
        problems: a `ShardDataset` (hidden states read lazily), or `CollectedProblem`s read with hidden states.
        sequences: per problem, the group's sequence ids (default: all collected sequences).
        mode: "terminal" scores the terminal answers only (steps set to 0, as at training); "streaming" scores every
            answer. Default: the model's own mode.
        max_tokens: answer tokens packed into one forward call.
    Returns per problem an (A,) array over its *stored* answers, nan where not scored. An MSV_M scoring groups of
    more than M sequences splits them into sub-groups of M. ``seconds`` times packing and the forward calls.
    """
    mode = mode or model.config.mode
    group_size = _group_size(model)
    out = [np.full(len(_columns(problems, i).answer_sequence), np.nan) for i in range(_num_problems(problems))]
    pending, where, tokens = [], [], 0
    seconds, answers = 0.0, 0

    def flush():
        nonlocal pending, where, tokens, seconds, answers
        if not pending:
            return
        start = time.perf_counter()
        probs, batch = _forward(model, pending, mode, group_size)
        seconds += time.perf_counter() - start
        # collate keeps each group's answers together (re-ordered by end time); answer_index maps them back.
        group_of, stored_row = batch["answer_group"].numpy(), batch["answer_index"].numpy()
        for g, i in enumerate(where):
            mine = group_of == g
            out[i][stored_row[mine]] = probs[mine]
            answers += int(mine.sum())
        pending, where, tokens = [], [], 0

    for i in range(len(out)):
        seqs = np.arange(_columns(problems, i).num_sequences) if sequences is None else np.asarray(sequences[i])
        item = _read(problems, i, seqs, mode)
        if not len(item["answer_index"]):
            continue
        pending.append(item)
        where.append(i)
        tokens += len(item["hidden_states"])
        if tokens >= max_tokens:
            flush()
    flush()
    return out, seconds, answers


@torch.no_grad()
def measure_verifier_cost(
    model,
    problems: ShardDataset | Sequence[CollectedProblem],
    sequences: Sequence[np.ndarray],
    max_groups: int = 4,
    repeats: int = 1,
) -> float:
    """Seconds per answer of scoring groups *online*, as during streaming decoding: per group, one verifier call per
    distinct arrival time τ + L with the answers that arrived (a streaming MSV with its KV cache, `MSVCache`; the
    Probe statelessly). Measured on the first `max_groups` groups; the best of `repeats` runs (least disturbed).

    `problems` as in `score_problems`."""
    if model.config.model_type != "msv_probe" and model.config.mode != "streaming":
        raise ValueError("online cost is measured for streaming verifiers (terminal ones score once, at the end)")
    from ..modeling_msv import MSVCache

    streaming = model.config.mode == "streaming"
    group_size = _group_size(model)
    items = [_read(problems, i, np.asarray(seqs), "streaming") for i, seqs in list(enumerate(sequences))[:max_groups]]
    best = math.inf
    for _ in range(max(1, repeats)):
        seconds, answers = 0.0, 0
        for item in items:
            if not len(item["answer_index"]):
                continue
            cache = MSVCache() if (streaming and group_size is not None) else None
            start = time.perf_counter()
            for kwargs in _arrival_calls(item, group_size):  # inputs built per arrival, as online: timed too
                if cache is not None:
                    kwargs = kwargs | dict(past_key_values=cache, use_cache=True)
                model(**kwargs)
            seconds += time.perf_counter() - start
            answers += len(item["answer_index"])
        if answers:
            best = min(best, seconds / answers)
    return best if math.isfinite(best) else 0.0


def _arrival_calls(item: dict, group_size: int | None):
    """The verifier inputs of one group's online scoring: one call per distinct end time τ + L, with the answers
    that arrived then (ties ordered by sequence, step), sub-grouped for an MSV_M as offline."""
    from ..modeling_msv import split_into_groups

    lengths, seq = item["answer_length"].numpy(), item["answer_sequence"]
    step, end = item["answer_step"].numpy(), item["answer_end"].numpy()
    order = np.lexsort((step, seq.numpy(), end))
    sub = torch.zeros(len(seq), dtype=torch.long)
    if group_size is not None and len(seq) and int(seq.max()) >= group_size:
        sub, seq = split_into_groups(sub, seq, group_size)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for t in np.unique(end):
        idx = order[end[order] == t]
        tok = np.concatenate([np.arange(int(starts[a]), int(starts[a] + lengths[a])) for a in idx])
        index = torch.from_numpy(idx)
        yield dict(
            hidden_states=item["hidden_states"][torch.from_numpy(tok)],
            token_answer=torch.repeat_interleave(torch.arange(len(idx)), item["answer_length"][index]),
            answer_group=sub[index],
            answer_sequence=seq[index],
            answer_step=item["answer_step"][index],
            answer_end=item["answer_end"][index],
            answer_class=item["answer_class"][index],
        )


def token_prob_scores(problem: CollectedProblem) -> np.ndarray:
    """`(A,)` Token-Probs baseline of a problem's answers: `hf_msv.baselines.token_prob_score` over the tokens whose
    log-probability is known (nan ones are left out; an answer with none known gets nan)."""
    answer = np.repeat(np.arange(problem.num_answers), problem.answer_length)
    known = ~np.isnan(problem.token_logprobs)
    return token_prob_score(problem.token_logprobs[known], answer[known], problem.num_answers)


def deepconf_scores(problem: CollectedProblem, window: int = 2048, stat: str = "lowest_group") -> np.ndarray:
    """`(A,)` raw DeepConf confidence of each answer's chain-of-thought prefix (`hf_msv.baselines
    .deepconf_streaming` over the stored token confidences; terminal answers see their whole sequence)."""
    return deepconf_streaming(problem.cot_confidence, problem.answer_sequence, problem.answer_tau, window, stat)


def lm_costs_from_info(info: Mapping) -> dict[int | None, LatencyCosts] | None:
    """LM costs recorded in a shard's collection info, if any: ``info["latency"]`` = ``{"decode_step_s": float,
    "elicit_s": float}`` and/or ``{"by_num_sequences": {N: {...}}}``. Returns {N or None: LatencyCosts} or None."""
    lat = info.get("latency") if isinstance(info, Mapping) else None
    if not isinstance(lat, Mapping):
        return None
    out: dict[int | None, LatencyCosts] = {}
    if "decode_step_s" in lat or "elicit_s" in lat:
        out[None] = LatencyCosts(float(lat.get("decode_step_s", 0.0)), float(lat.get("elicit_s", 0.0)))
    for n, c in (lat.get("by_num_sequences") or {}).items():
        out[int(n)] = LatencyCosts(float(c.get("decode_step_s", 0.0)), float(c.get("elicit_s", 0.0)))
    return out or None


def lm_cost_for(costs: Mapping | None, n: int) -> LatencyCosts:
    """The LM costs at N from {N or None: LatencyCosts}: N's own, else the N-independent ones, else the nearest
    measured N (costs per step grow slowly with N on batched hardware); zeros without any."""
    if not costs:
        return LatencyCosts()
    if n in costs:
        return costs[n]
    if None in costs:
        return costs[None]
    k = min((k for k in costs if k is not None), key=lambda k: abs(math.log(k) - math.log(n)))
    return costs[k]
