"""Answer scorers of the generation hook (`hf_msv.generation.scorers`): Probe+WV and MSV_1+WV inside ``generate``.

Their online scores equal the evaluation's offline weighted votes (`streaming_weighted_voting`, `weighted_voting`)
of the single-chain scores of the same answers, and their early stopping equals the evaluation's replay
(`hf_msv.evaluation.early_stop.replay_many`) of the recorded stream. Tiny LMs and scripted answers from
`test_generation`.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList

from helpers.generation import (
    EOS,
    HIDDEN,
    ID,
    TOK,
    ForceTokens,
    ScriptedAnswers,
    generate,
    offline_scores,
    prompts,
    tiny_model,
    tiny_verifier,
)
from hf_msv import ProbeConfig, ProbeVerifier
from hf_msv.baselines import WV_THRESHOLD, streaming_weighted_voting, weighted_voting
from hf_msv.data import AnswerGroup
from hf_msv.evaluation.config import EvaluateConfig
from hf_msv.evaluation.early_stop import replay_many
from hf_msv.generation import (
    MSVAnswer,
    MSVEarlyStop,
    MSVScorer,
    ProbeScorer,
    StopRuleScorer,
    WeightedVoteScorer,
    as_scorer,
    msv_generate,
    prepare_generation,
)
from hf_msv.lambda_rule import LambdaChoice
from hf_msv.stop_rules import StopEvents, StopHead, stop_events

pytestmark = pytest.mark.usefixtures("single_thread")

EVALUATION_R = next(f.default for f in dataclasses.fields(EvaluateConfig) if f.name == "wv_threshold")

N = 6
BUDGET = 16
# Several delimiters per sequence at staggered steps, and two early EOS: answers of a prompt become available at
# many different steps, so the causal vote sees growing sets of answers.
SCHEDULE = {(r, s): ID["Wait"] for r in range(2 * N) for s in range(r % 4 + 1, BUDGET, 4)} | {(2, 9): EOS, (8, 6): EOS}


def tiny_probe(mode: str = "streaming", hidden: int = HIDDEN, seed: int = 7) -> ProbeVerifier:
    torch.manual_seed(seed)
    probe = ProbeVerifier(ProbeConfig(hidden_size=hidden, intermediate_size=16, mode=mode)).eval()
    with torch.no_grad():  # spread the scores, so that answers and classes differ in weight
        probe.head.weight.mul_(20.0)
    return probe


class FewAnswers(ScriptedAnswers):
    """`ScriptedAnswers` whose digit is one of three, picked from the LM's logit of token 0 at that position: a
    deterministic function of the context that varies between answers, so that classes have several members."""

    def __call__(self, module, args, kwargs, output):
        logits = output.logits
        inputs = (kwargs["input_ids"] if "input_ids" in kwargs else args[0])[:, -logits.shape[1] :]
        digits = self.digits.to(logits.device)
        digit = digits[(logits[..., 0].float() * 50).floor().long() % 3]
        target = torch.where(inputs == ID["\\boxed"], ID["{"], -1)
        target = torch.where(inputs == ID["{"], digit, target)
        target = torch.where(torch.isin(inputs, digits), ID["}"], target)
        rows, positions = (target >= 0).nonzero(as_tuple=True)
        logits[rows, positions, target[rows, positions]] += 1000.0
        return output


@pytest.fixture(scope="module")
def model():
    lm = tiny_model("llama")
    FewAnswers(lm)
    return lm


def run(model, scorer, threshold, texts=("Hello there, solve 2+2", "Hi"), mode=None):
    """One hooked ``generate`` call (seeded, scripted); the `MSVResult`s with every answer's hidden states."""
    overrides = {"mode": mode} if mode else {}
    with prepare_generation(
        model, TOK, scorer, delimiters=["Wait"], checker="exact", capture_hidden_states=True, **overrides
    ) as msv:
        schedule = {k: v for k, v in SCHEDULE.items() if k[0] < N * len(texts)}
        generate(msv, prompts(texts), n=N, max_new_tokens=BUDGET, schedule=schedule, threshold=threshold, seed=5)
        return msv.pop_results()


def probe_scores(probe: ProbeVerifier, answers) -> np.ndarray:
    """The Probe's score of each answer alone, in one offline forward."""
    lengths = torch.tensor([a.length for a in answers])
    with torch.no_grad():
        out = probe(
            hidden_states=torch.cat([a.hidden_states for a in answers]),
            token_answer=torch.repeat_interleave(torch.arange(len(answers)), lengths),
        )
    return out.probabilities.numpy().astype(np.float64)


