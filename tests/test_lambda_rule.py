"""The one λ rule (hf_msv.lambda_rule): Learn-then-Test on the paired loss and the target rule."""

import math

import numpy as np
import pytest

from hf_msv.lambda_rule import (
    LAMBDAS,
    LambdaChoice,
    choose_lambda,
    lambda_index,
    ltt_p_value,
    problems_needed,
    smallest_epsilon,
)


def test_problems_needed_and_the_binomial_p_value():
    assert problems_needed(0.01, 0.1) == 230  # (1 − ε)^n ≤ δ
    assert problems_needed(0.02, 0.1) == 114
    assert ltt_p_value(np.zeros(230), 0.01) == pytest.approx(0.99**230)
    # 10 problems, 1 loss, ε = .3: P[Bin(10, .3) ≤ 1] = .7^10 + 10·.3·.7^9
    assert ltt_p_value(np.r_[1.0, np.zeros(9)], 0.3) == pytest.approx(0.7**10 + 3 * 0.7**9)
    assert ltt_p_value(np.full(10, 0.5), 0.3) == 1.0  # mean loss above ε: no evidence
    assert ltt_p_value(np.full(100, 0.05), 0.3) < 1e-6  # fractional losses (several groups per problem)


def _draw(rng, n, risk):
    """Per-problem outcomes over λ grid [.2, .5, .8, ∞] with known paired-loss rates `risk` and tokens."""
    lam = np.array([0.2, 0.5, 0.8, np.inf])
    full = rng.random(n) < 0.8
    lost = rng.random((n, 3)) < np.asarray(risk)[None, :] / 0.8
    correct = np.concatenate([full[:, None] & ~lost, full[:, None]], 1)
    tokens = np.tile([10.0, 20.0, 30.0, 40.0], (n, 1))
    return lam, correct, tokens


def test_the_guarantee_holds_over_many_validation_draws():
    """With known paired-loss rates (λ = .2 loses 6 %, .5 exactly ε, .8 none), the certified λ loses more than ε in
    at most δ of the validation draws, and a λ that stops early is certified most of the time."""
    rng = np.random.default_rng(0)
    epsilon, delta, risk = 0.03, 0.1, [0.06, 0.03, 0.0]
    failures = early = 0
    for _ in range(400):
        lam, correct, tokens = _draw(rng, 400, risk)
        choice = choose_lambda(lam, correct, tokens, epsilon=epsilon, delta=delta)
        j = int(np.flatnonzero(lam == choice.lam)[0])
        failures += [*risk, 0.0][j] > epsilon  # H0 is "loss > ε": only λ = .2 is a failure
        early += choice.reached
    assert failures <= 0.1 * 400
    assert early >= 0.9 * 400


def test_too_few_problems_certify_nothing_and_say_how_many_would():
    rng = np.random.default_rng(1)
    lam, correct, tokens = _draw(rng, 32, [0.0, 0.0, 0.0])
    choice = choose_lambda(lam, correct, tokens, epsilon=0.01, delta=0.1)
    assert not choice.reached and math.isinf(choice.lam) and choice.problems_needed == 230
    assert "needs ≥ 230 problems" in choice.describe() and choice.num_problems == 32
    # What 32 problems can certify at best: (1 − ε)³² = δ, checked against the search that certifies it.
    best = smallest_epsilon(32, 0.1)
    assert "at best ε = 0.069" in choice.describe() and problems_needed(best + 1e-9, 0.1) == 32
    assert problems_needed(best - 1e-3, 0.1) > 32
    loose = choose_lambda(lam, correct, tokens, epsilon=best + 1e-3, delta=0.1)
    assert loose.reached  # no observed loss: the tolerance 32 problems can certify is certified


def test_groups_of_one_problem_are_averaged():
    lam, correct, tokens = _draw(np.random.default_rng(2), 200, [0.0, 0.0, 0.0])
    one = choose_lambda(lam, correct, tokens, epsilon=0.02, delta=0.1)
    twice = choose_lambda(
        lam, np.repeat(correct, 2, 0), np.repeat(tokens, 2, 0), np.repeat(np.arange(200), 2), epsilon=0.02, delta=0.1
    )
    assert twice.num_problems == one.num_problems == 200 and twice.lam == one.lam


def test_the_target_rule_is_the_cheapest_lambda_reaching_it():
    lam = np.array([0.2, 0.5, 0.8, np.inf])
    correct = np.array([[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 0, 0]], bool)
    tokens = np.tile([10.0, 20.0, 30.0, 40.0], (4, 1))
    choice = choose_lambda(lam, correct, tokens, target_fraction=0.95)  # full 0.75; target 0.7125
    assert (choice.lam, choice.accuracy, choice.tokens, choice.reached) == (0.5, 0.75, 20.0, True)
    unreachable = choose_lambda(lam, correct, tokens, target_accuracy=0.99)
    assert math.isinf(unreachable.lam) and not unreachable.reached
    assert LambdaChoice.from_dict(choice.to_dict()) == choice
    assert LambdaChoice.from_dict(unreachable.to_dict()).lam == math.inf


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="needs ∞"):
        choose_lambda([0.5, 0.9], np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="0 < epsilon < 1"):
        choose_lambda(LAMBDAS, np.ones((2, LAMBDAS.size)), np.ones((2, LAMBDAS.size)), epsilon=1.5)


def test_lambda_index_finds_grid_values_and_infinity_and_refuses_the_rest():
    assert LAMBDAS[lambda_index(0.975)] == 0.975 and LAMBDAS[lambda_index(0.05)] == 0.05
    assert lambda_index(math.inf) == LAMBDAS.size - 1
    assert lambda_index(math.inf, [math.inf, 0.5]) == 0 and lambda_index(0.5, [math.inf, 0.5]) == 1
    with pytest.raises(ValueError, match="not in the grid"):
        lambda_index(0.9755)
