"""The first testbed's commands, each the package's own with testbed v1 registered and selected (``--task v1``).

    python -m research.testbed_v1 train-lm --threads 2 --output-dir research/testbed_v1/lm   # its LM (~27 min)
    python -m research.testbed_v1 reproduce --threads 2 --train-workers 2                    # docs/results/testbed*.md
    python -m research.testbed_v1 quality                                   # research/testbed_quality.py on v1

Every option after the command is that command's (``python -m research.testbed_v1 reproduce --help``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from . import TASK

COMMANDS = ("train-lm", "reproduce", "quality")


def _quality_main():
    """``research/testbed_quality.py``'s ``main`` (a script beside this package, not a module of it)."""
    path = Path(__file__).resolve().parents[1] / "testbed_quality.py"
    spec = importlib.util.spec_from_file_location("testbed_quality", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        raise SystemExit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    command, rest = argv[0], argv[1:]
    rest = rest if "--task" in rest else ["--task", TASK.name, *rest]
    if command == "train-lm":
        from hf_msv.testbed.train_lm import main as run
    elif command == "reproduce":
        from hf_msv.reproduction.pipeline import main as run
    else:
        run = _quality_main()
    return run(rest)


if __name__ == "__main__":
    main()
