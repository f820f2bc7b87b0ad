"""Testbed v2 wired in: the v2 LM training stream, a tiny v2 training run, ``load_lm("testbed-v2")`` and
``testbed-v2:`` problem specs, and the shipped v2 LM."""

import json
import math
from dataclasses import asdict, replace

import pytest
import torch

from helpers.testbed import tiny_v2_lm  # noqa: F401  (a module-scoped fixture, requested by name)
from hf_msv.answers import ELICITATION_PROMPT, extract_last_boxed
from hf_msv.collect.lm import load_lm, load_problems
from hf_msv.testbed import TASKS, load_testbed_lm, task_v2
from hf_msv.testbed.tokenizer import build_tokenizer
from hf_msv.testbed.train_lm import TraceStream

TOK = build_tokenizer()
CAP = task_v2.TaskKnobsV2().max_trace_tokens


def _stream(task, elicit_frac, pool=300):
    return TraceStream(TOK, seed=1, elicit_frac=elicit_frac, pool=pool, task=task)


def _use_v2_lm(monkeypatch, lm_dir):
    """Point the v2 task and the names it registers (``testbed``, ``testbed-v2``) at ``lm_dir`` for one test."""
    from hf_msv import registry
    from hf_msv.testbed import registration

    monkeypatch.setitem(TASKS, "v2", replace(TASKS["v2"], lm_dir=lm_dir))
    registry.named_lms()  # the entry points run now, so they cannot re-register the shipped LM later
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # restored after the test
    registration.register()


def _split(ids):
    """``(prompt length, text after the prompt)`` of a training example (the prompt ends at the first ``A:``)."""
    text = TOK.decode(ids[1:])
    cut = text.index("\nA:") + len("\nA:")
    return 1 + len(TOK(text[:cut], add_special_tokens=False).input_ids), text[cut:]


def test_v2_trace_examples_end_with_eos_only_when_the_trace_finished_within_the_cap():
    stream = _stream("v2", elicit_frac=0.0)
    kinds = set()
    for _ in range(80):
        ids, labels = stream.example()
        n_prompt, _ = _split(ids)
        trace = ids[n_prompt:]
        assert ids[0] == TOK.bos_token_id and labels[:n_prompt] == [-100] * n_prompt
        assert labels[n_prompt:] == trace  # the whole trace is learnt, EOS included when there is one
        if trace[-1] == TOK.eos_token_id:  # finished: one final answer line, within the cap
            text = TOK.decode(trace[:-1])
            assert len(trace) - 1 <= CAP and text.count(ELICITATION_PROMPT) == 1
            assert text[text.index(ELICITATION_PROMPT) :].endswith("}")
            kinds.add("finished")
        else:  # cut by the cap: exactly cap tokens, and no EOS for the LM to learn where the cap cut it
            assert len(trace) == CAP and TOK.eos_token_id not in trace
            kinds.add("capped")
        assert len(ids) <= TASKS["v2"].context()
    assert kinds == {"finished", "capped"}


def test_v2_elicitation_examples_mask_the_question_and_the_elicitation_prompt():
    stream = _stream("v2", elicit_frac=1.0)
    prompt_ids = TOK(ELICITATION_PROMPT, add_special_tokens=False).input_ids
    for _ in range(40):
        ids, labels = stream.example()
        n_prompt, _ = _split(ids)
        assert labels[:n_prompt] == [-100] * n_prompt
        # after the prefix: the (masked) elicitation prompt, then "{answer}" + EOS, learnt
        end = max(i for i in range(len(ids)) if ids[i : i + len(prompt_ids)] == prompt_ids) + len(prompt_ids)
        answer = TOK.decode(ids[end:-1])
        assert ids[-1] == TOK.eos_token_id and answer.startswith("{") and answer.endswith("}")
        assert labels[end:] == ids[end:]
        masked = [i for i in range(n_prompt, end) if labels[i] == -100]
        assert masked and TOK.decode([ids[i] for i in masked]).strip() == ELICITATION_PROMPT
        assert all(labels[i] == ids[i] for i in range(n_prompt, end) if i not in masked)  # the prefix is learnt


def test_the_context_is_the_cap_and_room_for_the_prompt_and_an_elicited_answer():
    assert TASKS["v2"].context() == 560
    assert TASKS["v2"].context({"max_trace_tokens": 400}) == 688  # the context follows the cap


