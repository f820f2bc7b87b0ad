"""The paper's numbers the testbed reproduction is compared with, and the study settings taken from it.

Mean over seeds, from the tables of the full report (AIME column unless stated): `PAPER` is data only, read by
`hf_msv.reproduction.claims` (targets and the "paper" column of each claim) and `hf_msv.reproduction.report`.
"""

from __future__ import annotations

__all__ = ["PAPER", "CHECKER_KWARGS", "MASKS"]

PAPER = {
    "source": "Calibrated and Efficient Parallel Test-Time Scaling with Multi-Sequence Verifiers (tables of the "
    "full report; AIME column unless stated)",
    # Table "AUROC / Brier of verifiers on terminal answers" (AIME)
    "terminal": {
        "1": {
            "Token Probs": {"auroc": 0.8999, "brier": 0.3073},
            "Probe": {"auroc": 0.9461, "brier": 0.0859},
            "MSV_1": {"auroc": 0.9469, "brier": 0.0819},
            "PRM": {"auroc": 0.9374, "brier": 0.1472},
        },
        "4": {
            "Token Probs+WV": {"auroc": 0.8223, "brier": 0.2239},
            "Self-consistency": {"auroc": 0.8001, "brier": 0.2274},
            "Probe+WV": {"auroc": 0.8624, "brier": 0.2100},
            "MSV_1+WV": {"auroc": 0.8636, "brier": 0.2096},
            "PRM+WV": {"auroc": 0.8444, "brier": 0.2171},
            "MSV_N": {"auroc": 0.9628, "brier": 0.0687},
        },
        "16": {
            "Token Probs+WV": {"auroc": 0.8531, "brier": 0.1662},
            "Self-consistency": {"auroc": 0.8422, "brier": 0.1696},
            "Probe+WV": {"auroc": 0.9092, "brier": 0.1368},
            "MSV_1+WV": {"auroc": 0.9057, "brier": 0.1404},
            "PRM+WV": {"auroc": 0.8693, "brier": 0.1588},
            "MSV_N": {"auroc": 0.9732, "brier": 0.0572},
        },
        "64": {
            "Token Probs+WV": {"auroc": 0.8608, "brier": 0.1549},
            "Self-consistency": {"auroc": 0.8517, "brier": 0.1583},
            "Probe+WV": {"auroc": 0.9216, "brier": 0.1217},
            "MSV_1+WV": {"auroc": 0.9168, "brier": 0.1264},
            "PRM+WV": {"auroc": 0.8784, "brier": 0.1473},
            "MSV_N": {"auroc": 0.9822, "brier": 0.0387},
        },
    },
    # Table "Best-of-N accuracy" (AIME); N=1 is the base LM's accuracy
    "bon_accuracy": {
        "1": {"base": 0.2748},
        "4": {
            "Self-consistency": 0.3251,
            "Probe": 0.3771,
            "MSV_1": 0.3758,
            "PRM": 0.3744,
            "Probe+WV": 0.3847,
            "MSV_1+WV": 0.3852,
            "PRM+WV": 0.3570,
            "MSV_N": 0.3811,
        },
        "16": {
            "Self-consistency": 0.3566,
            "Probe": 0.4470,
            "MSV_1": 0.4325,
            "PRM": 0.4475,
            "Probe+WV": 0.4481,
            "MSV_1+WV": 0.4460,
            "PRM+WV": 0.3817,
            "MSV_N": 0.4615,
        },
        "64": {
            "Self-consistency": 0.3594,
            "Probe": 0.4897,
            "MSV_1": 0.4621,
            "PRM": 0.4688,
            "Probe+WV": 0.4790,
            "MSV_1+WV": 0.4714,
            "PRM+WV": 0.3884,
            "MSV_N": 0.5098,
        },
    },
    # Table "ECE / Brier of confidence on best-of-N answers" (AIME)
    "bon_calibration": {
        "16": {
            "Self-consistency": {"ece": 0.1927, "brier": 0.4558},
            "Probe": {"ece": 0.2364, "brier": 0.3776},
            "MSV_1": {"ece": 0.2407, "brier": 0.3754},
            "Probe+WV": {"ece": 0.1633, "brier": 0.4286},
            "MSV_1+WV": {"ece": 0.1659, "brier": 0.4352},
            "MSV_N": {"ece": 0.0876, "brier": 0.2067},
        },
        "64": {
            "Self-consistency": {"ece": 0.1733, "brier": 0.4341},
            "Probe": {"ece": 0.3013, "brier": 0.5159},
            "MSV_1": {"ece": 0.3162, "brier": 0.5324},
            "Probe+WV": {"ece": 0.1222, "brier": 0.4165},
            "MSV_1+WV": {"ece": 0.1302, "brier": 0.4232},
            "MSV_N": {"ece": 0.0749, "brier": 0.2351},
        },
    },
    # Table "AUROC / Brier of verifiers on streaming answers" (AIME)
    "streaming": {
        "1": {
            "Token Probs": {"auroc": 0.8858, "brier": 0.3217},
            "PRM": {"auroc": 0.9309, "brier": 0.1185},
            "Probe": {"auroc": 0.9120, "brier": 0.0796},
            "MSV_1": {"auroc": 0.9056, "brier": 0.0642},
        },
        "4": {
            "Token Probs+WV": {"auroc": 0.8601, "brier": 0.2990},
            "PRM+WV": {"auroc": 0.8646, "brier": 0.1241},
            "Probe+WV": {"auroc": 0.8702, "brier": 0.0842},
            "MSV_1+WV": {"auroc": 0.8826, "brier": 0.0763},
            "MSV_N": {"auroc": 0.9312, "brier": 0.0472},
        },
        "16": {
            "Token Probs+WV": {"auroc": 0.8604, "brier": 0.2967},
            "PRM+WV": {"auroc": 0.8497, "brier": 0.1266},
            "Probe+WV": {"auroc": 0.8609, "brier": 0.0873},
            "MSV_1+WV": {"auroc": 0.8749, "brier": 0.0804},
            "MSV_N": {"auroc": 0.9532, "brier": 0.0375},
        },
        "64": {
            "Token Probs+WV": {"auroc": 0.8592, "brier": 0.2966},
            "PRM+WV": {"auroc": 0.8451, "brier": 0.1272},
            "Probe+WV": {"auroc": 0.8588, "brier": 0.0878},
            "MSV_1+WV": {"auroc": 0.8731, "brier": 0.0812},
            "MSV_N": {"auroc": 0.9662, "brier": 0.0309},
        },
    },
    # Early stopping (MATH, N=64): "the maximum achievable accuracy with single-sequence baselines can be achieved by
    # MSV_64 with less than half the token budget"; the issue's target is a fraction <= 0.40.
    "early_stop": {"token_fraction_statement": "< 0.5 (MATH, N=64)", "token_fraction_target": 0.40},
    # Latency table (AIME, seconds, lambda = 1): CoT / answer generation / verifier inference
    "latency": {
        "cot": {"4": 52.8, "16": 62.4, "64": 131.6},
        "answers": {"4": 1.5, "16": 1.8, "64": 3.8},
        "verifier": {"Probe": {"4": 0.0008, "16": 0.003, "64": 0.01}, "MSV_N": {"4": 0.4, "16": 2.3, "64": 23.2}},
    },
    # Table "Best-of-64 accuracy on Omni-MATH under different equivalence checkers"
    "checkers": {
        "reference": {
            "agreement": 1.000,
            "Self-consistency": 0.279,
            "Probe+WV": 0.321,
            "MSV_1+WV": 0.318,
            "MSV_64 (reference-trained)": 0.356,
            "MSV_64 (trained with checker)": 0.348,
        },
        "exact": {
            "agreement": 0.990,
            "Self-consistency": 0.277,
            "Probe+WV": 0.321,
            "MSV_1+WV": 0.318,
            "MSV_64 (reference-trained)": 0.355,
            "MSV_64 (trained with checker)": 0.345,
        },
        "jaccard": {
            "agreement": 0.970,
            "Self-consistency": 0.277,
            "Probe+WV": 0.316,
            "MSV_1+WV": 0.315,
            "MSV_64 (reference-trained)": 0.352,
            "MSV_64 (trained with checker)": 0.345,
        },
        "embedding": {
            "agreement": 0.894,
            "Self-consistency": 0.272,
            "Probe+WV": 0.301,
            "MSV_1+WV": 0.298,
            "MSV_64 (reference-trained)": 0.328,
            "MSV_64 (trained with checker)": 0.344,
        },
        "random": {
            "agreement": 0.467,
            "Self-consistency": 0.246,
            "Probe+WV": 0.246,
            "MSV_1+WV": 0.246,
            "MSV_64 (reference-trained)": 0.251,
            "MSV_64 (trained with checker)": 0.336,
        },
    },
    # Table "Mask ablation, AIME, streaming MSV_16"
    "masks": {
        "MSV_16": {"brier": 0.038, "auroc": 0.953, "nll": 0.150},
        "w/o full": {"brier": 0.040, "auroc": 0.953, "nll": 0.157},
        "w/o equivalence": {"brier": 0.045, "auroc": 0.922, "nll": 0.236},
        "w/o within_sequence": {"brier": 0.048, "auroc": 0.945, "nll": 0.192},
        "w/o within_answer": {"brier": 0.050, "auroc": 0.949, "nll": 0.169},
    },
    # Table "AUTC with different delimiters, AIME, N=16" (raw AUTC in accuracy x tokens)
    "delimiters": {
        "Wait": {"Probe": 1024.2, "MSV_1": 954.8, "MSV_N": 1078.3},
        "Alternatively": {"Probe": 985.9, "MSV_1": 980.0, "MSV_N": 1012.4},
        "But": {"Probe": 1039.3, "MSV_1": 1023.6, "MSV_N": 1070.7},
        "every K tokens": {"Probe": 910.9, "MSV_1": None, "MSV_N": 1013.9},
    },
    # Table "Brier score of Probe on AIME as a function of training set size" (terminal answers)
    "training_size": {
        "Probe": {"56": 0.0833, "112": 0.0821, "224": 0.0809, "448": 0.0812},
        "statement": "Probe's Brier plateaus beyond 224 problems; 448 gives no improvement",
    },
    # Appendix "Scaling with MSV_M": figure only; the claims are qualitative
    "grouping": {
        "statement": "MSV_64 (grouped) dominates the single-sequence baselines in accuracy-latency at "
        "N=128 and 256, and its latency scales linearly in N"
    },
}

# The weak equivalence checkers of the checker-robustness study, with the settings they run under (the paper's
# Omni-MATH
# table: exact match, Jaccard ≥ 0.8, embedding cosine ≥ 0.85, and a coin flip as the worst case).
CHECKER_KWARGS = {
    "exact": {},
    "jaccard": {"threshold": 0.8},
    "embedding": {"threshold": 0.85},
    "random": {"probability": 0.5, "seed": 0},
}
# The MSV's four attention masks; the mask ablation removes one at a time.
MASKS = ("full", "equivalence", "within_sequence", "within_answer")
