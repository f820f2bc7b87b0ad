"""Collection: problems -> N sampled sequences -> answers and hidden states -> shards."""

from .live import (
    collect,
    CollectResult,
    ConfidenceRecorder,
    load_problems,
    load_lm,
    done_problem_ids,
    write_index,
    add_collect_arguments,
    collect_from_args,
    main,
)

__all__ = [
    "collect",
    "CollectResult",
    "ConfidenceRecorder",
    "load_problems",
    "load_lm",
    "done_problem_ids",
    "write_index",
    "add_collect_arguments",
    "collect_from_args",
    "main",
]
