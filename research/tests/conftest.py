"""The research tests reuse the product tests' helpers (``tests/test_evaluation.write_split``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
