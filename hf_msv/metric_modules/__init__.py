"""Local `evaluate` modules. Load offline with ``evaluate.load(MSV_CALIBRATION_PATH)`` (or the .py file inside it)."""

from pathlib import Path

MSV_CALIBRATION_PATH = str(Path(__file__).parent / "msv_calibration")

__all__ = ["MSV_CALIBRATION_PATH"]
