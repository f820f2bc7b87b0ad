"""``hf-msv evaluate``: flags from `EvaluateConfig`, then `evaluate_study`."""

from __future__ import annotations

import json
from pathlib import Path

from ..arguments import parse_command_args
from .config import EvaluateConfig
from .results import StudyResults
from .study import evaluate_study

__all__ = ["main"]


def main(argv: list[str] | None = None) -> StudyResults:
    """``hf-msv evaluate [flags]``: evaluate, then print the report's and JSON's paths (``--config FILE`` and
    ``--log-level`` as every command takes them: `hf_msv.arguments.parse_command_args`); returns the
    `StudyResults`."""
    from transformers import HfArgumentParser
    from transformers.hf_argparser import DataClassType

    parser = HfArgumentParser(
        DataClassType(EvaluateConfig),
        description="Baselines, metrics, figures and λ rules over collected shards and trained verifiers.",
    )
    (config,) = parse_command_args(parser, argv)
    results = evaluate_study(config)  # every input named in the config: verifier specs, costs, problems
    out = Path(config.output_dir)
    print(
        json.dumps({"report": str(out / f"{config.report_name}.md"), "json": str(out / f"{config.report_name}.json")})
    )
    return results


if __name__ == "__main__":
    main()
