"""Problems, collected records, hidden-state shards, and the groups that training and evaluation read from them."""

from .problems import (
    Problem,
    BENCHMARKS,
    load_benchmark,
)
from .records import CollectedProblem
from .groups import (
    MODES,
    AnswerGroup,
    AnswerColumns,
    draw_sequences,
    partition_sequences,
    select_answers,
    read_group,
    answer_group,
)
from .shards import (
    STORAGE_DTYPES,
    SHARD_GLOB,
    ShardIndex,
    write_shard,
    read_shard,
    read_shard_info,
    list_shards,
    collection_elicitation,
)
from .dataset import (
    ShardDataset,
    collate_groups,
    VERIFIER_INPUTS,
    load_split,
    PRELOAD_BYTES,
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
