"""Testbed v2 wired in (issue #17): the v2 LM training stream, a tiny v2 training run, ``load_lm("testbed-v2")``
and ``testbed-v2:`` problem specs; v1 stays what it was."""

import hashlib
import json
import math
import shutil
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from hf_msv.answers import ELICITATION_PROMPT, extract_last_boxed
from hf_msv.collect.lm import load_lm, load_problems
from hf_msv.testbed import TASKS, load_testbed_lm, task_v2
from hf_msv.testbed.tokenizer import build_tokenizer
from hf_msv.testbed.train_lm import TraceStream, soft_label_loss, train_testbed_lm

TOK = build_tokenizer()
CAP = task_v2.TaskKnobsV2().max_trace_tokens


def _stream(task, elicit_frac, pool=300):
    return TraceStream(TOK, seed=1, elicit_frac=elicit_frac, pool=pool, task=task)


def _split(ids):
    """``(prompt length, text after the prompt)`` of a training example (the prompt ends at the first ``A:``)."""
    text = TOK.decode(ids[1:])
    cut = text.index("\nA:") + len("\nA:")
    return 1 + len(TOK(text[:cut], add_special_tokens=False).input_ids), text[cut:]


def test_v2_trace_examples_end_with_eos_only_when_the_trace_finished_within_the_cap():
    stream = _stream("v2", elicit_frac=0.0)
    kinds = set()
    for _ in range(80):
        ids, labels, _ = stream.example()
        n_prompt, _ = _split(ids)
        trace = ids[n_prompt:]
        assert ids[0] == TOK.bos_token_id and labels[:n_prompt] == [-100] * n_prompt
        assert labels[n_prompt:] == trace  # the whole trace is learnt, EOS included when there is one
        if trace[-1] == TOK.eos_token_id:  # finished: one final answer line, within the cap
            text = TOK.decode(trace[:-1])
            assert len(trace) - 1 <= CAP and text.count(ELICITATION_PROMPT) == 1
            assert text[text.index(ELICITATION_PROMPT):].endswith("}")
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
        ids, labels, _ = stream.example()
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


def test_soft_elicitation_trains_answers_on_the_writers_distribution():
    """Same text as the plain stream; an elicited answer's tokens carry the next-token distribution among the
    writer's answers instead of a hard label, and that loss is the hard one when the distribution is one answer."""
    plain, soft = _stream("v2", 1.0), TraceStream(TOK, seed=1, elicit_frac=1.0, pool=300, soft_elicitation=True)
    spread = 0
    for _ in range(40):
        (ids, labels, none), (ids2, labels2, targets) = plain.example(), soft.example()
        assert ids == ids2 and none == [] and targets
        positions = [pos for pos, _ in targets]
        assert positions == list(range(positions[0], len(ids)))  # "{", the digits, "}" and EOS
        assert all(labels2[i] == -100 for i in positions) and labels2[: positions[0]] == labels[: positions[0]]
        for pos, dist in targets:
            assert sum(dist.values()) == pytest.approx(1.0) and dist.get(ids[pos], 0) > 0  # the drawn token can be
        assert targets[0][1] == {TOK.convert_tokens_to_ids("{"): 1.0}
        spread += any(len(d) > 1 for _, d in targets)
    assert spread >= 10  # most answers are uncertain somewhere
    ids, lab, _, (rows, cols, dist) = soft.batch(4)
    assert dist.shape == (len(rows), len(TOK)) and torch.allclose(dist.sum(-1), torch.ones(len(rows)))
    # one-hot distributions at the drawn tokens: the soft loss is the model's own hard loss
    logits = torch.randn(*ids.shape, len(TOK))
    hard = lab.clone()
    hard[rows, cols] = ids[rows, cols]
    one_hot = torch.nn.functional.one_hot(ids[rows, cols], len(TOK)).float()
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, len(TOK)), hard[:, 1:].reshape(-1))
    assert soft_label_loss(logits, lab, (rows, cols, one_hot)).item() == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(ValueError, match="soft_elicitation"):
        TraceStream(TOK, seed=0, elicit_frac=0.25, pool=50, task="v1", soft_elicitation=True)


