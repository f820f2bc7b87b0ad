"""The research tests reuse the product tests' helpers (``tests/helpers``, e.g. ``helpers.evaluation.write_split``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `import research.testbed_v1`

from helpers.testbed import tiny_v2_lm  # noqa: F401  (the product tests' tiny v2 LM fixture)
