"""DeepConf token confidences of recorded chains, recomputed with the LM that sampled them.

vLLM collections store the chains' token ids but no confidences (shard info ``cot_confidence_source: "missing"``).
This script prefills each chain (prompt + its chain-of-thought tokens) with the collection's LM in float32 on CPU
and keeps, for chain token i, DeepConf's token confidence C_i = −(1/k) Σ_{j≤k} log P_i(j) of the distribution token
i was sampled from (the logits at the position before it, before any temperature: what
`hf_msv.collect.confidence.ConfidenceRecorder` records live), k = the collection's ``confidence_top_k`` (20).
It also reports the mean log-probability of the sampled tokens under the recomputation (a check that prompt and
tokens line up: a misaligned prefill gives a far lower value).

Output (``--output``, an ``.npz`` beside the data, not in the repository): ``problem_id`` (C,) str and ``sequence``
(C,) int (the stored sequence id) of each chain, ``offset`` (C + 1,) int64 and ``confidence`` (T,) float32: chain c's
confidences are ``confidence[offset[c]:offset[c + 1]]``, one per chain-of-thought token (EOS included).

    OMP_NUM_THREADS=1 python research/field_rules_confidence.py /work/runs/eval192 \
        --output /work/runs/confidences/eval192.npz
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from hf_msv.collect.lm import load_lm, prompt_builder, prompt_token_ids
from hf_msv.data.problems import Problem
from hf_msv.data.shards import list_shards, read_shard


def chain_confidences(model, prompt: list[int], chains: list[np.ndarray], top_k: int, pad: int):
    """Per chain, its (len,) token confidences and the mean log-prob of its sampled tokens.

    Args:
        model: the causal LM (float32).
        prompt: the prompt's token ids.
        chains: per chain, its (len,) chain-of-thought token ids.
        top_k: k of DeepConf's confidence.
        pad: the pad token id (right padding: no real token attends to it).

    Returns:
        ``(confidences, mean_logprob)``: a list of (len,) float32 arrays and a float.
    """
    tokens = [prompt + c.tolist() for c in chains]
    width = max(map(len, tokens))
    ids = torch.tensor([t + [pad] * (width - len(t)) for t in tokens])
    mask = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in tokens])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
    k = min(top_k, logprobs.shape[-1])
    conf = -logprobs.topk(k, dim=-1).values.mean(-1)  # (rows, width): position j's distribution predicts j + 1
    p = len(prompt)
    out, sampled = [], []
    for r, c in enumerate(chains):
        n = len(c)
        out.append(conf[r, p - 1 : p - 1 + n].numpy().astype(np.float32))
        sampled.append(logprobs[r, torch.arange(p - 1, p - 1 + n), torch.as_tensor(c)].numpy())
    return out, float(np.concatenate(sampled).mean()) if sampled else 0.0


def save_recorded(collection: str, output: str, limit: int | None = None) -> None:
    """The same ``.npz`` from the token confidences a collection recorded while sampling (collections made with
    ``confidence_top_k`` store them: shard info ``cot_confidence_source: "generation"``)."""
    problem_ids, sequences, confs = [], [], []
    for shard in list_shards(collection)[:limit]:
        problems, _ = read_shard(shard, hidden=False)
        for p in problems:
            if p.cot_confidence is None:
                raise SystemExit(f"{shard}: no recorded token confidences; recompute them (without --recorded)")
            confs += [np.asarray(c, np.float32) for c in p.cot_confidence]
            problem_ids += [p.problem_id] * len(p.cot_confidence)
            sequences += list(range(len(p.cot_confidence)))
    lengths = np.array([c.size for c in confs], np.int64)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    np.savez(output, problem_id=np.array(problem_ids), sequence=np.array(sequences, np.int64),
             offset=np.r_[0, np.cumsum(lengths)], confidence=np.concatenate(confs), top_k=0)  # fmt: skip
    print(json.dumps({"chains": len(confs), "tokens": int(lengths.sum()), "recorded": True}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("collection", help="a collection directory (hf-msv collect --output-dir)")
    parser.add_argument("--output", required=True, help=".npz to write")
    parser.add_argument("--model", default=None, help="the LM (default: the collection's lm_name_or_path)")
    parser.add_argument("--batch", type=int, default=32, help="chains per forward")
    parser.add_argument("--limit", type=int, default=None, help="only the first shards (a quick check)")
    parser.add_argument(
        "--recorded",
        action="store_true",
        help="write the confidences the collection recorded while sampling (its shards' cot_confidence) instead",
    )
    args = parser.parse_args()
    if args.recorded:
        return save_recorded(args.collection, args.output, args.limit)
    torch.set_grad_enabled(False)
    info = json.loads((Path(args.collection) / "collect_config.json").read_text())
    model, tokenizer = load_lm(args.model or info["lm_name_or_path"], device="cpu", dtype="float32")
    build = prompt_builder(info["prompt_template"], tokenizer)
    top_k = int(info.get("confidence_top_k") or 20)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    problem_ids, sequences, confs, checks = [], [], [], []
    started = time.time()
    shards = list_shards(args.collection)[: args.limit]
    for i, shard in enumerate(shards):
        problems, _ = read_shard(shard, hidden=False)
        for p in problems:
            prompt = prompt_token_ids(build(Problem(p.problem_id, p.question, p.gold, p.source)), tokenizer)
            for b in range(0, len(p.cot_token_ids), args.batch):
                chains = p.cot_token_ids[b : b + args.batch]
                conf, check = chain_confidences(model, prompt, chains, top_k, pad)
                confs += conf
                checks.append(check)
                problem_ids += [p.problem_id] * len(chains)
                sequences += list(range(b, b + len(chains)))
        print(f"{i + 1}/{len(shards)} shards, {len(confs)} chains, {time.time() - started:.0f}s", flush=True)
    lengths = np.array([c.size for c in confs], np.int64)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    np.savez(
        args.output,
        problem_id=np.array(problem_ids),
        sequence=np.array(sequences, np.int64),
        offset=np.r_[0, np.cumsum(lengths)],
        confidence=np.concatenate(confs) if confs else np.zeros(0, np.float32),
        top_k=top_k,
    )
    print(
        json.dumps(
            {
                "chains": len(confs),
                "tokens": int(lengths.sum()),
                "top_k": top_k,
                "mean_sampled_logprob": float(np.mean(checks)),
                "seconds": round(time.time() - started),
            }
        )
    )


if __name__ == "__main__":
    main()