def test_v1_stream_is_unchanged():
    """The v1 examples are byte-identical to those before v2 was wired in (hash taken at commit 02f9449)."""
    stream = TraceStream(TOK, seed=0, elicit_frac=0.25, pool=500, task="v1")
    ex = [stream.example() for _ in range(64)]
    ids, lab, _, _ = stream.batch(8)
    digest = hashlib.sha256(json.dumps([[e[:2] for e in ex], ids.tolist(), lab.tolist()]).encode()).hexdigest()[:16]
    assert digest == "01003e4574ae3263"
    assert TASKS["v1"].context() == 512 and TASKS["v2"].context() == 560
    assert TASKS["v2"].context({"max_trace_tokens": 400}) == 688  # the context follows the cap


@pytest.fixture(scope="module")
def tiny_v2_lm(tmp_path_factory):
    """A 2-step v2 LM (d_model 32, one layer) saved by `train_testbed_lm`, and its training stats."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("lm-v2")
    stats = train_testbed_lm(out, task="v2", steps=2, batch_size=4, d_model=32, n_layers=1, n_heads=2, warmup=1,
                             log_every=1, log=lambda *_: None)
    return out, stats


def test_tiny_v2_training_run_saves_a_checkpoint_load_lm_loads(tiny_v2_lm, monkeypatch):
    from hf_msv.collect.config import CollectConfig
    from hf_msv.evaluation.prm import load_lm_tokenizer

    lm_dir, stats = tiny_v2_lm
    assert stats["task"] == "v2" and stats["context"] == 560 and stats["steps"] == 2
    assert all(map(math.isfinite, (h["loss"] for h in stats["history"])))
    assert json.loads((lm_dir / "training_log.json").read_text())["task"] == "v2"
    monkeypatch.setitem(TASKS, "v2", replace(TASKS["v2"], lm_dir=lm_dir))
    model, tok = load_lm("testbed-v2", device="cpu")
    assert not model.training and model.config.max_position_embeddings == 560
    assert tok.convert_tokens_to_ids("Wait") == TOK.convert_tokens_to_ids("Wait")
    prompt = task_v2.format_prompt(load_problems("testbed-v2:evaluation:1")[0])
    out = model.generate(**tok([prompt], return_tensors="pt"), max_new_tokens=4, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    assert out.shape[1] == len(tok(prompt).input_ids) + 4
    # the rest of the pipeline knows the name: the collection's prompt, the PRM's tokenizer
    config = CollectConfig(model="testbed-v2", output_dir="x", problems="testbed-v2:train:2")
    assert config.collect_kwargs()["prompt_template"] == "testbed"
    assert load_lm_tokenizer({}, "testbed-v2").name_or_path == str(lm_dir)


def _benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_quality_benchmark_runs_a_v2_lm_on_v2_problems_up_to_the_cap(tiny_v2_lm, monkeypatch):
    bench = _benchmark("testbed_quality")
    monkeypatch.setitem(TASKS, "v2", replace(TASKS["v2"], lm_dir=tiny_v2_lm[0]))  # the default --model-dir
    res = bench.main(["--task", "v2", "--n-problems", "2", "--samples", "2", "--problems-per-call", "2",
                      "--elicit-samples", "1", "--threads", "1"])
    assert res["task"] == "v2" and res["max_new_tokens"] == CAP and res["model_dir"] == str(tiny_v2_lm[0])
    assert res["n_problems"] == 2 and res["mean_trace_tokens"] <= CAP
    # the LM's traces are diagnosed beside the solver's; the solver never misreads, copies wrong or re-boxes
    solver = res["solver_trace_errors"]
    assert set(res["lm_trace_errors"]) == set(solver)
    assert solver["operand_misread"] == solver["copy_slip"] == 0.0
    assert res["targets_measured"] >= 5 and 0 <= res["targets_passed"] <= res["targets_measured"]


def test_shard_statistics_read_the_trace_targets_from_collected_shards(tmp_path):
    import numpy as np

    from hf_msv.data import CollectedProblem, write_shard

    # three sequences: (tau, sequence, terminal, text); "1" is right
    rows = [(4, 1, False, "1"), (5, 0, False, "2"), (6, 2, True, "2"), (8, 1, True, "2"), (9, 0, False, "1"),
            (12, 0, True, "1")]
    n = len(rows)
    problem = CollectedProblem(
        problem_id="q", gold="1", source="synthetic", question="q", hidden_states=torch.zeros(n, 4),
        token_ids=np.zeros(n, dtype=np.int64), token_logprobs=np.zeros(n, dtype=np.float32),
        answer_text=[r[3] for r in rows], answer_raw_text=[r[3] for r in rows],
        answer_trigger=["eos" if r[2] else "delimiter" for r in rows], answer_sequence=[r[1] for r in rows],
        answer_step=[0] * n, answer_tau=[r[0] for r in rows], answer_length=[1] * n,
        answer_class=[int(r[3]) - 1 for r in rows], answer_terminal=[r[2] for r in rows],
        answer_correct=[r[3] == "1" for r in rows], sequence_length=[13, 9, 7],
        sequence_finish=["eos", "budget", "eos"], cot_confidence=[], cot_token_ids=[])
    write_shard(tmp_path / "shard-r000-00000.safetensors", [problem], info={"lm_name_or_path": "synthetic"})
    stats = _benchmark("testbed_quality").shard_statistics(tmp_path)
    assert stats == {
        "shard_sequences": 3, "shard_pass_at_1": round(1 / 3, 4), "shard_maj": 0.0, "shard_pass_minus_maj": 1.0,
        "elicited_per_sequence": 2.0, "first_intermediate_acc": 0.5, "terminal_acc_same_sequences": 0.5,
        "waits_wrong": 0.5, "waits_right": 2.0, "shard_capped_rate": round(1 / 3, 4)}


def test_missing_v2_lm_says_how_to_train_it(tmp_path, monkeypatch):
    monkeypatch.setitem(TASKS, "v2", replace(TASKS["v2"], lm_dir=tmp_path / "lm-v2"))
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
    # "testbed" names the default testbed, v2; v1 stays reachable as "testbed-v1"
    assert load_problems("testbed:validation:5:3") == v2
    assert {p.source for p in load_problems("testbed-v1:evaluation:3")} == {"testbed-arith"}
    with pytest.raises(ValueError, match=r"testbed\[-v1\]:<split>"):
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
    with pytest.raises(TypeError):
        TASKS["v1"].generate_problems("train", 5, carry_eror=0.1)


def test_collect_caps_a_testbed_v2_lm_at_its_task_cap_by_default(tmp_path):
    """`hf-msv collect --model testbed-v2` without --max-new-tokens samples up to v2's length cap (its LM was trained
    on traces cut there); other LMs keep 4096; an explicit value always wins."""
    from hf_msv.collect import CollectConfig

    def budget(model, **kw):
        config = CollectConfig(model=model, problems=f"{model}:train:2", output_dir=str(tmp_path), **kw)
        return config.collect_kwargs()["max_new_tokens"]

    assert budget("testbed-v2") == budget("testbed") == CAP == TASKS["v2"].sampling_cap()
    assert budget("testbed-v1") == 4096 and budget("some/hub-model") == 4096
    assert budget("testbed-v2", max_new_tokens=100) == 100


def test_the_shipped_v2_lm_was_trained_on_the_task_defaults_and_solves_some_problems():
    """The LM in hf_msv/testbed/lm-v2 matches ``TaskKnobsV2``'s defaults (a changed default needs a retrained LM)
    and its context; sampled as collection samples it, it writes boxed answers and gets some of them right."""
    log = json.loads((TASKS["v2"].lm_dir / "training_log.json").read_text())
    defaults = json.loads(json.dumps(asdict(task_v2.TaskKnobsV2())))  # tuples as JSON lists
    # knobs added after the LM was trained are off by default and draw nothing (test_default_writer_stream_is_unchanged)
    later = {"check_prob": 0.0, "say_reading_prob": 0.0}
    assert log["task"] == "v2" and log["knobs"] == {} and {**later, **log["task_knobs"]} == defaults
    model, tok = load_testbed_lm(task="v2")
    assert model.config.max_position_embeddings == TASKS["v2"].context()
    problems = task_v2.generate_problems("evaluation", 8, seed=5)
    enc = tok([task_v2.format_prompt(p) for p in problems for _ in range(4)], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=CAP, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    boxes = [extract_last_boxed(t) for t in texts]
    golds = [p.gold for p in problems for _ in range(4)]
    assert sum(b is not None for b in boxes) >= 16  # most finish within the cap
    assert 2 <= sum(b == g for b, g in zip(boxes, golds)) < 32  # some right, not all
    assert sum("Wait" in t for t in texts) >= 24  # re-checks


def test_score_only_rescores_a_probe_dir_as_the_probe_run_scored_it(tmp_path):
    """--probe's shards and Probe, scored again by --score-only (as for a work directory brought back from a GPU
    machine), give the figures the --probe run computed, plus the shard rows; without --probe-dir it refuses."""
    bench = _benchmark("testbed_quality")
    torch.set_num_threads(1)
    work = tmp_path / "probe"
    first = bench.probe_signal(TASKS["v2"], work, [4, 2, 6], samples=4, seed=0, max_new_tokens=96,
                               problems_per_batch=6)
    assert first["probe_problems"] == [4, 2, 6]
    again = bench.main(["--score-only", "--probe-dir", str(work), "--samples", "4"])
    for key in ("probe_auroc_n1", "token_probs_auroc_n1", "probe_best_of_4", "sc_best_of_4", "probe_pass_at_1"):
        assert again[key] == first[key] or (math.isnan(again[key]) and math.isnan(first[key])), key
    assert again["shard_sequences"] == 24 and again["targets_measured"] >= 3
    assert set(again["lm_trace_errors"]) == set(again["solver_trace_errors"]) >= {"wait_after_false"}
    assert math.isnan(again["solver_trace_errors"]["check_mismatch_after_false"])  # the default writer checks nothing
    checked = bench.main(["--score-only", "--probe-dir", str(work), "--samples", "4", "--knobs", '{"check_prob": 1.0}'])
    assert checked["solver_trace_errors"]["false_inverse_check"] >= 0  # the writer it compares with is --knobs'
    assert json.dumps(checked["lm_trace_errors"]) == json.dumps(again["lm_trace_errors"])  # the same LM chains
    for name in ("probe", "token_probs"):  # the intervals' own pooled AUROC is the evaluation's, inside its interval
        est, (low, high) = again[f"{name}_auroc_n1_pooled"], again[f"{name}_auroc_n1_interval"]
        assert 0 < est < 1 and est == pytest.approx(again[f"{name}_auroc_n1"], abs=1e-4) and low <= est <= high
    # the N = 1 AUROC's parts: the difficulty-only bound (never below chance) and each scorer's within a problem
    low, high = again["difficulty_auroc_n1_interval"]
    assert 0.5 <= again["difficulty_auroc_n1"] <= 1 and low <= again["difficulty_auroc_n1"] <= high
    for name in ("probe", "token_probs"):
        within = again[f"{name}_within_auroc"]
        assert math.isnan(within) or 0 <= within <= 1
    # the bootstrap resamples each problem's AUROC, computed once: its estimate is the metric's on the shards
    from hf_msv.data import ShardDataset
    from hf_msv.evaluation.scoring import token_prob_scores
    from hf_msv.metrics import within_problem_auroc
    problems = ShardDataset(work / "evaluation", mode="terminal").read_problems(True)
    rows = [np.flatnonzero(p.answer_terminal) for p in problems]
    expected = within_problem_auroc([token_prob_scores(p)[r] for p, r in zip(problems, rows)],
                                    [np.asarray(p.answer_correct, dtype=float)[r] for p, r in zip(problems, rows)])
    assert again["token_probs_within_auroc"] == pytest.approx(expected, abs=1e-4, nan_ok=True)
    # --compare / --against: an LM against itself (twice) differs by nothing on every resample, and each group's
    # mean is the LM's pooled AUROC, so the problems were lined up by id
    paired = bench.main(["--compare", str(work), "--against", f"{work},{work}"])
    assert paired["shared_problems"] == 6
    for name in ("probe", "token_probs"):
        assert paired[name]["compare"] == pytest.approx(again[f"{name}_auroc_n1_pooled"], abs=1e-4)
        assert paired[name]["against"] == paired[name]["compare"]
        assert paired[name]["difference"] == 0 and paired[name]["interval"] == [0, 0]
    # --screen on a copy of the evaluation shards (collection resumes: nothing sampled) reports Token-Probs and the
    # shard rows, no Probe; such a directory is compared on Token-Probs alone
    screen = tmp_path / "screen"
    shutil.copytree(work / "evaluation", screen / "evaluation")
    screened = bench.main(["--screen", "6", "--probe-dir", str(screen), "--samples", "4", "--max-new-tokens", "96",
                           "--probe-batch", "6"])
    assert screened["token_probs_auroc_n1"] == again["token_probs_auroc_n1_pooled"]
    assert screened["token_probs_within_auroc"] == again["token_probs_within_auroc"]
    assert screened["maj_at_4"] == again["shard_maj"] and screened["shard_sequences"] == 24
    assert "probe_auroc_n1" not in screened and "probe_within_auroc" not in screened
    assert not (screen / "probe").exists()
    mixed = bench.main(["--compare", str(screen), "--against", str(work)])
    assert "probe" not in mixed and mixed["token_probs"]["difference"] == 0
    with pytest.raises(SystemExit):
        bench.main(["--compare", str(work)])
    with pytest.raises(SystemExit):
        bench.main(["--score-only"])
    with pytest.raises(ValueError, match="pass the --seed they used"):  # the shards are seed 0's problems
        bench.main(["--score-only", "--probe-dir", str(work), "--samples", "2", "--seed", "5"])


def test_emulated_bf16_training_rounds_like_autocast_and_saves_a_plain_llama(tmp_path):
    from transformers import LlamaForCausalLM

    from hf_msv.testbed.train_lm import build_model, emulate_bf16_autocast

    torch.manual_seed(0)
    model = build_model(len(TOK), TOK, 32, 2, 2, 3, max_len=64)
    ids = torch.randint(4, len(TOK), (2, 24))
    with torch.no_grad():
        fp32 = model(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(input_ids=ids).logits.float()
        emulate_bf16_autocast(model)
        emulated = model(input_ids=ids).logits
        future_changed = ids.clone()
        future_changed[:, 12:] = 5
        causal = model(input_ids=future_changed).logits[:, :12]
    assert model.config._attn_implementation == "sdpa_bf16_rounded"
    assert torch.equal(causal, emulated[:, :12])  # the rounded attention is still causal
    # every logit is a bf16 value (the lm_head's output is rounded), and more of them are autocast's very value
    # than of fp32's logits rounded to bf16 (measured: 58 % vs 46 %; bf16 rounding inside the layers is what differs)
    assert torch.equal(emulated, emulated.to(torch.bfloat16).float())
    assert not torch.equal(fp32, fp32.to(torch.bfloat16).float())
    same = lambda logits: (logits == autocast).float().mean()  # noqa: E731
    assert same(emulated) > same(fp32.to(torch.bfloat16).float()) + 0.05
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    # the patch is on the instances: what is saved reloads as a plain Llama computing in fp32
    model.save_pretrained(tmp_path)
    assert "sdpa_bf16_rounded" not in (tmp_path / "config.json").read_text()
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        plain = reloaded(input_ids=ids).logits
    assert torch.allclose(plain, fp32, atol=1e-5)


def test_elicitation_fidelity_reads_the_lms_answer_probability_on_the_writers_traces(tiny_v2_lm, capsys):
    """``benchmarks/elicitation_fidelity.py``: batched, right-padded scoring gives each answer the log-probabilities
    an unpadded forward gives; the writer's self-evaluation ranks its answers better than the writer without it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bench = _benchmark("elicitation_fidelity")
    lm_dir, _ = tiny_v2_lm
    model, tok = AutoModelForCausalLM.from_pretrained(lm_dir).eval(), AutoTokenizer.from_pretrained(lm_dir)
    rows = bench.writer_terminal_answers(task_v2.generate_problems("evaluation", 6, seed=0), traces=3, seed=1)
    batched = bench.lm_answer_logprobs(model, tok, rows, batch=4)
    for r, lp in zip(rows[:5], batched):
        context = [tok.bos_token_id] + tok(task_v2.format_prompt(r["problem"]) + r["text"] + ELICITATION_PROMPT,
                                           add_special_tokens=False).input_ids
        answer = tok("{" + r["answer"] + "}", add_special_tokens=False).input_ids
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([context + answer])).logits[0].float(), -1)
        alone = logp[torch.arange(len(context) - 1, len(context) + len(answer) - 1), torch.tensor(answer)].numpy()
        assert np.allclose(lp, alone, atol=1e-4)
    bench.main(["--model-dir", str(lm_dir), "--problems", "24", "--traces", "4", "--threads", "1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["traces"] == 96 and 0 <= out["mean_lm"] < 1 and 0 < out["mean_writer"] < 1  # an untrained LM: ~0
    assert out["writer_auroc"] > out["writer_without_self_evaluation_auroc"] + 0.05
    assert out["knobs"] == {} and 0 < out["clause_taken_traces"] and 0 < out["clause_left_traces"]


def test_elicitation_fidelity_uses_the_writer_the_lm_was_trained_on_and_splits_by_clause_reading(tmp_path):
    """The benchmark's writer is the LM's (``training_log.json["knobs"]``); on problems with an irrelevant clause the
    writer's probability is lower where the chain took it (its self-evaluation hedges the misreading)."""
    bench = _benchmark("elicitation_fidelity")
    assert bench.trained_knobs(tmp_path) == {}
    (tmp_path / "training_log.json").write_text(json.dumps({"knobs": {"say_reading_prob": 1.0}}))
    knobs = bench.trained_knobs(tmp_path)
    assert knobs == {"say_reading_prob": 1.0}
    rows = bench.writer_terminal_answers(task_v2.generate_problems("evaluation", 60, seed=2), traces=6, seed=3,
                                         knobs=knobs)
    taken = [r for r in rows if r["clause"] == "taken"]
    assert taken and all(r["problem"].meta["distractor"] for r in taken)
    assert any(" {} {}:".format(r["problem"].meta["distractor"][1], w) in r["text"] for r in taken
               for w in ("broken", "old", "red"))  # the knob reached the writer
    writer = np.array([r["writer"] for r in rows])
    means = bench.clause_means(rows, writer, writer)
    assert means["clause_taken_traces"] == len(taken)
    assert means["writer_mean_clause_taken"] < means["writer_mean_clause_left"] - 0.03
    assert means["lm_mean_clause_taken"] == means["writer_mean_clause_taken"]
    # the reading's share of the unease: what is left is whole wrong steps; hedging it alone lies between the two
    for r in rows:
        assert r["writer"] - 1e-9 <= r["writer_reading"] <= r["writer_blind"] + 1e-9
    assert any(r["writer_reading"] < r["writer_blind"] for r in taken)
    assert all(r["writer_reading"] == r["writer_blind"] for r in rows if r["clause"] is None)
    right = np.array([r["right"] for r in rows])
    assert roc_auc_score(right, [r["writer_reading"] for r in rows]) > roc_auc_score(
        right, [r["writer_blind"] for r in rows]) + 0.05
