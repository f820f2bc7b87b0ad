"""Per-chain pruning live (``generate`` through the run core) equals its exact replay
(`hf_msv.training.pruned_replay.replay_pruning`) on the recorded full-decoding stream: the same chains are pruned at
the same steps, none of their answers after the cut is elicited, pruned rows leave the decoding batch (rows × steps
fall), and the stop then outputs the same answer. The scorer is a Probe read through a stop head: its per-answer
scores do not depend on which chains run, so the replay needs no joint re-scoring (the MSV's fixpoint is covered on
recorded groups in tests/test_pruning.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_scorers import EOS, HEAD, ID, N, key, model, probe_scores, tiny_probe  # noqa: F401
from transformers import LogitsProcessorList

from helpers.generation import TOK, ForceTokens, prompts, replay_group
from hf_msv.generation import MSVEarlyStop, prepare_generation
from hf_msv.generation.scorers import ProbeScorer, StopRuleScorer
from hf_msv.pruning import PruneRule
from hf_msv.schedules import NEVER
from hf_msv.stop_rules import ConfidenceMap
from hf_msv.training.pruned_replay import replay_pruning, sweep_group

# The regret rule's weight is on "the held class leads" alone: it prunes the chains holding the leading class.
LEADERS = PruneRule(regret=0.01, regret_coef=(0.0, 0.0, -6.0, 0.0, 0.0, 0.0, 0.0, 0.0), regret_intercept=0.0)
RULES = [PruneRule(steady=2), PruneRule(doubt=0.45, lead=0.5), LEADERS]
TEXTS = ("Hello there, solve 2+2", "Hi")
BUDGET = 40  # long enough for chains to answer several times while they decode
SCHEDULE = {(r, s): ID["Wait"] for r in range(2 * N) for s in range(r % 4 + 1, BUDGET, 4)} | {(2, 29): EOS}


def run(model, threshold, prune, stop=None, head=HEAD):  # noqa: F811
    """One seeded, scripted ``generate`` call with the Probe read through `head`, λ and the pruning rule (or the
    criterion `stop`)."""
    scorer = StopRuleScorer(ProbeScorer(tiny_probe()), head)
    with prepare_generation(model, TOK, scorer, delimiters=["Wait"], checker="exact", capture_hidden_states=True) as m:
        torch.manual_seed(5)
        m.model.generate(
            **prompts(TEXTS),
            custom_generate=m,
            do_sample=True,
            num_return_sequences=N,
            max_new_tokens=BUDGET,
            logits_processor=LogitsProcessorList([ForceTokens(prompts(TEXTS)["input_ids"].shape[1], SCHEDULE)]),
            stopping_criteria=[stop or MSVEarlyStop(threshold, prune)],
        )
        return m.pop_results()


@pytest.mark.parametrize("rule", RULES, ids=["steady", "ruled-out", "regret"])
def test_pruning_live_equals_its_replay(model, rule):  # noqa: F811
    probe = tiny_probe()
    full = run(model, None, None)
    groups = [replay_group(r) for r in full]
    fixed = [probe_scores(probe, r.answers) for r in full]
    for r, f in zip(full, fixed):  # what the run recorded as the verifier's own score, beside the stop statistic
        np.testing.assert_allclose([a.verifier_score for a in r.answers], f, rtol=1e-5)
    scorer = lambda gs, keeps: [fixed[next(i for i, g in enumerate(groups) if g is x)] for x in gs]
    streams = replay_pruning(rule, HEAD, groups, scorer, fixed)
    lam = float(np.quantile(np.concatenate(fixed), 0.9))
    pruned, stopped = run(model, None, rule), run(model, lam, rule)
    cuts = 0
    for prompt, (reference, group, stream) in enumerate(zip(full, groups, streams)):
        expected = {n: int(c) + 1 for n, c in enumerate(stream.cut) if c != NEVER and c < group.seq_len[n]}
        result = pruned[prompt]
        assert dict(result.pruned) == expected  # chain n cut at step c decoded c + 1 tokens
        assert sorted(map(key, result.answers)) == sorted(
            key(reference.answers[i]) for i in np.flatnonzero(stream.keep)
        )
        cuts += len(expected)
        # The stop on the pruned stream outputs what the replay's sweep outputs at λ.
        sweep = sweep_group(group, stream, HEAD, np.array([lam]))
        chosen = int(sweep.chosen[0])
        assert key(stopped[prompt].chosen) == key(reference.answers[chosen])
        assert stopped[prompt].stop_step == int(sweep.stop_step[0])
    assert cuts > 0  # the rule prunes in this script: not a vacuous comparison
    assert pruned[0].compute["rows_computed"] < full[0].compute["rows_computed"]  # pruned rows left the batch


def test_full_decoding_and_the_empty_rule_prune_nothing(model):  # noqa: F811
    assert all(f != "pruned" for r in run(model, None, PruneRule()) for f in r.finish_reasons)
    assert MSVEarlyStop.resolve(None, None).prune is None and MSVEarlyStop.resolve("certified", None).threshold is None
    with pytest.raises(ValueError, match="certified"):
        MSVEarlyStop.resolve("best", None)


def test_the_certified_confidence_map_is_what_a_stop_reports(model):  # noqa: F811
    """A criterion carrying a `ConfidenceMap` (fitted with a certified pruning rule) reports the mapped confidence
    of the same decision; the decision itself does not change (the map is monotone)."""
    rule, cmap = RULES[0], ConfidenceMap(slope=1.0, intercept=1.0)
    plain = run(model, 0.9, rule)
    mapped = run(model, None, None, stop=MSVEarlyStop(0.9, rule, cmap))
    assert [key(r.chosen) for r in plain] == [key(r.chosen) for r in mapped]
    for a, b in zip(plain, mapped):
        assert b.confidence == pytest.approx(float(cmap([a.confidence])[0])) and b.confidence > a.confidence


def test_a_map_weighing_the_stop_time_features_reports_what_the_replay_reports(model):  # noqa: F811
    """A `ConfidenceMap` that weighs `STOP_TIME_FEATURES` reads them live (the decision's snapshot over the answers
    scored by its stop) as the replay reads them on the pruned stream: the same mapped confidence per prompt."""
    rule = RULES[0]
    cmap = ConfidenceMap(slope=1.0, intercept=-1.0, weights=(0.3, 2.0, 1.5, -0.2, -2.0, 0.1, -1.0, 0.2))
    full = run(model, None, None)
    groups = [replay_group(r) for r in full]
    fixed = [probe_scores(tiny_probe(), r.answers) for r in full]
    scorer = lambda gs, keeps: [fixed[next(i for i, g in enumerate(groups) if g is x)] for x in gs]
    streams = replay_pruning(rule, HEAD, groups, scorer, fixed)
    lam = float(np.quantile(np.concatenate(fixed), 0.9))
    live = run(model, None, None, stop=MSVEarlyStop(lam, rule, cmap))
    confidence_alone = ConfidenceMap(slope=1.0, intercept=-1.0)
    for result, group, stream in zip(live, groups, streams):
        sweep = sweep_group(group, stream, HEAD, np.array([lam]), confidence_map=cmap)
        assert result.confidence == pytest.approx(float(sweep.confidence[0]), abs=1e-9)
        unmapped = float(sweep_group(group, stream, HEAD, np.array([lam])).confidence[0])
        assert abs(result.confidence - float(confidence_alone([unmapped])[0])) > 1e-3  # the features moved it


def test_a_floor_below_a_switch_holds_live_as_in_the_replay(model):  # noqa: F811
    """A stop head whose support floor holds only below a switch λ: a run at λ below the switch stops and outputs
    what the floored head's replay does, a run at λ above it what the plain head's does (`StopHead.at`, read by
    the run's scoring queue), and the floor changes the decision here."""
    probe, rule = tiny_probe(), RULES[0]
    full = run(model, None, None)
    groups = [replay_group(r) for r in full]
    fixed = [probe_scores(probe, r.answers) for r in full]
    scorer = lambda gs, keeps: [fixed[next(i for i, g in enumerate(groups) if g is x)] for x in gs]
    lam = float(np.quantile(np.concatenate(fixed), 0.9))
    floored = replace(HEAD, min_share=0.5)
    outcomes = []
    for switch in (lam + 0.01, lam - 0.01):  # the run's λ below the switch, then above it
        head = replace(floored, floor_below=switch)
        live = run(model, lam, rule, head=head)
        side = head.at(lam)
        assert side == (floored if switch > lam else HEAD)
        streams = replay_pruning(rule, side, groups, scorer, fixed)
        outcome = []
        for group, stream, result in zip(groups, streams, live):
            sweep = sweep_group(group, stream, side, np.array([lam]))
            assert result.stop_step == int(sweep.stop_step[0])
            assert key(result.chosen) == key(full[groups.index(group)].answers[int(sweep.chosen[0])])
            outcome.append((int(sweep.stop_step[0]), int(sweep.chosen[0])))
        outcomes.append(outcome)
    assert outcomes[0] != outcomes[1]  # the floor moved a stop or an output
