"""The run core (`hf_msv.generation.core.RunCore`) is the one per-answer path of both engines: the same scripted chains
and answers, driven through it in ``model.generate``'s layout (`GenerationRun`: one tracker whose rows are prompts ×
N) and in vLLM's (`EngineSession`: one tracker per prompt, a queue shared by the call), give the same answers,
classes, stop decisions and cut rows; and the checks it owns run on every engine."""

from __future__ import annotations

import pytest
import torch

from helpers.generation import ID, TOK
from hf_msv.elicitation import ElicitationSettings
from hf_msv.equivalence import get_checker
from hf_msv.generation import ElicitationPolicy, MSVEarlyStop
from hf_msv.generation.core import RunCore, RunSetup
from hf_msv.generation.forking import CHAIN_ENDS, Branch, ends_chain
from hf_msv.generation.queue import ScoringQueue
from hf_msv.generation.tracking import EOS, LIVE, STOPPED, RowTracker

N = 3
SETTINGS = ElicitationSettings(delimiters=("Wait",), every_k_tokens=None, max_answer_tokens=4)
# Per prompt, per chain: the step at which its "Wait" delimiter fires (None: never) and the digit it answers with.
# Prompt 0's chains agree on 7 at step 2: the rule stops there. Prompt 1's disagree; every chain ends by EOS at 8.
SCRIPT = {0: [(2, "7"), (2, "7"), (None, "1")], 1: [(1, "3"), (3, "4"), (None, "5")]}
EOS_STEP = 8


class ScriptedScores:
    """A scorer whose P(correct) is 0.95 for the digit 7 and 0.3 otherwise, whatever the hidden states."""

    config = None

    def begin(self, num_sequences, streaming):
        return self

    def score(self, ready):
        return [0.95 if a.text == "7" else 0.3 for a in ready]


def tokens(step: int | None, t: int) -> int:
    if step == t:
        return ID["Wait"]
    return ID["<eos>"] if t == EOS_STEP else ID["a"]


def answer_ids(digit: str) -> list[int]:
    return [ID["{"], ID[digit], ID["}"]]


def drive(layout: str):
    """Step the scripted chains through a `RunCore` in `layout`; every branch completes 4 steps after it fires."""
    policy = ElicitationPolicy(TOK, SETTINGS, eos_ids={ID["<eos>"]})
    core = RunCore(policy, ScoringQueue(ScriptedScores(), N, True, False), MSVEarlyStop(0.9), False)
    classes = RunSetup(SETTINGS, policy, get_checker("exact")).new_classes()
    if layout == "generate":
        shared = RowTracker(2 * N, N, classes)
        place = {p: (shared, p) for p in SCRIPT}  # prompt → (its tracker, its group there)
        row_of = {(p, n): p * N + n for p in SCRIPT for n in range(N)}
    else:
        place = {p: (RowTracker(N, N, classes), 0) for p in SCRIPT}
        row_of = {(p, n): n for p in SCRIPT for n in range(N)}
    inflight, cut = [], []
    for t in range(EOS_STEP + 6):
        for p, chains in SCRIPT.items():
            tracker = place[p][0]
            for n, (step, _) in enumerate(chains):
                row = row_of[(p, n)]
                if tracker.status[row] == LIVE:
                    branch = core.feed(tracker, row, tokens(step, t))
                    if branch is not None and core.fork(tracker, branch):
                        inflight.append((p, n, branch, t + 4))
        for p, n, branch, _ in [f for f in inflight if f[3] == t]:
            tracker = place[p][0]
            if not tracker.group_of(branch.row).decided:
                live = policy.elicitor.start(branch, tracker.history[branch.row])
                live.token_ids = answer_ids(SCRIPT[p][n][1])
                core.record(tracker, live, prompt=p, end=t, hidden=torch.zeros(4, 2))
            else:
                core.abandon(tracker, branch)
        inflight = [f for f in inflight if f[3] > t]
        for p, decision in core.decide(t, place).items():
            cut += [(p, row % N, t) for row in decision.rows]
    groups = {p: tracker.groups[g] for p, (tracker, g) in place.items()}
    answers = {
        p: [(a.sequence, a.tau, a.end, a.text, a.class_id, a.score, a.terminal) for a in g.answers]
        for p, g in groups.items()
    }
    decided = {p: (g.stop_step, g.stopped_early, g.chosen.text if g.chosen else None) for p, g in groups.items()}
    return answers, decided, sorted(cut)


def test_both_layouts_drive_the_core_to_the_same_answers_and_decisions():
    generate, vllm = drive("generate"), drive("vllm")
    assert generate == vllm
    answers, decided, cut = generate
    # The cases occur: prompt 0 stops at step 6 on its two 7s (its three chains are cut), prompt 1 runs to its
    # chains' EOS.
    assert decided[0] == (6, True, "7") and cut == [(0, n, 6) for n in range(N)]
    assert decided[1][1] is False and {a[3] for a in answers[1]} == {"3", "4", "5"}
    assert all(a[6] for a in answers[1] if a[1] == EOS_STEP)  # EOS answers are terminal


def test_only_the_chain_end_triggers_end_a_chain():
    assert CHAIN_ENDS == ("eos", "budget") and ends_chain("eos") and not ends_chain("delimiter")
    assert Branch(0, "budget", 3).is_terminal and not Branch(0, "every_k", 3).is_terminal
    assert Branch(0, "delimiter", 3, terminal=True).is_terminal
    tracker = RowTracker(N, N, None)
    core = RunCore(ElicitationPolicy(TOK, SETTINGS, eos_ids={ID["<eos>"]}), None, MSVEarlyStop(None), False)
    assert core.feed(tracker, 0, ID["<eos>"]).trigger == "eos" and tracker.status[0] == EOS
    assert core.end_chain(tracker, 1, eos=False).trigger == "budget" and tracker.status[1] not in (LIVE, STOPPED)


def test_every_engine_refuses_a_delimiter_the_tokenizer_cannot_express():
    with pytest.raises(ValueError, match="cannot express the delimiter"):
        RunSetup.build(TOK, None, 32, "tiny", elicitation=SETTINGS.replace(delimiters=("Ω",)), checker=None)
    config = type("Config", (), {"hidden_size": 16, "elicitation": SETTINGS, "mode": "streaming"})()
    with pytest.raises(ValueError, match=r"width 16.*hidden size 32"):
        RunSetup.build(TOK, config, 32, "tiny", elicitation=None, checker="exact")
