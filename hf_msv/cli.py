"""`hf-msv <command> [flags]`: a thin dispatcher to each package's ``main`` (flags built from its config dataclasses).

    hf-msv demo --problems 3          # hf_msv.demo.main(["--problems", "3"])
    hf-msv collect --help             # the flags of hf_msv.collect.CollectConfig
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("hf_msv.demo", "N parallel samples per problem, MSV selection and early stopping"),
    "collect": ("hf_msv.collect", "sample N answers per problem and write hidden-state shards"),
    "train": ("hf_msv.training", "train an MSV_N or a probe on collected shards"),
    "evaluate": ("hf_msv.evaluation", "baselines, metrics, figures and λ rules over collected shards"),
    "reproduce": ("hf_msv.reproduction", "the paper's experiments on the testbed (--quick: ~10 min)"),
}
"""Command -> (module whose ``main(argv)`` runs it, one line of help)."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: only ``--help`` and the list of commands (each command parses its own flags)."""
    parser = argparse.ArgumentParser(prog="hf-msv", description="Multi-Sequence Verifiers: sample, verify, stop early.",
                                     epilog="`hf-msv <command> --help` lists the flags of one command.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints the help, or an error naming the valid commands, and exits
        return
    module, _ = COMMANDS[argv[0]]
    importlib.import_module(module).main(argv[1:])  # imported late: only the command that runs


if __name__ == "__main__":
    main()
