"""Running ``hf-msv`` commands in the test process."""

from __future__ import annotations


def run_command(argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``hf-msv argv`` in this process (0 when it returns).

    Args:
        argv: the command line after ``hf-msv``.
        capsys: pytest's ``capsys`` fixture (what was printed before is discarded).

    Returns:
        The exit code and the captured stdout and stderr.
    """
    from hf_msv.cli import main

    capsys.readouterr()  # what ran before
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err