def evaluation_group(result, events=None) -> AnswerGroup:
    """The recorded answer stream of `result` as the evaluation reads it (with a method's class snapshots)."""
    a = result.answers
    return AnswerGroup(
        sequence=[x.sequence for x in a],
        end=[x.end for x in a],
        klass=[x.class_id for x in a],
        correct=np.zeros(len(a), bool),
        is_terminal=[x.terminal for x in a],
        seq_len=[len(s) for s in result.sequences],
        start=[x.tau for x in a],
        scores={name: np.zeros(len(a)) for name in events or {}},
        events=events or {},
    )


def offline_wv(result, base: np.ndarray, R: int) -> np.ndarray:
    """The evaluation's Probe+WV (`methods.draw_scores`, streaming setting) of `result`'s answers."""
    g = evaluation_group(result)
    return np.clip(streaming_weighted_voting(base, g.klass, g.end, R=R), 0.0, 1.0)


def online(result) -> np.ndarray:
    return np.array([np.nan if a.score is None else a.score for a in result.answers])


# ----------------------------------------------------------------------------------------------------------------
# Online scores equal the offline weighted votes
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("R", [0, 3, WV_THRESHOLD])
def test_streaming_probe_wv_equals_offline_streaming_weighted_voting(model, R):
    """λ = None: every answer is scored when it becomes available, each from the answers available by its end."""
    probe = tiny_probe()
    results = run(model, WeightedVoteScorer(probe, wv_threshold=R), None)
    assert len(results) == 2
    counts = []
    for result in results:
        scores = online(result)
        assert not np.isnan(scores).any() and len({a.end for a in result.answers}) > 3
        assert len({a.class_id for a in result.answers}) > 1
        np.testing.assert_allclose(
            scores, offline_wv(result, probe_scores(probe, result.answers), R), rtol=1e-6, atol=1e-7
        )
        end = np.array([a.end for a in result.answers])
        counts += (end[None, :] <= end[:, None]).sum(1).tolist()
    if R == 3:  # both branches of the rule ran: own score (≤ R available) and the vote (> R)
        assert min(counts) <= R < max(counts)


def test_msv1_wv_equals_offline_vote_of_msv1_scores(model):
    """MSV_1+WV: the MSV_1 reads each sequence alone (online cache, groups of one), its scores are voted."""
    msv1 = tiny_verifier(num_sequences=1)
    reference = copy.deepcopy(msv1)
    results = run(model, WeightedVoteScorer(msv1, wv_threshold=4), None)
    base, _ = offline_scores(reference, results, 1)
    base = base.detach().numpy().astype(np.float64)
    start = 0
    for result in results:
        count = len(result.answers)
        np.testing.assert_allclose(
            online(result), offline_wv(result, base[start : start + count], 4), rtol=1e-5, atol=1e-6
        )
        start += count


def test_terminal_probe_wv_equals_offline_weighted_voting(model):
    probe = tiny_probe(mode="terminal")
    results = run(model, probe, 0.0)  # a ProbeVerifier is scored as Probe+WV; terminal mode never stops early
    for result in results:
        assert all(a.terminal for a in result.answers) and len(result.answers) == N
        g = evaluation_group(result)
        expected = weighted_voting(probe_scores(probe, result.answers), g.klass, g.is_terminal)
        np.testing.assert_allclose(online(result), expected, rtol=1e-6, atol=1e-7)
        assert not result.stopped_early and result.chosen.score == max(online(result))


def fake_answers(rng, prompt: int, count: int) -> list[MSVAnswer]:
    """`count` answers of one prompt with random ends, classes, lengths and hidden states."""
    out = []
    for i in range(count):
        length = int(rng.integers(1, 4))
        out.append(
            MSVAnswer(
                text=None,
                raw_text="",
                token_ids=[0] * length,
                prompt=prompt,
                sequence=i % N,
                step=i // N,
                tau=0,
                length=length,
                end=int(rng.integers(1, 12)),
                trigger="delimiter",
                terminal=bool(rng.random() < 0.3),
                cot_tokens=0,
                elicitation_ids=[],
                class_id=int(rng.integers(0, 3)),
                hidden_states=torch.from_numpy(rng.normal(size=(length, HIDDEN)).astype(np.float32)),
            )
        )
    return out


