"""Collection: problems (or sampled traces) -> N sequences -> answers and hidden states -> shards.

`collect` samples live, `collect_from_traces` re-encodes a trace file into the same shards; both take a
`CollectConfig` (the ``hf-msv collect`` flags) or its fields as keywords; `respace_collection` derives a spaced
schedule's collection from an unspaced one. See ``docs/collection.md``.
"""

import importlib

# public name -> the submodule it lives in; imported on first use, so `hf-msv collect --help` imports no torch
_EXPORTS = {
    "collect_from_config": "cli",
    "main": "cli",
    "ConfidenceRecorder": "confidence",
    "CollectConfig": "config",
    "collect_from_traces": "from_traces",
    "CollectResult": "job",
    "batch_seed": "job",
    "sequence_budget": "job",
    "collect": "live",
    "load_lm": "lm",
    "load_problems": "lm",
    "TraceReencoder": "reencode",
    "RespaceConfig": "respace",
    "RespaceResult": "respace",
    "respace_collection": "respace",
    "respace_problem": "respace",
    "ShardStore": "store",
    "done_problem_ids": "store",
    "write_index": "store",
    "Completion": "traces",
    "Trace": "traces",
    "TraceError": "traces",
    "TraceFile": "traces",
    "read_traces": "traces",
    "traces_from_results": "traces",
    "traces_from_shards": "traces",
    "write_traces": "traces",
}


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hf_msv.collect' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "CollectConfig",
    "CollectResult",
    "Completion",
    "ConfidenceRecorder",
    "RespaceConfig",
    "RespaceResult",
    "ShardStore",
    "Trace",
    "TraceError",
    "TraceFile",
    "TraceReencoder",
    "batch_seed",
    "collect",
    "collect_from_config",
    "collect_from_traces",
    "done_problem_ids",
    "load_lm",
    "load_problems",
    "main",
    "read_traces",
    "respace_collection",
    "respace_problem",
    "sequence_budget",
    "traces_from_results",
    "traces_from_shards",
    "write_index",
    "write_traces",
]
