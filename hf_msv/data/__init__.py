"""Problems, collected records and hidden-state shards."""

from .problems import (
    Problem,
    BENCHMARKS,
    load_benchmark,
)
from .shards import (
    CollectedProblem,
    write_shard,
    read_shard,
    read_shard_info,
    list_shards,
    ShardDataset,
    collate_groups,
    VERIFIER_INPUTS,
    STORAGE_DTYPES,
)

__all__ = [
    "Problem",
    "BENCHMARKS",
    "load_benchmark",
    "CollectedProblem",
    "write_shard",
    "read_shard",
    "read_shard_info",
    "list_shards",
    "ShardDataset",
    "collate_groups",
    "VERIFIER_INPUTS",
    "STORAGE_DTYPES",
]
