"""``hf-msv collect --engine vllm``: the `CollectConfig` flags, sampled on a vLLM engine (`collect_with_vllm`).

Engine options go in ``--vllm-arg KEY=VALUE`` (repeatable, values parsed as JSON when they parse), e.g.
``--vllm-arg tensor_parallel_size=2 --vllm-arg gpu_memory_utilization=0.8``. See docs/vllm.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .collect import batch_sequences

__all__ = ["VLLM_LEAST_MAX_NUM_SEQS", "engine_arguments", "engine_model_arguments", "main", "split_arguments"]

VLLM_LEAST_MAX_NUM_SEQS = 256
"""vLLM's smallest default ``max_num_seqs`` (its CPU backend's): a batch that needs more sets its own."""

DEFAULT_ENGINE_ARGS = {"enable_prefix_caching": True, "block_size": 32, "async_scheduling": False}
"""Elicitations reuse their chain's cached prefix in whole blocks: small blocks (32, the CPU backend's least);
the hidden-state capture needs synchronous scheduling."""


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(collect flags, ``KEY=VALUE`` engine options) from `argv`, without ``--engine vllm``.

    Raises:
        ValueError: ``--engine`` with another value, or ``--vllm-arg`` without a value.
    """
    rest, options, args = [], [], list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--engine", "--vllm-arg") or arg.startswith(("--engine=", "--vllm-arg=")):
            name, _, value = arg.partition("=")
            if not value:
                if not args:
                    raise ValueError(f"{name} needs a value")
                value = args.pop(0)
            if name == "--engine" and value != "vllm":
                raise ValueError(f"--engine {value}: this entry point is --engine vllm")
            if name == "--vllm-arg":
                options.append(value)
        else:
            rest.append(arg)
    return rest, options


def engine_arguments(options: Sequence[str], batch_chains: int = 0) -> dict:
    """``KEY=VALUE`` strings → keyword arguments of ``vllm.LLM`` (JSON values when they parse, else strings).

    Args:
        options: the ``--vllm-arg`` values.
        batch_chains: chains per collection batch (``problems_per_batch × num_samples``). Unless `options` set
            ``max_num_seqs``, it is set to `batch_sequences` when that exceeds vLLM's least default, so that a
            batch decodes at once (at N = 64 in the CPU backend's 256, three prompts would run at a time; on a GPU
            with a larger default it may be lowered to that need, which still runs the batch at once).
    """
    out = dict(DEFAULT_ENGINE_ARGS)
    needed = batch_sequences(batch_chains)
    if needed > VLLM_LEAST_MAX_NUM_SEQS:
        out["max_num_seqs"] = needed
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise ValueError(f"--vllm-arg expects KEY=VALUE, got {option!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def engine_model_arguments(args) -> dict:
    """The `hf_msv.collect.lm.ModelArguments` fields (``CollectConfig``'s) that ``vllm.LLM`` has keywords for:
    ``revision``, ``trust_remote_code``, ``dtype`` (``model_dtype``) and ``quantization`` (4-bit bitsandbytes).

    Raises:
        UserError: a loading option vLLM has no equivalent for (accelerate's ``device_map`` / ``offload_folder``,
            ``attn_implementation``, 8-bit bitsandbytes, ``gguf_file``), named in the message.
    """
    from ..errors import UserError

    unmapped = {
        "--device-map": args.device_map,
        "--offload-folder": args.offload_folder,
        "--attn-implementation": args.attn_implementation,
        "--load-in-8bit": args.load_in_8bit,
        "--gguf-file": args.gguf_file,
    }
    given = [flag for flag, value in unmapped.items() if value]
    if given:
        raise UserError(f"--engine vllm: {given} load with transformers only (engine options: --vllm-arg KEY=VALUE)")
    out = {"revision": args.revision, "trust_remote_code": args.trust_remote_code}
    if args.model_dtype != "auto":
        out["dtype"] = args.model_dtype
    if args.load_in_4bit:
        out["quantization"] = "bitsandbytes"
    return {key: value for key, value in out.items() if value is not None}


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the flags (``--config FILE`` and ``--log-level`` too: `hf_msv.arguments.parse_command_args`), load the
    problems, start the engine and print the `CollectResult` as one JSON line."""
    import sys

    from ..arguments import parse_command_args
    from ..collect.cli import summary
    from ..collect.config import build_parser
    from ..collect.job import config_settings
    from ..collect.live import LIVE_SETTINGS
    from ..collect.lm import load_problems
    from ..collect.store import check_output_dir
    from ..errors import UserError
    from ..registry import get_named_lm
    from .collect import collect_with_vllm

    flags, options = split_arguments(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    (config,) = parse_command_args(parser, flags)
    config.check_command_line()
    model_kwargs = engine_model_arguments(config.model_arguments)  # before the problems and the engine
    if config.traces is not None:
        raise UserError("--engine vllm samples: re-encoding --traces runs on transformers (drop --engine vllm)")
    resolved = config.resolved()
    settings = config_settings(resolved, resolved.elicitation, LIVE_SETTINGS)
    check_output_dir(config.output_dir, settings, config.overwrite)  # before the engine loads the LM
    problems = load_problems(config.problems, config.problem_columns)  # before the engine: a bad spec fails fast
    named = get_named_lm(config.model)
    path = str(named.path) if named is not None else config.model
    import vllm  # pyright: ignore[reportMissingImports]  (optional; absent from the lint environment)

    kwargs = engine_arguments(options, resolved.problems_per_batch * resolved.num_samples)
    for key, value in model_kwargs.items():  # an explicit --vllm-arg wins
        kwargs.setdefault(key, value)
    engine = vllm.LLM(model=path, **kwargs)  # pyright: ignore[reportAttributeAccessIssue]  (vLLM, not hf_msv.vllm)
    result = collect_with_vllm(engine, problems, config.output_dir, config)
    print(json.dumps(summary(result)))
