"""The first testbed (v1, ``testbed-v1``, ``research/testbed_v1``): task generator, tokenizer, its LM, training
smoke test, and the package's testbed tasks, LM names, training stream and reproduction once it is registered.

Not collected by ``make test`` (its testpaths are ``tests``); run with ``python -m pytest -q research/tests``.
"""

import hashlib
import json
import random

import pytest
import torch

from hf_msv.data.problems import Problem
from hf_msv.testbed import TASKS, load_testbed_lm
from hf_msv.testbed.tokenizer import build_tokenizer
from research.testbed_v1 import LM_DIR as TESTBED_LM_DIR
from research.testbed_v1 import TASK
from research.testbed_v1.task import (
    DELIMITER,
    ELICITATION_PROMPT,
    SPLITS,
    apply_op,
    format_prompt,
    generate_problems,
    make_elicitation_example,
    make_trace,
    split_of,
)


def _texts(n=200):
    rng = random.Random(0)
    for split in SPLITS:
        for p in generate_problems(split, n, seed=3):
            yield format_prompt(p)
            yield make_trace(p, rng)
            yield "".join(make_elicitation_example(p, rng))


def test_tokenizer_round_trips_everything_the_generator_emits():
    tok = build_tokenizer()
    chars = set()
    for text in _texts():
        chars |= set(text)
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
    assert chars <= set(tok.get_vocab()) | {" "}
    assert " " in tok.get_vocab()
    # the delimiter is one matchable token; encoding prepends BOS
    wait = tok.convert_tokens_to_ids(DELIMITER)
    ids = tok("A: 1+2=3. Wait, 1+2=3 ok.").input_ids
    assert ids[0] == tok.bos_token_id and ids.count(wait) == 1
    assert {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id} == {1, 2, 0}


def test_splits_are_disjoint_and_deterministic():
    canon = {}
    for split in SPLITS:
        ps = generate_problems(split, 1000, seed=0)
        assert len(ps) == 1000 and all(isinstance(p, Problem) for p in ps)
        c = {p.meta["canonical"] for p in ps}
        assert len(c) == 1000  # distinct within a split
        assert all(split_of(x) == split for x in c)
        canon[split] = c
        # other seeds and wordings stay in the split
        assert all(split_of(p.meta["canonical"]) == split for p in generate_problems(split, 200, seed=7))
    assert not canon["train"] & canon["validation"]
    assert not canon["train"] & canon["evaluation"]
    assert not canon["validation"] & canon["evaluation"]
    assert generate_problems("evaluation", 50, seed=1) == generate_problems("evaluation", 50, seed=1)
    assert generate_problems("evaluation", 50, seed=1) != generate_problems("evaluation", 50, seed=2)
    with pytest.raises(ValueError, match="split must be one of"):
        generate_problems("test", 1)


def test_gold_answers_and_knobs():
    for p in generate_problems("train", 300, seed=0, min_steps=3, max_steps=3, max_operand=9):
        v = p.meta["start"]
        assert len(p.meta["ops"]) == 3
        for op, k in p.meta["ops"]:
            assert (op != "+" and op != "-") or 1 <= k <= 9
            v = apply_op(v, op, k)
            assert 0 <= v <= 99
        assert p.gold == str(v)
    no_mul = generate_problems("train", 20, seed=0, ops="+-")
    assert all("*" not in p.meta["canonical"] for p in no_mul)
    with pytest.raises(TypeError):
        generate_problems("train", 1, no_such_knob=1)


def test_traces_have_waits_and_a_final_box():
    rng = random.Random(0)
    ps = generate_problems("train", 300, seed=0)
    traces = [make_trace(p, rng) for p in ps]
    assert all(t.count(ELICITATION_PROMPT + "{") == 1 and t.endswith("}") for t in traces)
    assert sum(DELIMITER in t for t in traces) == len(traces)
    n_right = sum(t.endswith("{" + p.gold + "}") for t, p in zip(traces, ps))
    assert 0.3 * len(ps) < n_right < 0.9 * len(ps)  # noisy solver: a mix of correct and wrong answers
    kinds = set()
    for p in ps:
        prefix, elicit, answer = make_elicitation_example(p, rng)
        assert elicit.endswith(ELICITATION_PROMPT) and answer.startswith("{") and answer.endswith("}")
        kinds.add("final" if ELICITATION_PROMPT in prefix else "wait" if prefix.endswith(DELIMITER) else "step")
        if ELICITATION_PROMPT in prefix:  # after the finished trace: the answer is the trace's own
            assert prefix.endswith(answer)
    assert kinds == {"final", "wait", "step"}


