"""Evaluation-harness outputs built from their writers' schemas (lm-evaluation-harness 0.4.x ``--log_samples``,
lighteval 0.13 details), for tests/test_harness_traces.py: `lm_eval_sample` / `write_lm_eval_samples` (as
``evaluator.evaluate`` builds a sample and ``EvaluationTracker.save_results_samples`` writes it), `lighteval_detail`
/ `write_lighteval_details` (``asdict(Detail)`` rows written through `datasets` as ``EvaluationTracker.save`` does),
and `HARNESS_PROBLEMS`: two testbed problems with two short completions each."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from hf_msv.testbed import format_prompt, generate_problems


@dataclass
class HarnessProblem:
    """A testbed problem as a harness logs it: the prompt the LM saw, the target and N = 2 completions."""

    doc_id: int
    question: str
    gold: str
    context: str
    completions: list[str]


def harness_problems() -> list[HarnessProblem]:
    problems = generate_problems("validation", 2, seed=5)
    # Short chains the character-level testbed tokenizer round-trips; the second of each ends on a wrong answer.
    chains = [
        [" 27+11=38. 38-14=24. So \\boxed{92}", " 27+11=38. Wait, \\boxed{40}"],
        [" Step by step. Wait, \\boxed{7}", " So \\boxed{12}"],
    ]
    return [
        HarnessProblem(i, p.question, p.gold, format_prompt(p), chain)
        for i, (p, chain) in enumerate(zip(problems, chains, strict=True))
    ]


HARNESS_PROBLEMS = harness_problems()


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def lm_eval_sample(problem: HarnessProblem, target: str, filter_name: str = "strict-match") -> dict:
    """One generate_until document of an lm-eval samples file (a GSM8K-like task with ``repeats: N``): the document,
    its target, the request's (context, generation kwargs) as ``gen_args_0``, the N responses and the filtered one."""
    doc = {"question": problem.question, "answer": target}
    gen_kwargs = {"until": ["Question:"], "do_sample": True, "temperature": 0.7, "max_gen_toks": 200}
    return {
        "doc_id": problem.doc_id,
        "doc": doc,
        "target": target,
        "arguments": {"gen_args_0": {"arg_0": problem.context, "arg_1": gen_kwargs}},
        "resps": [list(problem.completions)],
        "filtered_resps": [problem.completions[0]],
        "filter": filter_name,
        "metrics": ["exact_match"],
        "doc_hash": _hash(json.dumps(doc, indent=2, ensure_ascii=False)),
        "prompt_hash": _hash(problem.context),
        "target_hash": _hash(target),
        "exact_match": 0.0,
    }


def write_lm_eval_samples(path: Path, samples: list[dict]) -> Path:
    path.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples), encoding="utf-8")
    return path


def lighteval_detail(problem: HarnessProblem, task: str = "testbed|arith|0", with_tokens: list | None = None) -> dict:
    """``asdict(DetailsLogger.Detail)`` of one generative document with ``num_samples`` = N: the `Doc`, the
    `ModelResponse` (``input`` the prompt; ``input_tokens`` / ``output_tokens`` when the backend logs them) and the
    metrics."""
    doc = dict(
        query=problem.context,
        choices=[problem.gold],
        gold_index=0,
        instruction=None,
        images=None,
        specific=None,
        unconditioned_query=None,
        original_query=problem.question,
        id=str(problem.doc_id),
        task_name=task,
        fewshot_samples=[],
        sampling_methods=["GENERATIVE"],
        fewshot_sorting_class=None,
        generation_size=200,
        stop_sequences=["Q:"],
        use_logits=False,
        num_samples=len(problem.completions),
        generation_grammar=None,
    )
    prompt_ids, output_ids = with_tokens or ([], [])
    response = dict(
        input=problem.context,
        input_tokens=prompt_ids,
        text=list(problem.completions),
        output_tokens=output_ids,
        text_post_processed=None,
        reasonings=[],
        logprobs=[],
        argmax_logits_eq_gold=[],
        logits=None,
        unconditioned_logprobs=None,
        truncated_tokens_count=0,
        padded_tokens_count=0,
    )
    return {"doc": doc, "model_response": response, "metric": {"extractive_match": 0.0}}


def write_lighteval_details(path: Path, details: list[dict]) -> Path:
    """Write `details` as lighteval's tracker does: a `datasets.Dataset` with sorted columns, to parquet."""
    from datasets import Dataset

    dataset = Dataset.from_list(details)
    dataset.select_columns(sorted(dataset.column_names)).to_parquet(str(path))
    return path