@pytest.mark.parametrize("streaming", [True, False])
def test_calls_holding_many_ends_and_prompts_stay_causal(streaming):
    """A call may hold answers of several ends and prompts (a finished prompt's rest, another engine's batch):
    each answer still reads only the answers of its prompt available by its end (terminal: its prompt's terminal
    answers)."""
    rng = np.random.default_rng(0)
    probe, R = tiny_probe(), 4
    answers = {p: fake_answers(rng, p, 30) for p in range(2)}
    stream = WeightedVoteScorer(probe, wv_threshold=R).begin(N, streaming)
    cut = 5 if streaming else 99  # terminal mode: a prompt's answers arrive together
    online_scores = {}
    for part in (lambda a: a.end <= cut, lambda a: a.end > cut):
        ready = sorted(
            (a for p in answers for a in answers[p] if part(a)), key=lambda a: (a.prompt, a.end, a.sequence)
        )
        if ready:
            online_scores |= {id(a): x for a, x in zip(ready, stream.score(ready))}
    for group in answers.values():
        base = probe_scores(probe, group)
        klass, end = np.array([a.class_id for a in group]), np.array([a.end for a in group])
        expected = (
            streaming_weighted_voting(base, klass, end, R=R)
            if streaming
            else weighted_voting(base, klass, [a.terminal for a in group])
        )
        np.testing.assert_allclose([online_scores[id(a)] for a in group], expected, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------------------------
# Early stopping equals the evaluation's replay
# ----------------------------------------------------------------------------------------------------------------


def key(answer):
    return answer.sequence, answer.step


def test_probe_wv_early_stopping_equals_the_evaluation_replay(model):
    """The full stream (λ = None), scored offline as the evaluation scores Probe+WV and replayed for a λ grid, stops
    where ``generate`` with each λ stops: same t*, same chosen answer, same number of available answers."""
    probe = tiny_probe()
    R = 3
    full = run(model, WeightedVoteScorer(probe, wv_threshold=R), None)
    scores = [offline_wv(r, probe_scores(probe, r.answers), R) for r in full]
    distinct = np.unique(np.concatenate(scores))
    # λ between distinct scores (never on one: float noise could flip a tie), plus "first answer" and "never".
    lambdas = np.r_[0.0, ((distinct[1:] + distinct[:-1]) / 2)[:: max(1, len(distinct) // 6)], 1.01]
    replays = [replay_many(evaluation_group(r), s, lambdas) for r, s in zip(full, scores)]
    outcomes = set()
    for i, lam in enumerate(lambdas):
        for result, reference, replay in zip(
            run(model, WeightedVoteScorer(probe, wv_threshold=R), lam), full, replays
        ):
            chosen = reference.answers[replay.chosen[i]]
            assert key(result.chosen) == key(chosen) and result.chosen.score == pytest.approx(
                scores[result.prompt][replay.chosen[i]], rel=1e-6
            )
            assert result.stop_step == replay.steps[i]
            assert sum(a.end <= result.stop_step for a in result.answers) == replay.n_available[i]
            assert all((a.score is not None) == (a.end <= result.stop_step) for a in result.answers)
            if result.stopped_early:
                assert replay.stopped[i]
            outcomes.add((bool(replay.stopped[i]), result.stopped_early))
    assert (True, True) in outcomes and (False, False) in outcomes  # λ that stop early and λ that never stop


def test_probe_alone_and_the_scorer_interface(model):
    """`ProbeScorer` is the Probe without vote; scorers pass through `as_scorer`; a verifier becomes its scorer."""
    probe = tiny_probe()
    (result,) = run(model, ProbeScorer(probe), None, texts=("Hi",))
    np.testing.assert_allclose(online(result), probe_scores(probe, result.answers), rtol=1e-6, atol=1e-7)
    scorer = WeightedVoteScorer(probe)
    assert as_scorer(scorer) is scorer and scorer.wv_threshold == WV_THRESHOLD == EVALUATION_R
    assert isinstance(as_scorer(tiny_verifier()), MSVScorer)
    assert isinstance(as_scorer(probe), WeightedVoteScorer) and as_scorer(probe).base.probe is probe


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


def test_probe_config_supplies_the_elicitation_defaults(model):
    probe = tiny_probe()
    probe.config.elicitation = probe.config.elicitation.replace(delimiters=("\n\n",), max_answer_tokens=7)
    with prepare_generation(model, TOK, probe, checker="exact") as msv:
        e = msv.elicitation
        assert (e.delimiters, e.max_answer_tokens, e.every_k_tokens) == (("\n\n",), 7, None)
        assert isinstance(msv.scorer, WeightedVoteScorer) and msv.verifier is probe


def test_msv_generate_with_a_probe(model):
    probe = tiny_probe()
    results = msv_generate(
        model,
        TOK,
        ["Hello", "Hi there"],
        verifier=probe,
        threshold=0.0,
        num_sequences=2,
        max_new_tokens=6,
        checker="exact",
        delimiters=[],
        generate_kwargs={"logits_processor": LogitsProcessorList([ForceTokens(3)])},
    )
    assert [r.prompt for r in results] == [0, 1] and all(r.chosen.score is not None for r in results)
    assert "generate" not in vars(model)


def test_bad_scorers_are_clear_errors_before_decoding(model):
    with pytest.raises(TypeError, match="MSVVerifier, a ProbeVerifier"):
        prepare_generation(model, TOK, "probe.safetensors")
    with pytest.raises(ValueError, match=r"16.*32|32.*16"):
        prepare_generation(model, TOK, tiny_probe(hidden=16))
    with pytest.raises(ValueError, match=r"16.*32|32.*16"):
        prepare_generation(model, TOK, WeightedVoteScorer(tiny_probe(hidden=16)))
    with pytest.raises(ValueError, match="terminal"):
        prepare_generation(model, TOK, tiny_probe(mode="terminal"), mode="streaming")
    with pytest.raises(ValueError, match="4 sequences"):
        WeightedVoteScorer(tiny_verifier(num_sequences=4))
    with pytest.raises(ValueError, match="wv_threshold"):
        WeightedVoteScorer(tiny_probe(), wv_threshold=-1)
    with pytest.raises(TypeError, match="WeightedVoteScorer needs"):
        WeightedVoteScorer(WeightedVoteScorer(tiny_probe()))
    with pytest.raises(TypeError, match="ProbeScorer needs"):
        ProbeScorer(tiny_verifier())
    assert "generate" not in vars(model)  # nothing was attached


# ----------------------------------------------------------------------------------------------------------------
# Stopping statistics over the N chains (hf_msv.stop_rules) live equal their replay
# ----------------------------------------------------------------------------------------------------------------

HEAD = StopHead(coef=(1.0, 4.0, -1.0, -0.5, -1.0, 0.2), intercept=-1.5, num_chains=N)
# A two-part head: it fires on one statistic and reports another confidence (`fit_stop_rule`'s shape).
TWO_PART = StopHead(
    coef=(0.5, 6.0, 1.0, -0.5, -2.0, 0.1),
    intercept=-2.0,
    num_chains=N,
    confidence_coef=(1.0, 2.0, -1.0, -0.3, -0.5, 0.2),
    confidence_intercept=-0.5,
)


def offline_events(result, rule, probe) -> StopEvents:
    """The evaluation's class snapshots of `result`'s recorded stream (`methods.draw_scores`, streaming): the rule
    over the stream, the head over the Probe's offline scores."""
    a = result.answers
    columns = ([x.class_id for x in a], [x.sequence for x in a], [x.step for x in a], [x.end for x in a])
    return stop_events(rule, *columns, N, probe_scores(probe, a) if isinstance(rule, StopHead) else None)


@pytest.mark.parametrize(
    "rule",
    ["consensus", "adaptive-consistency", "probe-stability", HEAD, TWO_PART],
    ids=["consensus", "adaptive-consistency", "probe-stability", "stop-head", "two-part-head"],
)
def test_stop_rules_in_generate_equal_the_evaluation_replay(model, rule):
    """Each stopping statistic computed live (`StopRuleScorer`) equals the one computed from the recorded stream,
    every class snapshot included, and ``generate`` with each λ stops where the replay of those snapshots stops, on
    the same answer (picked by the head's confidence), reporting that confidence (the statistic itself for a rule or
    a one-part head)."""
    probe = tiny_probe()
    full = run(model, StopRuleScorer(ProbeScorer(probe), rule), None)
    offline = [offline_events(r, rule, probe) for r in full]
    for result, events in zip(full, offline):
        a = result.answers
        stat, confidence = events.at_answers([x.class_id for x in a], [x.end for x in a])
        np.testing.assert_allclose(online(result), stat, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose([x.reported_confidence for x in a], confidence, rtol=1e-6, atol=1e-9)
        live = sorted(((x.end, v) for x in a for v in x.class_values or ()), key=lambda row: row[0])
        np.testing.assert_array_equal([t for t, _ in live], events.time)
        np.testing.assert_allclose([v.statistic for _, v in live], events.statistic, rtol=1e-6, atol=1e-9)
        assert [key(v.answer) for _, v in live] == [key(a[i]) for i in events.answer]
    if rule is TWO_PART:
        assert not np.allclose(
            np.concatenate([e.statistic for e in offline]), np.concatenate([e.confidence for e in offline])
        )
    distinct = np.unique(np.concatenate([e.statistic for e in offline]))
    lambdas = np.r_[((distinct[1:] + distinct[:-1]) / 2)[:: max(1, len(distinct) // 5)], 1.01]
    groups = [evaluation_group(r, {"rule": e}) for r, e in zip(full, offline)]
    replays = [replay_many(g, "rule", lambdas) for g in groups]
    stopped = set()
    for i, lam in enumerate(lambdas):
        for result, reference, replay in zip(run(model, StopRuleScorer(ProbeScorer(probe), rule), lam), full, replays):
            assert key(result.chosen) == key(reference.answers[replay.chosen[i]])
            assert result.stop_step == replay.steps[i]
            assert replay.stopped[i] or not result.stopped_early  # λ reached at the last step is no early stop
            events = offline[result.prompt]
            at_stop = (events.time == replay.steps[i]) & (events.answer == replay.chosen[i])
            if replay.stopped[i]:  # the class's confidence at t*, not the one its answer had on arrival
                assert result.confidence == pytest.approx(events.confidence[at_stop][0], rel=1e-6)
            stopped.add(result.stopped_early)
    # Three agreeing answers in a row are rare in these short scripted chains: that rule only stops at the end here
    # (its early stops are tested on hand-built groups in test_stop_rules.py).
    assert stopped == ({False} if rule == "probe-stability" else {True, False})


def test_a_verifier_carrying_a_stop_head_stops_on_it(model):
    """An MSV whose config carries ``early_stopping`` is scored through its stop head, and
    `MSVEarlyStop.from_verifier` takes the λ chosen with it; without one it is a clear error."""
    verifier = tiny_verifier()
    with pytest.raises(ValueError, match="carries no early-stopping λ"):
        MSVEarlyStop.from_verifier(verifier)
    assert isinstance(as_scorer(verifier), MSVScorer)
    choice = LambdaChoice(
        lam=0.8,
        rule="target",
        reached=True,
        epsilon=None,
        delta=None,
        target=0.7,
        num_problems=40,
        problems_needed=None,
        accuracy=0.72,
        tokens=50.0,
        loss=0.02,
        full_accuracy=0.74,
        full_tokens=80.0,
    )
    verifier.config.early_stopping = {"stop_head": HEAD.to_dict(), "lambda": choice.to_dict()}
    scorer = as_scorer(verifier)
    assert isinstance(scorer, StopRuleScorer) and scorer.rule == HEAD
    criterion = MSVEarlyStop.from_verifier(verifier)
    assert criterion.threshold == 0.8 and criterion.choice == choice and "λ = 0.80" in choice.describe()
    reloaded = type(verifier.config).from_dict(verifier.config.to_dict())
    assert reloaded.early_stopping == verifier.config.early_stopping


def test_a_stop_head_fitted_at_another_n_warns(model, recwarn):
    """A head's λ belongs to the N it was fitted at: running at another N says so (and at its own N, nothing)."""
    run(model, StopRuleScorer(ProbeScorer(tiny_probe()), HEAD), None)
    assert not [w for w in recwarn if "fitted on groups" in str(w.message)]
    other = StopHead(coef=HEAD.coef, intercept=HEAD.intercept, num_chains=4 * N)
    with pytest.warns(UserWarning, match=f"fitted on groups of N = {4 * N}, this run samples N = {N}"):
        run(model, StopRuleScorer(ProbeScorer(tiny_probe()), other), None)


def test_unknown_stop_rules_are_refused_before_decoding():
    with pytest.raises(ValueError, match="unknown stop rule 'majority'"):
        StopRuleScorer(tiny_probe(), "majority")
    with pytest.raises(TypeError, match="StopHead or a rule name"):
        StopRuleScorer(tiny_probe(), 0.5)
