"""Choosing the early-stopping threshold λ on validation, once for training, evaluation and the shipped verifier.

Two rules over the same per-group replay outcomes (`choose_lambda`):

* **guarantee** (`epsilon` given): Learn-then-Test (Angelopoulos et al., 2021) on the paired loss
  ℓ_g(λ) = 1[full decoding is right ∧ the stopped answer is wrong], averaged per problem. λ is certified when
  H0: E[ℓ(λ)] > ε is rejected at level δ (binomial p-value for 0/1 losses, Hoeffding–Bentkus otherwise), testing
  from the largest λ down and stopping at the first non-rejection (fixed-sequence: no multiplicity correction).
  The cheapest certified λ then loses at most ε of full decoding's accuracy with probability ≥ 1 − δ over the
  draw of the validation problems. With no observed loss the first test needs (1 − ε)ⁿ ≤ δ, i.e.
  n ≥ log δ / log(1 − ε) problems (`problems_needed`); below that nothing is certified and λ = ∞.
* **target** (no `epsilon`): the cheapest λ whose validation accuracy reaches `target_fraction` × full decoding's
  (ties: more accurate, then larger λ); λ = ∞ with ``reached=False`` when none that stops early does.

λ = ∞ never stops (full decoding); it must be in the grid. See ``docs/early_stopping.md``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .errors import UserError

__all__ = [
    "CALIBRATION_FRACTION",
    "DELTA",
    "EPSILON",
    "LAMBDAS",
    "LAMBDA_RULES",
    "TARGET_FRACTION",
    "JointChoice",
    "LambdaChoice",
    "choose_jointly",
    "choose_lambda",
    "lambda_index",
    "ltt_p_value",
    "net_loss_p_value",
    "problems_needed",
    "smallest_epsilon",
]

# 0..1 plus ∞ (never stop), so every curve contains the full-decoding point: 0.001 steps below 0.1 and above 0.9,
# 0.01 between. A calibrated statistic is small where stops come early and near 1 where they are safe: with 0.01
# steps a curve jumped from the first answer (22 % of full decoding's tokens) to 32 % between two grid points, so
# matched-budget accuracy at 30 % read the first-answer point.
LAMBDAS = np.concatenate(
    [
        np.round(np.linspace(0.0, 0.1, 101), 3),
        np.round(np.linspace(0.11, 0.89, 79), 2),
        np.round(np.linspace(0.9, 1.0, 101), 3),
        [np.inf],
    ]
)


def lambda_index(lam: float, lambdas=LAMBDAS) -> int:
    """The index of λ in a grid (∞: the grid's ∞, full decoding).

    Args:
        lam: a λ of the grid, or ∞.
        lambdas: the grid (default `LAMBDAS`).

    Raises:
        ValueError: `lam` is not in the grid.
    """
    grid = np.asarray(lambdas, np.float64).reshape(-1)
    found = np.flatnonzero(np.isinf(grid) if math.isinf(lam) else grid == lam)
    if not found.size:
        raise ValueError(f"λ = {lam} is not in the grid")
    return int(found[0])


TARGET_FRACTION = 0.95  # the plain rule's default target: 0.95 × full-decoding accuracy
# What a trained verifier saves: the guarantee's λ (∞, full decoding, when nothing is certified), or the target's.
LAMBDA_RULES = ("guarantee", "target")
CALIBRATION_FRACTION = 0.5  # the share of validation problems held out to choose λ on (the rest fit the stop head)
EPSILON, DELTA = 0.02, 0.1  # the guarantee's default tolerance and risk: lose ≤ 2 pp with probability ≥ 0.9


@dataclass(frozen=True)
class LambdaChoice:
    """The λ chosen on validation and the evidence behind it.

    Args:
        lam: the threshold (∞: never stop).
        rule: "guarantee" or "target".
        reached: guarantee: some λ < ∞ was certified; target: some λ that stops early reaches the target.
        epsilon, delta: the guarantee's tolerance and risk (None for the target rule).
        target: the accuracy target (target rule; None otherwise).
        num_problems: validation problems the choice rests on.
        problems_needed: problems that certify ε at δ when no loss is observed (guarantee rule).
        accuracy, tokens, loss: validation accuracy, mean tokens per group and paired loss at `lam`.
        full_accuracy, full_tokens: the same at full decoding.
    """

    lam: float
    rule: str
    reached: bool
    epsilon: float | None
    delta: float | None
    target: float | None
    num_problems: int
    problems_needed: int | None
    accuracy: float
    tokens: float
    loss: float
    full_accuracy: float
    full_tokens: float

    @property
    def token_fraction(self) -> float:
        return self.tokens / self.full_tokens if self.full_tokens > 0 else math.nan

    def to_dict(self) -> dict:
        """JSON-ready (λ = ∞ as None)."""
        return asdict(self) | {"lam": None if math.isinf(self.lam) else self.lam}

    @classmethod
    def from_dict(cls, d: dict) -> LambdaChoice:
        """The choice written by `to_dict`.

        Args:
            d: a dict of the fields (``lam`` None for ∞).

        Returns:
            The `LambdaChoice`.
        """
        fields = dict(d)
        fields["lam"] = math.inf if d["lam"] is None else float(d["lam"])
        return cls(**fields)

    @classmethod
    def of(cls, config) -> LambdaChoice | None:
        """The λ choice a verifier's config carries (``config.early_stopping["lambda"]``), else None.

        Args:
            config: a verifier config (any object; a missing ``early_stopping`` means no choice).

        Returns:
            The `LambdaChoice`, or None.
        """
        stored = (getattr(config, "early_stopping", None) or {}).get("lambda")
        return None if stored is None else cls.from_dict(stored)

    def describe(self) -> str:
        """One line for logs, cards and the demo."""
        digits = 2 if round(self.lam, 2) == self.lam else 3  # the grid's third decimal (0.975) is not rounded away
        where = "λ = ∞ (never stops)" if math.isinf(self.lam) else f"λ = {self.lam:.{digits}f}"
        if self.rule == "guarantee":
            if not self.reached:
                delta = self.delta or DELTA
                return (
                    f"{where}: {self.num_problems} calibration problems certify no early stop for ε = "
                    f"{self.epsilon:g} at δ = {delta:g} (ε needs ≥ {self.problems_needed} problems without an "
                    f"observed loss; ε = 0.01 needs ≥ {problems_needed(0.01, delta)}); {self.num_problems} problems "
                    f"certify at best ε = {smallest_epsilon(self.num_problems, delta):.3f}; full decoding"
                )
            return (
                f"{where}: loses at most {self.epsilon:g} of full-decoding accuracy with probability ≥ "
                f"{1 - (self.delta or 0.0):g} (Learn-then-Test, {self.num_problems} calibration problems); "
                f"calibration accuracy {self.accuracy:.3f} vs {self.full_accuracy:.3f} at {self.token_fraction:.0%} "
                "of the tokens"
            )
        status = "reached" if self.reached else "not reached by any λ that stops early"
        return (
            f"{where}: cheapest λ with calibration accuracy ≥ {self.target:.3f} ({status}; no guarantee); accuracy "
            f"{self.accuracy:.3f} vs {self.full_accuracy:.3f} at {self.token_fraction:.0%} of the tokens"
        )


def problems_needed(epsilon: float, delta: float) -> int:
    """The fewest problems with which a λ without observed loss is certified: (1 − ε)ⁿ ≤ δ.

    Args:
        epsilon: the tolerance ε in (0, 1).
        delta: the risk δ in (0, 1).

    Returns:
        The number of problems n (int).
    """
    return math.ceil(math.log(delta) / math.log1p(-epsilon))


def smallest_epsilon(num_problems: int, delta: float) -> float:
    """The smallest ε that `num_problems` problems can certify at δ, when no loss is observed: 1 − δ^(1/n).

    Args:
        num_problems: validation problems n.
        delta: the risk δ in (0, 1).

    Returns:
        ε (1.0 when n = 0).
    """
    return 1.0 - delta ** (1.0 / num_problems) if num_problems > 0 else 1.0


def ltt_p_value(losses: np.ndarray, epsilon: float) -> float:
    """p-value of H0: E[loss] > ε from (n,) per-problem losses in [0, 1]: the exact binomial tail
    P[Bin(n, ε) ≤ Σ loss] when every loss is 0 or 1, else Hoeffding–Bentkus (Bates et al., 2021).

    Args:
        losses: (n,) per-problem losses in [0, 1].
        epsilon: the tolerance ε.

    Returns:
        The p-value (float).
    """
    from scipy.stats import binom

    losses = np.asarray(losses, dtype=np.float64)
    n, total = losses.size, float(losses.sum())
    if np.all((losses == 0) | (losses == 1)):
        return float(binom.cdf(round(total), n, epsilon))
    mean = total / n
    if mean >= epsilon:
        return 1.0
    h1 = (
        mean * math.log(mean / epsilon) + (1 - mean) * math.log((1 - mean) / (1 - epsilon))
        if mean > 0
        else -math.log1p(-epsilon)
    )
    hoeffding = math.exp(-n * h1)
    bentkus = math.e * float(binom.cdf(math.ceil(n * mean), n, epsilon))
    return min(hoeffding, bentkus, 1.0)


def net_loss_p_value(losses: np.ndarray, epsilon: float, delta: float, seed: int = 0) -> float:
    """p-value of H0: E[loss] ≥ ε for (n,) per-problem losses in [−1, 1] (the *net* accuracy drop against full
    decoding: 1[full right] − 1[output right], which gains offset), by betting (Waudby-Smith & Ramdas, 2023): the
    capital K_t = Π_i (1 + λ_i (α − x_i)) of x = (loss + 1) / 2 against α = (ε + 1) / 2 is a nonnegative
    supermartingale under H0, so 1 / max_t K_t is a valid p-value (Ville's inequality). The bets λ_i are predictable
    (WSR's plug-in, tuned to the level `delta`), the problems taken in a seeded random order.

    Args:
        losses: (n,) per-problem net losses in [−1, 1].
        epsilon: the tolerance ε.
        delta: the level the bets are tuned to (the p-value is valid whatever it is).
        seed: the order's seed.

    Returns:
        The p-value (float, ≤ 1).
    """
    x = (np.asarray(losses, dtype=np.float64).reshape(-1) + 1.0) / 2.0
    x = x[np.random.default_rng(seed).permutation(x.size)]
    alpha = (epsilon + 1.0) / 2.0
    n = x.size
    if n == 0:
        return 1.0
    # WSR's running estimates μ̂_t, σ̂²_t (over x_1..x_t, with a prior of one pseudo-observation); bet t reads σ̂²_{t−1}.
    t = np.arange(1, n + 1)
    mean = (0.5 + np.cumsum(x)) / (t + 1)
    var = (0.25 + np.cumsum((x - mean) ** 2)) / (t + 1)
    var_before = np.r_[0.25, var[:-1]]
    bet = np.minimum(np.sqrt(2.0 * math.log(1.0 / delta) / (n * var_before)), 0.75 / alpha)
    log_capital = np.cumsum(np.log1p(bet * (alpha - x)))
    return float(min(1.0, math.exp(-max(0.0, float(log_capital.max())))))


def choose_lambda(
    lambdas,
    correct,
    tokens,
    problem_of=None,
    *,
    epsilon: float | None = None,
    delta: float = DELTA,
    target_fraction: float = TARGET_FRACTION,
    target_accuracy: float | None = None,
) -> LambdaChoice:
    """Pick λ from per-group replay outcomes on validation (module docstring for the two rules).

    Args:
        lambdas: (Λ,) the grid; must contain ∞.
        correct: (G, Λ) bool, the stopped answer is right.
        tokens: (G, Λ) tokens decoded by the group's chains at the stop.
        problem_of: (G,) the problem of each group (default: one group per problem); the guarantee is over
            problems, so groups of one problem are averaged.
        epsilon: the guarantee's tolerance in accuracy (0 < ε < 1); None selects the target rule.
        delta: the guarantee's risk level.
        target_fraction: the target rule's fraction of full-decoding accuracy.
        target_accuracy: an absolute accuracy target instead (overrides `target_fraction`).

    Returns:
        A `LambdaChoice`.

    Raises:
        ValueError: if `lambdas` does not contain ∞.
        UserError: if `epsilon` or `delta` is outside (0, 1) (guarantee rule), or there are no groups.
    """
    lam = np.asarray(lambdas, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct, dtype=bool).reshape(-1, lam.size)
    tokens = np.asarray(tokens, dtype=np.float64).reshape(-1, lam.size)
    if not np.isinf(lam).any():
        raise ValueError("the λ grid needs ∞ (full decoding): the rules measure against it")
    if epsilon is not None and not (0 < epsilon < 1 and 0 < delta < 1):
        raise UserError(f"need 0 < epsilon < 1 and 0 < delta < 1, got epsilon={epsilon}, delta={delta}")
    if not len(correct):
        raise UserError("no validation groups to choose λ on")
    problem_of = np.arange(len(correct)) if problem_of is None else np.asarray(problem_of).reshape(-1)
    _, problem = np.unique(problem_of, return_inverse=True)
    full = int(np.flatnonzero(np.isinf(lam))[0])
    accuracy, mean_tokens = correct.mean(0), tokens.mean(0)
    loss = correct[:, [full]] & ~correct  # (G, Λ) paired loss
    per_problem = np.stack(
        [np.bincount(problem, weights=loss[:, j]) / np.bincount(problem) for j in range(lam.size)], 1
    )  # (P, Λ)

    def choice(pick: int, rule: str, reached: bool, target: float | None, needed: int | None) -> LambdaChoice:
        return LambdaChoice(
            lam=float(lam[pick]),
            rule=rule,
            reached=reached,
            epsilon=epsilon,
            delta=delta if epsilon else None,
            target=target,
            num_problems=int(per_problem.shape[0]),
            problems_needed=needed,
            accuracy=float(accuracy[pick]),
            tokens=float(mean_tokens[pick]),
            loss=float(loss[:, pick].mean()),
            full_accuracy=float(accuracy[full]),
            full_tokens=float(mean_tokens[full]),
        )

    if epsilon is not None:
        pick, reached = _certified(lam, per_problem, epsilon, delta)
        reached = bool(reached and mean_tokens[pick] < mean_tokens[full])  # a λ that never stops saves nothing
        return choice(pick, "guarantee", reached, None, problems_needed(epsilon, delta))
    target = float(target_accuracy) if target_accuracy is not None else target_fraction * float(accuracy[full])
    early = np.isfinite(lam) & (mean_tokens < mean_tokens[full])
    ok = np.flatnonzero(early & (accuracy >= target - 1e-12))
    pick = int(min(ok, key=lambda i: (mean_tokens[i], -accuracy[i], -lam[i]))) if ok.size else full
    return choice(pick, "target", bool(ok.size), target, None)


def _certified(lam: np.ndarray, per_problem: np.ndarray, epsilon: float, delta: float) -> tuple[int, bool]:
    """Fixed-sequence testing from the largest finite λ down: (index of the cheapest certified λ, or of ∞; any)."""
    pick, reached = int(np.flatnonzero(np.isinf(lam))[0]), False
    for j in np.argsort(-np.where(np.isinf(lam), -np.inf, lam), kind="stable"):
        if np.isinf(lam[j]):
            break
        if ltt_p_value(per_problem[:, j], epsilon) > delta:
            break
        pick, reached = int(j), True
    return pick, reached


@dataclass(frozen=True)
class JointChoice:
    """A (setting, λ) pair certified jointly over several settings of a rule applied beside the stop (e.g. pruning
    rules, `hf_msv.training.pruned_replay.fit_pruning`) by `choose_jointly`.

    Args:
        setting: index of the chosen setting.
        choice: the chosen λ with its calibration figures; ``full_accuracy`` and ``full_tokens`` are the reference's
            (full decoding with no setting applied), ``reached`` whether anything that saves tokens was certified.
        delta_per_setting: the level each setting's fixed-sequence test ran at (δ / the number of settings).
        cheapest: per setting, its cheapest certified λ (None: none certified).
        procedure: the multiple-testing procedure.
    """

    setting: int
    choice: LambdaChoice
    delta_per_setting: float
    cheapest: tuple[float | None, ...]
    procedure: str = "bonferroni over settings, fixed-sequence over λ (∞, then largest first)"

    def to_dict(self) -> dict:
        inf = lambda v: None if v is None or math.isinf(v) else v
        return {
            "setting": self.setting,
            "choice": self.choice.to_dict(),
            "delta_per_setting": self.delta_per_setting,
            "cheapest": [inf(v) if v is not None else None for v in self.cheapest],
            "certified": [v is not None for v in self.cheapest],
            "procedure": self.procedure,
        }


def choose_jointly(
    lambdas,
    correct,
    tokens,
    reference_correct,
    reference_tokens,
    problem_of=None,
    *,
    epsilon: float,
    delta: float = DELTA,
    loss: str = "paired",
) -> JointChoice:
    """Learn-then-Test over K settings × Λ thresholds: the cheapest (setting, λ) among those certified to lose at
    most ε of the reference's accuracy (full decoding), with probability ≥ 1 − δ over the calibration problems.

    Multiple testing: each setting tests its own λ sequence by fixed-sequence testing at level δ / K (λ = ∞ first,
    where only the setting acts, then from the largest finite λ down, stopping at the first non-rejection), and a
    union bound over the K settings (Bonferroni) keeps the family-wise error ≤ δ: with probability ≥ 1 − δ every
    certified pair loses at most ε, so any choice among them, the cheapest included, keeps the guarantee. A pair
    that processes no fewer tokens than the reference saves nothing and is not chosen.

    Args:
        lambdas: (Λ,) the grid; must contain ∞.
        correct: (K, G, Λ) bool, the output is right.
        tokens: (K, G, Λ) what the pair costs per group (the cost minimised).
        reference_correct, reference_tokens: (G,) full decoding's correctness and cost.
        problem_of: (G,) the problem of each group (losses are averaged per problem).
        epsilon, delta: the tolerance and the family-wise risk.
        loss: ``"paired"``, the λ rule's 1[full decoding right ∧ output wrong] (exact binomial test), or ``"net"``,
            the accuracy drop 1[full right] − 1[output right] (gains offset losses; `net_loss_p_value`).

    Returns:
        The `JointChoice`; when nothing is certified, setting 0 at λ = ∞ with ``choice.reached`` False.

    Raises:
        ValueError: if `lambdas` does not contain ∞.
        UserError: if `epsilon` or `delta` is outside (0, 1).
    """
    lam = np.asarray(lambdas, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct, dtype=bool)
    tokens = np.asarray(tokens, dtype=np.float64)
    ref = np.asarray(reference_correct, dtype=bool).reshape(-1)
    ref_tokens = np.asarray(reference_tokens, dtype=np.float64).reshape(-1)
    if not np.isinf(lam).any():
        raise ValueError("the λ grid needs ∞ (full decoding)")
    if not (0 < epsilon < 1 and 0 < delta < 1):
        raise UserError(f"need 0 < epsilon < 1 and 0 < delta < 1, got epsilon={epsilon}, delta={delta}")
    k_settings = correct.shape[0]
    problem_of = np.arange(ref.size) if problem_of is None else np.asarray(problem_of).reshape(-1)
    _, problem = np.unique(problem_of, return_inverse=True)
    counts = np.bincount(problem)
    level = delta / k_settings
    # λ = ∞ first (the setting alone), then the largest finite λ down.
    order = np.argsort(-np.where(np.isinf(lam), np.inf, lam), kind="stable")
    best: tuple[float, int, int] | None = None
    cheapest: list[float | None] = []
    if loss not in ("paired", "net"):
        raise UserError(f"loss must be 'paired' or 'net', got {loss!r}")
    for k in range(k_settings):
        if loss == "paired":
            losses = (ref[:, None] & ~correct[k]).astype(np.float64)  # (G, Λ) paired loss against full decoding
        else:
            losses = ref[:, None].astype(np.float64) - correct[k]  # (G, Λ) net accuracy drop
        mean_tokens = tokens[k].mean(0)
        found: int | None = None
        for j in order:
            per_problem = np.bincount(problem, weights=losses[:, j]) / counts
            p = (
                ltt_p_value(per_problem, epsilon)
                if loss == "paired"
                else net_loss_p_value(per_problem, epsilon, level)
            )
            if p > level:
                break
            if mean_tokens[j] < ref_tokens.mean() and (found is None or mean_tokens[j] < mean_tokens[found]):
                found = int(j)
        cheapest.append(None if found is None else float(lam[found]))
        if found is not None and (best is None or mean_tokens[found] < best[0]):
            best = (float(mean_tokens[found]), k, found)
    setting, pick = (0, int(np.flatnonzero(np.isinf(lam))[0])) if best is None else best[1:]
    paired = ref & ~correct[setting][:, pick]
    choice = LambdaChoice(
        lam=float(lam[pick]),
        rule="guarantee",
        reached=best is not None,
        epsilon=epsilon,
        delta=delta,
        target=None,
        num_problems=int(counts.size),
        problems_needed=problems_needed(epsilon, level),
        accuracy=float(correct[setting][:, pick].mean()),
        tokens=float(tokens[setting][:, pick].mean()),
        loss=float(paired.mean()),
        full_accuracy=float(ref.mean()),
        full_tokens=float(ref_tokens.mean()),
    )
    procedure = JointChoice.procedure if loss == "paired" else JointChoice.procedure + "; net loss, betting test"
    return JointChoice(setting, choice, level, tuple(cheapest), procedure)
