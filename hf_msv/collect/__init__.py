"""Collection: problems -> N sampled sequences -> answers and hidden states -> shards.

Modules: `config` (`CollectConfig`, the ``hf-msv collect`` flags), `lm` (loading LMs and problems, prompts),
`confidence` (DeepConf token confidence), `store` (the resumable, atomic shard store), `live` (`collect`).
"""

from .confidence import ConfidenceRecorder
from .config import CollectConfig
from .lm import load_lm, load_problems
from .live import CollectResult, batch_seed, collect, collect_from_config, main
from .store import ShardStore, done_problem_ids, write_index

__all__ = [
    "CollectConfig",
    "CollectResult",
    "ConfidenceRecorder",
    "ShardStore",
    "batch_seed",
    "collect",
    "collect_from_config",
    "done_problem_ids",
    "load_lm",
    "load_problems",
    "main",
    "write_index",
]