def test_segments_restate_their_answer_and_later_answers_are_better():
    from research.testbed_v1.task import make_trace_parts

    rng = random.Random(1)
    first = last = 0
    ps = generate_problems("evaluation", 300, seed=0)
    for p in ps:
        parts = make_trace_parts(p, rng)
        assert parts[0][0].startswith(" ") and DELIMITER not in parts[0][0]
        for segment, answer in parts:
            assert segment.lower().endswith(f"so {answer}.")  # the answer a Wait-elicitation should copy
        assert all(segment.startswith(f" {DELIMITER}, ") for segment, _ in parts[1:])
        first += parts[0][1] == p.gold
        last += parts[-1][1] == p.gold
    # re-checks fix more than they break: the streaming signal the verifier should pick up
    assert last > first + 0.15 * len(ps)
    # re-checks that never fix nor break leave every answer of a trace as the first pass left it
    knobs = dict(fix_prob=0.0, break_prob=0.0)
    assert all(len({a for _, a in make_trace_parts(p, rng, **knobs)}) == 1 for p in ps)


def test_targeted_rechecks_follow_a_cue_the_lm_can_see():
    """A targeted re-check goes to the first step with a carry / borrow not yet re-checked (the LM sees the
    operands, not which step is wrong)."""
    import re

    from research.testbed_v1.task import _has_carry, make_trace_parts

    rng = random.Random(2)
    for p in generate_problems("train", 200, seed=3):
        ops = [tuple(x) for x in p.meta["ops"]]
        parts = make_trace_parts(p, rng, target_prob=1.0, fix_prob=0.0, break_prob=0.0)  # steps never change
        values = [p.meta["start"]]
        for a, _ in zip(parts[0][0].split(". ")[: len(ops)], ops):
            values.append(int(a.split("=")[1]))
        carries = [j for j, (op, k) in enumerate(ops) if _has_carry(values[j], op, k)]
        rechecked = [re.match(rf" {DELIMITER}, (\d+)(\D)(\d+)=", s).groups() for s, _ in parts[1:]]
        for w, (a, op, k) in enumerate(rechecked):
            if w < len(carries):  # the carry steps, in order, before any random re-check
                j = carries[w]
                assert (int(a), op, int(k)) == (values[j], *ops[j])


