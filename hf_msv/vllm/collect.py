"""`collect_with_vllm`: problems → chains sampled on a vLLM engine → elicited answers and hidden states → the
shards of live collection (`hf_msv.collect.collect`), resumable and atomic through the same `ShardStore`.

The controller runs without a verifier; each batch's answers become records with `build_record`, with DeepConf's
token confidence of every chain token computed in the engine from its raw logits (``confidence_top_k``; shard info
``cot_confidence_source: "generation"``, as live collection). See docs/vllm.md.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence

import numpy as np

from ..collect.config import CollectConfig
from ..collect.job import (
    CollectResult,
    batch_seed,
    collection_job,
    count_verdicts,
    sampling_config,
    start_collection,
    verdict_counts,
)
from ..collect.live import LIVE_SETTINGS
from ..collect.lm import prompt_builder, template_name
from ..collect.recording import build_record
from ..data.problems import Problem
from ..elicitation import ElicitationSettings
from .controller import ELICITATION_RESERVE, VLLMController

__all__ = ["batch_sequences", "collect_with_vllm", "engine_info"]


class _EngineModule:
    """Stands in for the transformers LM in `collection_job`, which sets an LM's train/eval mode: vLLM has none."""

    training = False

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self


def batch_sequences(batch_chains: int, elicitation_reserve: float = ELICITATION_RESERVE) -> int:
    """The engine's ``max_num_seqs`` at which a collection batch's chains (``problems_per_batch × num_samples``) all
    decode at once: they fill the controller's chain slots, the rest of the sequences kept for elicitation requests
    (`VLLMController`'s ``elicitation_reserve``). Below it, prompts wait for whole prompts to end (docs/vllm.md
    "Admission")."""
    return math.ceil(batch_chains / (1.0 - elicitation_reserve))


def engine_info(engine) -> dict:
    """What identifies the engine's LM in a collection's settings (the keys `hf_msv.collect.lm.lm_info` writes;
    the weights are named by path and revision, as vLLM's parameter layout differs from transformers')."""
    config = engine.model_config
    hf = config.hf_config
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    return {
        "lm_name_or_path": config.model,
        "lm_model_type": getattr(hf, "model_type", None),
        "lm_hidden_size": config.get_hidden_size(),
        "lm_num_attention_heads": getattr(text, "num_attention_heads", None),
        "lm_dtype": str(config.dtype).replace("torch.", ""),
        "lm_weights_fingerprint": f"vllm:{config.model}@{getattr(config, 'revision', None) or 'local'}",
        "tokenizer": config.tokenizer,
    }


def collect_with_vllm(
    engine,
    problems: Sequence[Problem],
    output_dir: str | os.PathLike,
    config: CollectConfig | None = None,
    *,
    tokenizer=None,
    elicitation: ElicitationSettings | None = None,
    **settings,
) -> CollectResult:
    """Sample ``num_samples`` chains per problem on `engine`, elicit answers and write the shards `collect` writes.

    Args:
        engine: a ``vllm.LLM`` or its ``LLMEngine`` (see `VLLMController`).
        problems, output_dir, config, elicitation, **settings: as in `hf_msv.collect.collect` (``confidence_top_k``
            is recorded but no confidences are; ``model_dtype`` is the engine's). Each batch's requests are seeded
            with vLLM per-request seeds from ``seed`` and the batch's problem ids where the engine supports them
            (`VLLMController.supports_seeds`; shard info ``seeded_batches``), else sampled from the engine's
            generator (a rerun samples other tokens).
        tokenizer: the LM's transformers tokenizer (default: loaded from the engine's tokenizer path).

    Returns:
        This process's `CollectResult`.

    Raises:
        ValueError: invalid settings, duplicate problem ids, or an existing collection made with other settings,
            before anything is sampled.
    """
    from ..equivalence import get_checker

    config = sampling_config(config, elicitation, settings, problems)
    elicit = config.elicitation
    checker = get_checker(config.checker, **config.checker_options)
    controller = VLLMController(
        engine,
        tokenizer,
        None,
        elicitation=elicit,
        checker=checker,
        capture_hidden_states=True,
        confidence_top_k=config.confidence_top_k,
    )
    batch_chains = config.problems_per_batch * config.num_samples
    if controller.chain_slots < batch_chains:
        needed = batch_sequences(batch_chains)
        warnings.warn(
            f"the engine runs {controller.chain_slots} chains at once, fewer than a batch's "
            f"{config.problems_per_batch} x {config.num_samples}: prompts wait for whole prompts to end. Start it "
            f"with max_num_seqs={needed} (the `hf-msv collect --engine vllm` default) to decode a batch at once.",
            stacklevel=2,
        )
    build_prompt = prompt_builder(config.prompt_template, controller.tokenizer)
    budgets = {p.id: controller.room(controller.encode(build_prompt(p))) for p in problems}  # checked before work
    recorded = {name: getattr(config, name) for name in LIVE_SETTINGS}
    recorded.update(
        elicitation=elicit.to_dict(),
        checker_kwargs=config.checker_options,
        prompt_template=template_name(config.prompt_template),
        engine="vllm",
        **engine_info(controller.engine),
    )
    info = dict(
        recorded,
        format_version="1",
        token_logprobs_source="generation",
        cot_confidence_source="generation",
        seeded_batches=controller.supports_seeds,
    )
    state, store, todo, result = start_collection(output_dir, recorded, info, problems, overwrite=config.overwrite)
    hidden_size = controller.engine.model_config.get_hidden_size()
    with collection_job(_EngineModule(), store, result, state):
        for b, batch, left in todo:
            before = verdict_counts(checker)
            budget = min([config.token_budget] + [budgets[p.id] for p in batch])
            outputs = controller.generate(
                [build_prompt(p) for p in batch],
                num_sequences=config.num_samples,
                max_new_tokens=budget,
                temperature=config.temperature,
                top_p=config.top_p,
                top_k=config.top_k,
                seed=batch_seed(config.seed, [p.id for p in batch]) if controller.supports_seeds else None,
            )
            records = _records(result, batch, {p.id for p in left}, outputs, checker, hidden_size)
            if budget < config.token_budget:
                result.cut_sequences += sum(
                    len(s) == budget and f == "budget"
                    for res in outputs
                    for s, f in zip(res.sequences, res.finish_reasons)
                )
            store.add_batch(b, records, count_verdicts(result, before, checker))
            result.generated += len(records)
    return result


def _records(result: CollectResult, batch, left_ids: set, outputs, checker, hidden_size: int) -> list:
    """The records of one batch's problems still to do, counted in `result`."""
    records = []
    for problem, res in zip(batch, outputs):
        if problem.id not in left_ids:
            continue  # done by another process of an earlier run with another world size
        recorded = res.cot_confidence or [[] for _ in res.sequences]
        confidence = [np.asarray(c, dtype=np.float32) for c in recorded]
        record = build_record(
            problem, res.answers, res.sequences, res.finish_reasons, confidence, checker, hidden_size
        )
        records.append(record)
        result.tokens += int(record.sequence_length.sum())
        result.answer_tokens += int(record.answer_length.sum())
        result.answers += record.num_answers
    return records
