"""`evaluate` metric wrapping hf_msv.metrics: AUROC, Brier, ECE (10 equal-width bins) and NLL of correctness
probabilities. Lives in a folder of the same name so both ``evaluate.load(<folder>)`` and
``evaluate.load(<folder>/msv_calibration.py)`` work offline."""

import datasets
import evaluate
import numpy as np

from hf_msv.metrics import calibration_metrics

_DESCRIPTION = """Calibration of a verifier's correctness probabilities, as in the Multi-Sequence Verifier paper:
AUROC (nan when only one class is present), Brier score, expected calibration error with `n_bins` equal-width bins
(default 10) and negative log-likelihood (probabilities clipped to [1e-7, 1 - 1e-7])."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of float, predicted probability that each answer is correct, in [0, 1].
    references: list of int, 1 if the answer is correct else 0.
    n_bins: int, ECE bins (default 10).
Returns:
    dict with "auroc", "brier", "ece", "nll".
Examples:
    >>> m = evaluate.load("hf_msv/metric_modules/msv_calibration")
    >>> m.compute(predictions=[0.9, 0.2], references=[1, 0])["brier"]
    0.025
"""

_CITATION = """@misc{msv, title={Multi-Sequence Verifiers}}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MsvCalibration(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("int32")}
            ),
        )

    def _compute(self, *, predictions=None, references=None, n_bins: int = 10, **kwargs):
        # evaluate passes the columns and the options by keyword
        return calibration_metrics(np.asarray(predictions, dtype=np.float64), np.asarray(references), n_bins)
