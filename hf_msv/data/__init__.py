"""Problems, collected records, hidden-state shards, and the groups that training and evaluation read from them."""

from .dataset import (
    PRELOAD_BYTES,
    VERIFIER_INPUTS,
    ShardDataset,
    collate_groups,
    load_split,
)
from .groups import (
    MODES,
    AnswerColumns,
    AnswerGroup,
    answer_group,
    draw_sequences,
    partition_sequences,
    read_group,
    select_answers,
)
from .problems import (
    BENCHMARKS,
    Problem,
    load_benchmark,
)
from .records import CollectedProblem
from .shards import (
    SHARD_GLOB,
    STORAGE_DTYPES,
    ShardIndex,
    collection_elicitation,
    list_shards,
    read_shard,
    read_shard_info,
    write_shard,
)

__all__ = [
    "Problem",
    "BENCHMARKS",
    "load_benchmark",
    "CollectedProblem",
    "MODES",
    "AnswerGroup",
    "AnswerColumns",
    "draw_sequences",
    "partition_sequences",
    "select_answers",
    "read_group",
    "answer_group",
    "STORAGE_DTYPES",
    "SHARD_GLOB",
    "ShardIndex",
    "write_shard",
    "read_shard",
    "read_shard_info",
    "list_shards",
    "collection_elicitation",
    "ShardDataset",
    "collate_groups",
    "VERIFIER_INPUTS",
    "load_split",
    "PRELOAD_BYTES",
]
