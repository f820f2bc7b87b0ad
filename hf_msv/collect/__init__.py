"""Collection: problems -> N sampled sequences -> answers and hidden states -> shards.

Modules: `config` (`CollectConfig`, the ``hf-msv collect`` flags), `lm` (loading LMs and problems, prompts),
`confidence` (DeepConf token confidence), `store` (the resumable, atomic shard store), `recording` (answers → one
problem's record), `live` (`collect`), `traces` (the trace-file format), `reencode` (answers of sampled traces from one
prefill each) and `from_traces` (`collect_from_traces`).
"""

from .confidence import ConfidenceRecorder
from .config import CollectConfig
from .lm import load_lm, load_problems
from .live import CollectResult, batch_seed, collect, collect_from_config, main
from .store import ShardStore, done_problem_ids, write_index
from .from_traces import collect_from_traces
from .reencode import TraceReencoder
from .traces import (Completion, Trace, TraceError, TraceFile, read_traces, traces_from_results,
                     traces_from_shards, write_traces)

__all__ = [
    "CollectConfig",
    "CollectResult",
    "Completion",
    "ConfidenceRecorder",
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
    "traces_from_results",
    "traces_from_shards",
    "write_index",
    "write_traces",
]
