"""Collection: problems (or sampled traces) -> N sequences -> answers and hidden states -> shards.

`collect` samples live, `collect_from_traces` re-encodes a trace file into the same shards; both take a
`CollectConfig` (the ``hf-msv collect`` flags) or its fields as keywords; `respace_collection` derives a spaced
schedule's collection from an unspaced one. See ``docs/collection.md``.
"""

from .cli import collect_from_config, main
from .confidence import ConfidenceRecorder
from .config import CollectConfig
from .from_traces import collect_from_traces
from .job import CollectResult, batch_seed, sequence_budget
from .live import collect
from .lm import load_lm, load_problems
from .reencode import TraceReencoder
from .respace import RespaceConfig, RespaceResult, respace_collection, respace_problem
from .store import ShardStore, done_problem_ids, write_index
from .traces import (
    Completion,
    Trace,
    TraceError,
    TraceFile,
    read_traces,
    traces_from_results,
    traces_from_shards,
    write_traces,
)

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
