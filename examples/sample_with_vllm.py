"""Sample N chains of thought per problem with vLLM, write them as an hf_msv trace file, then re-encode and train.

    # 1. sampling (needs a GPU and `pip install vllm`): writes traces.jsonl
    python examples/sample_with_vllm.py --model Qwen/Qwen3-1.7B --problems math500:64 -n 16 --output traces.jsonl
    # 2. answers and hidden states, the same shards `hf-msv collect` writes (any device; resumable)
    hf-msv collect --model Qwen/Qwen3-1.7B --traces traces.jsonl --output-dir shards/train
    # 3. train on them (a validation split made the same way)
    hf-msv train --train-dir shards/train --val-dir shards/validation --output-dir verifier --num-sequences 16
    # without vLLM or a GPU: the default LM sampled by transformers, shaped as vLLM's outputs, then steps 1-2
    python examples/sample_with_vllm.py --quick

Only step 1 uses vLLM, imported inside `sample`; the file format is written by `write_vllm_traces` with
`hf_msv.collect.write_traces` (tested on hf_msv's own samples shaped like vLLM's outputs). The traces keep vLLM's
``prompt_token_ids`` and each completion's ``token_ids`` (EOS included when it stopped on EOS), so re-encoding sees
exactly the sampled tokens; ``--logprobs 20`` also stores top-20 log-probs for ``--confidence trace``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hf_msv.collect import Completion, Trace, load_problems, write_traces


def write_vllm_traces(path, problems, outputs, sampling: dict, eos_token_id: int | None = None) -> Path:
    """Write vLLM ``RequestOutput``s (one per problem, in order) as a trace file; returns its path.

    Each output needs ``prompt_token_ids`` and ``outputs`` (``CompletionOutput``: ``token_ids``, ``finish_reason``,
    ``stop_reason``, ``logprobs``: per token a dict token id → object with ``.logprob``, or `None`). A completion
    that stopped on EOS (``finish_reason == "stop"``, no stop string or stop token) gets `eos_token_id` appended
    if its token ids lack it, so re-encoding sees an EOS ending (the terminal answer's trigger, the length)."""
    traces = []
    for problem, out in zip(problems, outputs, strict=True):
        completions = []
        for c in out.outputs:
            ids = list(c.token_ids)
            stopped_on_eos = c.finish_reason == "stop" and getattr(c, "stop_reason", None) is None
            if stopped_on_eos and eos_token_id is not None and (not ids or ids[-1] != eos_token_id):
                ids.append(eos_token_id)
            logprobs = None
            if c.logprobs:
                logprobs = [sorted((lp.logprob for lp in step.values()), reverse=True) for step in c.logprobs]
                if len(logprobs) < len(ids):  # no log-probs for an appended EOS: the line would be malformed
                    logprobs = None
            completions.append(Completion(token_ids=ids, finish_reason=c.finish_reason, logprobs=logprobs))
        traces.append(
            Trace(
                id=problem.id,
                question=problem.question,
                gold=problem.gold,
                completions=completions,
                prompt_token_ids=list(out.prompt_token_ids),
                source=problem.source,
                gold_alternatives=[str(g) for g in problem.meta.get("gold_alternatives") or []],
                sampling=dict(sampling, engine="vllm"),
            )
        )
    return write_traces(path, traces)


def sample(model: str, problems, n: int, max_tokens: int, temperature: float, logprobs: int | None, seed: int):
    """vLLM's outputs for `problems` (chat template of the model, as ``hf-msv collect --prompt-template chat``) and
    the tokenizer's EOS id."""
    from vllm import LLM, SamplingParams  # only this half needs vLLM and a GPU

    llm = LLM(model=model, seed=seed)
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p.question}], tokenize=False, add_generation_prompt=True
        )
        for p in problems
    ]
    # Like hf_msv's own chat prompts: the template already holds the special tokens.
    inputs = [{"prompt_token_ids": tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts]
    params = SamplingParams(
        n=n, temperature=temperature, top_p=1.0, top_k=-1, max_tokens=max_tokens, logprobs=logprobs, seed=seed
    )
    return llm.generate(inputs, params), tokenizer.eos_token_id


def sample_quick(problems, n: int, max_tokens: int, seed: int):
    """What :func:`sample` returns, made without vLLM: the default LM (the testbed) sampled by ``model.generate``,
    each output shaped as vLLM's ``RequestOutput`` (``prompt_token_ids``; ``outputs`` with ``token_ids``,
    ``finish_reason``, ``stop_reason``, ``logprobs``). Returns ``(outputs, eos_token_id, model, tokenizer)``."""
    from types import SimpleNamespace

    import torch

    from hf_msv.collect import load_lm
    from hf_msv.testbed import format_prompt

    model, tok = load_lm("testbed", device="cpu")
    outputs = []
    for problem in problems:
        prompt = tok(format_prompt(problem))["input_ids"]
        torch.manual_seed(seed)
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=n,
            max_new_tokens=max_tokens,
            pad_token_id=tok.pad_token_id,
        )
        completions = []
        for row in out[:, len(prompt) :].tolist():
            ids = row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row
            ended = bool(ids) and ids[-1] == tok.eos_token_id
            completions.append(
                SimpleNamespace(
                    token_ids=ids, finish_reason="stop" if ended else "length", stop_reason=None, logprobs=None
                )
            )
        outputs.append(SimpleNamespace(prompt_token_ids=prompt, outputs=completions))
    return outputs, tok.eos_token_id, model, tok


def quick(output: str | None) -> None:
    """2 testbed problems x 2 samples: sampled without vLLM, written as a trace file, re-encoded into shards."""
    import json
    import tempfile

    from hf_msv.collect import collect_from_traces

    work = Path(tempfile.mkdtemp(prefix="vllm-example-"))
    problems = load_problems("testbed:validation:2")
    start = time.perf_counter()
    outputs, eos_token_id, model, tok = sample_quick(problems, n=2, max_tokens=272, seed=0)
    path = write_vllm_traces(output or work / "traces.jsonl", problems, outputs, {"temperature": 1.0}, eos_token_id)
    result = collect_from_traces(model, tok, path, work / "shards", overwrite=True)
    print(
        json.dumps(
            {
                "problems": len(problems),
                "traces": str(path),
                "shards": str(work / "shards"),
                "tokens": result.tokens,
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the LM to sample (required unless --quick)")
    parser.add_argument("--problems", help="as hf-msv collect --problems (required unless --quick)")
    parser.add_argument("-n", "--num-samples", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--logprobs", type=int, default=None, help="top-k log-probs per token (DeepConf: 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output", default=None, help="the trace file (default: traces.jsonl; --quick: a temporary directory)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="no vLLM, no GPU: 2 testbed problems x 2 samples by "
        "transformers, written and re-encoded as steps 1-2 would",
    )
    args = parser.parse_args()
    if args.quick:
        return quick(args.output)
    if not (args.model and args.problems):
        parser.error("--model and --problems are required (or --quick)")
    args.output = args.output or "traces.jsonl"
    problems = load_problems(args.problems)
    start = time.perf_counter()
    outputs, eos_token_id = sample(
        args.model, problems, args.num_samples, args.max_tokens, args.temperature, args.logprobs, args.seed
    )
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    sampling = dict(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed, model=args.model)
    path = write_vllm_traces(args.output, problems, outputs, sampling, eos_token_id)
    print(
        f"{len(problems)} problems x {args.num_samples} samples, {tokens} tokens in {seconds:.1f} s "
        f"({tokens / seconds:.0f} tokens/s) -> {path}"
    )


if __name__ == "__main__":
    main()
