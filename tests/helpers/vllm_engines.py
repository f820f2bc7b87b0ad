"""CPU vLLM engines of the serving tests (tests/test_vllm_serving.py) and the check that nothing is left in one.

Import only where ``vllm`` imports (the `.venv-vllm` environment). Engines run their core in-process and with OpenMP
threads that do not pin and spin on a shared CPU; set the environment before vLLM starts an engine.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def make_engine(path, seed: int = 0, **options):
    """A CPU engine on the LM at `path` as tests/test_vllm.py builds it; `options` replace its settings.

    Args:
        path: the LM's directory.
        seed: the engine's seed.
        **options: other ``vllm.LLM`` arguments (e.g. ``enable_chunked_prefill=False``, a cache size).

    Returns:
        The ``vllm.LLM``.
    """
    import vllm

    # block_size 32: the smallest the CPU backend takes, so chains share most of their prefix with elicitations.
    settings = dict(
        block_size=32,
        enforce_eager=True,
        dtype="float32",
        seed=seed,
        enable_prefix_caching=True,
        kv_cache_memory_bytes=64 << 20,
        max_num_seqs=128,
    )
    settings.update(options)
    return vllm.LLM(model=str(path), **settings)


def no_requests_left(llm) -> bool:
    """Whether the engine of `llm` holds no unfinished request."""
    return not llm.llm_engine.has_unfinished_requests() and llm.llm_engine.get_num_unfinished_requests() == 0


def preemptions(llm) -> float:
    """Requests preempted so far (vLLM's ``vllm:num_preemptions`` counter; needs ``disable_log_stats=False``)."""
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


def assert_confidence_equals_transformers(model, prompt_ids, results, top_k: int) -> int:
    """Every chain's `MSVResult.cot_confidence` (as far as it decoded, pruned chains too) equals DeepConf's token
    confidence of a cache-free transformers forward over prompt + chain: −mean of the top `top_k` raw log-probs.

    Returns:
        The number of chain tokens compared.
    """
    import torch

    compared = 0
    for result, prompt in zip(results, prompt_ids):
        assert result.cot_confidence is not None
        assert len(result.cot_confidence) == len(result.sequences)
        for seq, confidence in zip(result.sequences, result.cot_confidence):
            assert len(confidence) == len(seq)
            if not seq:
                continue
            with torch.no_grad():
                logits = model(torch.tensor([prompt + seq])).logits[0, len(prompt) - 1 : -1]
            expected = -torch.log_softmax(logits.float(), -1).topk(top_k, -1).values.mean(-1)
            torch.testing.assert_close(torch.tensor(confidence), expected, atol=1e-3, rtol=1e-3)
            compared += len(seq)
    return compared