@pytest.mark.skipif(not (TESTBED_LM_DIR / "config.json").exists(), reason="no shipped checkpoint")
def test_shipped_checkpoint_loads_with_auto_classes_and_generates():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TESTBED_LM_DIR)
    model = AutoModelForCausalLM.from_pretrained(TESTBED_LM_DIR)
    assert model.config.model_type == "llama"
    assert sum(f.stat().st_size for f in TESTBED_LM_DIR.glob("*.safetensors")) <= 20 * 2**20
    model2, tok2 = load_testbed_lm(task="v1")
    assert not model2.training and len(tok2) == len(tok)
    p = generate_problems("evaluation", 2, seed=0)
    enc = tok([format_prompt(x) for x in p], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = model.generate(
        **enc,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=320,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert any(ELICITATION_PROMPT + "{" in t for t in texts)
    # elicitation right after a Wait yields a closed box
    prefix = format_prompt(p[0]) + " 1+1=2. " + DELIMITER + ELICITATION_PROMPT
    enc = tok(prefix, return_tensors="pt")
    out = model.generate(
        **enc, do_sample=False, max_new_tokens=40, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    cont = tok.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert cont.startswith("{") and "}" in cont
    # the paper's terminal elicitation (prompt appended to the finished trace) gives back the trace's own answer
    finished = [(t, q) for t, q in zip(texts, p) if t.count("\\boxed{") == 1 and t.endswith("}")]
    assert finished
    for trace, question in finished:
        enc = tok(format_prompt(question) + trace + ELICITATION_PROMPT, return_tensors="pt")
        out = model.generate(
            **enc, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
        )
        cont = tok.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True)
        assert cont.split("}")[0] + "}" == trace[trace.rindex("{") :]


def test_training_smoke(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_msv.testbed.train_lm import LMTrainingConfig, train_testbed_lm

    config = LMTrainingConfig(
        output_dir=str(tmp_path),
        task="v1",
        steps=3,
        batch_size=4,
        d_model=32,
        n_layers=1,
        n_heads=2,
        warmup=1,
        log_every=1,
    )
    stats = train_testbed_lm(config, log=lambda *_: None)
    assert stats["steps"] == 3 and stats["parameters"] > 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    out = model.generate(
        **tok(["Q: 1\nA:"], return_tensors="pt"), max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id
    )
    assert out.shape[1] > 0
    assert (tmp_path / "model.safetensors").exists()


# ------------------------------------------------------------------------------ v1 as a registered testbed task
def test_v1_stream_is_unchanged():
    """The v1 training examples are byte-identical to those before v2 was wired in (hash taken at commit 02f9449):
    v1 draws its splits, prompt and final answer line from v2's module and still writes the same data."""
    from hf_msv.testbed.train_lm import TraceStream

    stream = TraceStream(build_tokenizer(), seed=0, elicit_frac=0.25, pool=500, task="v1")
    ex = [stream.example() for _ in range(64)]
    ids, lab, _ = stream.batch(8)
    digest = hashlib.sha256(json.dumps([[e[:2] for e in ex], ids.tolist(), lab.tolist()]).encode()).hexdigest()[:16]
    assert digest == "01003e4574ae3263"
    assert TASKS["v1"] is TASK and TASK.context() == 512  # uncapped: the context its LM was trained with
    assert TASK.sampling_cap() is None


def test_registration_names_the_task_its_lm_and_its_problem_specs(tmp_path):
    from hf_msv.collect import CollectConfig
    from hf_msv.collect.lm import load_problems
    from hf_msv.testbed import get_task

    assert get_task("v1") is get_task("testbed-v1") is TASK and get_task("testbed").name == "v2"
    assert {p.source for p in load_problems("testbed-v1:evaluation:3")} == {"testbed-arith"}
    assert load_problems("testbed-v1:validation:4:2") == generate_problems("validation", 4, seed=2)
    with pytest.raises(TypeError):
        TASK.generate_problems("train", 5, carry_eror=0.1)
    # an uncapped task's LM samples with collection's default budget
    config = CollectConfig(model="testbed-v1", problems="testbed-v1:train:2", output_dir=str(tmp_path))
    assert config.resolved().max_new_tokens == 4096
    assert TASK.train_command() == f"python -m research.testbed_v1 train-lm --task v1 --output-dir {TESTBED_LM_DIR}"


def test_reproduce_runs_v1_into_the_committed_report_names():
    """``--task v1`` (a choice once v1 is registered) writes testbed*.md into outputs/reproduce, at v1's budget of
    320 tokens, which the package records for reading v1's committed reports without the task."""
    from hf_msv.reproduction import parse_arguments
    from hf_msv.reproduction.config import REPORTED_TASK_CAPS

    v1 = parse_arguments(["--task", "v1"]).reproduce_config()
    assert (v1.task, v1.stem, v1.default_work_dir, v1.max_new_tokens) == ("v1", "testbed", "outputs/reproduce", 320)
    assert REPORTED_TASK_CAPS["v1"] == TASK.sampling_cap()


def test_commands_pass_task_v1_to_the_package_commands(monkeypatch):
    from research.testbed_v1 import __main__ as commands

    calls = []
    monkeypatch.setattr("hf_msv.reproduction.pipeline.main", lambda argv: calls.append(("reproduce", argv)))
    monkeypatch.setattr("hf_msv.testbed.train_lm.main", lambda argv: calls.append(("train-lm", argv)))
    commands.main(["reproduce", "--quick"])
    commands.main(["train-lm", "--output-dir", "x"])
    assert calls == [("reproduce", ["--task", "v1", "--quick"]), ("train-lm", ["--task", "v1", "--output-dir", "x"])]
    with pytest.raises(SystemExit):
        commands.main(["no-such-command"])