def test_tiny_v2_training_run_saves_a_checkpoint_load_lm_loads(tiny_v2_lm, monkeypatch):  # noqa: F811
    from hf_msv.collect.config import CollectConfig
    from hf_msv.evaluation.prm import load_lm_tokenizer

    lm_dir, stats = tiny_v2_lm
    assert stats["task"] == "v2" and stats["context"] == 560 and stats["steps"] == 2
    assert all(map(math.isfinite, (h["loss"] for h in stats["history"])))
    assert json.loads((lm_dir / "training_log.json").read_text())["task"] == "v2"
    _use_v2_lm(monkeypatch, lm_dir)
    model, tok = load_lm("testbed-v2", device="cpu")
    assert not model.training and model.config.max_position_embeddings == 560
    assert tok.convert_tokens_to_ids("Wait") == TOK.convert_tokens_to_ids("Wait")
    prompt = task_v2.format_prompt(load_problems("testbed-v2:evaluation:1")[0])
    out = model.generate(
        **tok([prompt], return_tensors="pt"), max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id
    )
    assert out.shape[1] == len(tok(prompt).input_ids) + 4
    # the rest of the pipeline knows the name: the collection's prompt, the PRM's tokenizer
    config = CollectConfig(model="testbed-v2", output_dir="x", problems="testbed-v2:train:2")
    assert config.resolved().prompt_template == "testbed"
    assert load_lm_tokenizer({}, "testbed-v2").name_or_path == str(lm_dir)


def test_missing_v2_lm_says_how_to_train_it(tmp_path, monkeypatch):
    _use_v2_lm(monkeypatch, tmp_path / "lm-v2")
    with pytest.raises(FileNotFoundError, match=r"train_lm --task v2 --output-dir .*lm-v2"):
        load_lm("testbed-v2", device="cpu")
    with pytest.raises(FileNotFoundError, match="testbed v2"):
        load_testbed_lm(task="v2")
    with pytest.raises(ValueError, match="unknown testbed task"):
        load_testbed_lm(task="v3")


def test_problem_specs_pick_the_task():
    v2 = load_problems("testbed-v2:validation:5:3")
    assert v2 == task_v2.generate_problems("validation", 5, seed=3)
    assert {p.source for p in v2} == {task_v2.SOURCE}
    assert load_problems("testbed-v2:evaluation:3") == task_v2.generate_problems("evaluation", 3, seed=0)
    # "testbed" names the default testbed, v2
    assert load_problems("testbed:validation:5:3") == v2
    with pytest.raises(ValueError, match=r"<named LM>:<split>:<n>.*'testbed', 'testbed-v2'"):
        load_problems("testbed-v3:evaluation:3")
    with pytest.raises(ValueError, match=r"testbed-v2:<split>:<n>"):
        load_problems("testbed-v2:evaluation")
    with pytest.raises(ValueError, match="split"):
        load_problems("testbed-v2:test:3")


def test_task_generators_validate_every_knob_but_draw_with_the_generator_ones():
    v2 = TASKS["v2"]
    # solver knobs do not change the problems; generator knobs do; unknown knobs are refused
    assert v2.generate_problems("train", 5, notice_prob=0.1) == v2.generate_problems("train", 5)
    assert all(len(p.meta["ops"]) == 2 for p in v2.generate_problems("train", 5, min_steps=2, max_steps=2))
    with pytest.raises(ValueError, match="unknown testbed-v2 knobs"):
        v2.generate_problems("train", 5, carry_eror=0.1)


def test_collect_caps_a_testbed_v2_lm_at_its_task_cap_by_default(tmp_path):
    """`hf-msv collect --model testbed-v2` without --max-new-tokens samples up to v2's length cap (its LM was trained
    on traces cut there); other LMs keep 4096; an explicit value always wins."""
    from hf_msv.collect import CollectConfig

    def budget(model, **kw):
        config = CollectConfig(model=model, problems=f"{model}:train:2", output_dir=str(tmp_path), **kw)
        return config.resolved().max_new_tokens

    assert budget("testbed-v2") == budget("testbed") == CAP == TASKS["v2"].sampling_cap()
    assert budget("some/hub-model") == 4096
    assert budget("testbed-v2", max_new_tokens=100) == 100


def test_the_shipped_v2_lm_was_trained_on_the_task_defaults_and_solves_some_problems():
    """The LM in hf_msv/testbed/lm-v2 matches ``TaskKnobsV2``'s defaults (a changed default needs a retrained LM)
    and its context; sampled as collection samples it, it writes boxed answers and gets some of them right."""
    log = json.loads((TASKS["v2"].lm_dir / "training_log.json").read_text())
    defaults = json.loads(json.dumps(asdict(task_v2.TaskKnobsV2())))  # tuples as JSON lists
    assert log["task"] == "v2" and log["knobs"] == {} and log["task_knobs"] == defaults
    assert task_v2.knobs_v2(**log["task_knobs"]) == task_v2.TaskKnobsV2()  # the log's knobs are still accepted
    model, tok = load_testbed_lm(task="v2")
    assert model.config.max_position_embeddings == TASKS["v2"].context()
    problems = task_v2.generate_problems("evaluation", 8, seed=5)
    enc = tok([task_v2.format_prompt(p) for p in problems for _ in range(4)], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=CAP, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    boxes = [extract_last_boxed(t) for t in texts]
    golds = [p.gold for p in problems for _ in range(4)]
    assert sum(b is not None for b in boxes) >= 16  # most finish within the cap
    assert 2 <= sum(b == g for b, g in zip(boxes, golds)) < 32  # some right, not all
    assert sum("Wait" in t for t in texts) >= 24  # re-checks
