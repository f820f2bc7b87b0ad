"""Evaluation-harness outputs as trace files (`hf_msv.collect.harness`): lm-eval ``--log_samples`` files and lighteval
details files (built from their writers' schemas, tests/helpers/harness.py) become `Trace`s, then shards through
``hf-msv collect --traces``; files in neither format, and rows that are not generations, fail with exit code 2."""

from __future__ import annotations

import json

import pytest

from helpers.harness import (
    HARNESS_PROBLEMS,
    lighteval_detail,
    lm_eval_sample,
    write_lighteval_details,
    write_lm_eval_samples,
)
from hf_msv import cli
from hf_msv.collect import load_lm, read_traces
from hf_msv.collect.harness import detect_trace_format, lighteval_rows
from hf_msv.data import list_shards, read_shard
from hf_msv.errors import UserError

pytestmark = pytest.mark.usefixtures("single_thread")
TARGETS = ["27+11=38. 38-14=24 ... #### 92", "7"]  # a GSM8K-style target (answer after ####) and a plain one
LM_EVAL_NAME = "samples_testbed_arith_2025-01-31T12-00-00.123456.jsonl"


@pytest.fixture(scope="module")
def testbed():
    return load_lm("testbed", dtype="float32", device="cpu")


def lm_eval_file(directory, problems=HARNESS_PROBLEMS):
    """Two filters, as GSM8K's strict-match / flexible-extract: lm-eval writes every document once per filter."""
    samples = [
        lm_eval_sample(p, t, f) for f in ("strict-match", "flexible-extract") for p, t in zip(problems, TARGETS)
    ]
    return write_lm_eval_samples(directory / LM_EVAL_NAME, samples)


def lighteval_file(directory, details=None):
    details = details or [lighteval_detail(p) for p in HARNESS_PROBLEMS]
    return write_lighteval_details(directory / "details_testbed|arith|0_2025-01-31T12-00-00.123456.parquet", details)


def test_lm_eval_samples_become_traces(tmp_path):
    path = lm_eval_file(tmp_path)
    assert detect_trace_format(path, path.read_bytes()) == "lm_eval"
    file = read_traces(path)
    assert file.bad_lines == [] and file.num_samples == 2
    assert [t.id for t in file.traces] == ["0", "1"] and [t.line for t in file.traces] == [1, 2]
    assert [t.gold for t in file.traces] == ["92", "7"]
    for trace, problem in zip(file.traces, HARNESS_PROBLEMS):
        assert trace.prompt == problem.context and trace.question == problem.question  # the prompt the LM saw
        assert [c.text for c in trace.completions] == problem.completions
        # lm-eval keeps no finish reason: with max_gen_toks recorded, re-encoding decides (see below)
        assert {c.finish_reason for c in trace.completions} == {None} and trace.source == "testbed_arith"
        assert trace.sampling == {
            "until": ["Question:"],
            "do_sample": True,
            "temperature": 0.7,
            "max_new_tokens": 200,
            "engine": "lm_eval",
        }
    assert read_traces(path, format="lm_eval").traces == file.traces


def test_lm_eval_n1_files_and_bad_rows(tmp_path):
    # repeats: 1 (lm-eval's default): one completion per problem, N = 1.
    single = [lm_eval_sample(p, t) for p, t in zip(HARNESS_PROBLEMS, TARGETS)]
    for s in single:
        s["resps"] = [s["resps"][0][:1]]
    file = read_traces(write_lm_eval_samples(tmp_path / "n1.jsonl", single))
    assert file.num_samples == 1 and [len(t.completions) for t in file.traces] == [1, 1]
    # A loglikelihood (multiple-choice) document: (context, continuation) requests, (logprob, greedy) responses.
    choice = lm_eval_sample(HARNESS_PROBLEMS[1], "7")
    choice["arguments"] = {"gen_args_0": {"arg_0": "Q: 3+4?\nA:", "arg_1": " 7"}}
    choice["resps"] = [[["-0.5", "True"]]]
    path = write_lm_eval_samples(tmp_path / "mixed.jsonl", [lm_eval_sample(HARNESS_PROBLEMS[0], TARGETS[0]), choice])
    with pytest.raises(UserError, match="trace line 2: arguments are not a generate_until request"):
        read_traces(path)
    file = read_traces(path, skip_bad_lines=True)
    assert [t.id for t in file.traces] == ["0"] and [b[0] for b in file.bad_lines] == [2]


def test_lighteval_details_become_traces(tmp_path):
    path = lighteval_file(tmp_path)
    assert detect_trace_format(path, path.read_bytes()) == "lighteval"
    file = read_traces(path)
    assert file.num_samples == 2 and [t.id for t in file.traces] == ["0", "1"]
    assert [t.gold for t in file.traces] == [p.gold for p in HARNESS_PROBLEMS]
    for trace, problem in zip(file.traces, HARNESS_PROBLEMS):
        assert trace.prompt == problem.context and trace.prompt_token_ids is None
        assert trace.question == problem.question and trace.source == "testbed|arith|0"
        assert [c.text for c in trace.completions] == problem.completions
        assert trace.sampling == {"engine": "lighteval", "num_samples": 2, "max_new_tokens": 200}
    # A backend that logs token ids: the prompt's and the completions' ids as they are (EOS kept where a generation
    # ended with it, so endings are exact); token_ids=False reads the text instead.
    tokens = [[1, 55, 32], [[24, 29, 2], [66, 72]]]
    detail = lighteval_detail(HARNESS_PROBLEMS[0], with_tokens=tokens)
    detail["doc"]["gold_index"] = [0, 1]
    detail["doc"]["choices"] = ["ANSWER: 46*2=\\boxed{92}", "92.0"]  # a worked solution (lighteval's MATH-500)
    path = lighteval_file(tmp_path, [detail])
    (trace,) = read_traces(path).traces
    assert trace.prompt_token_ids == tokens[0] and [c.token_ids for c in trace.completions] == tokens[1]
    assert trace.gold == "92" and trace.gold_alternatives == ["92.0"]
    (row,) = lighteval_rows(path, token_ids=False)
    assert row.trace is not None and [c["text"] for c in row.trace["completions"]] == HARNESS_PROBLEMS[0].completions


def collect_cli(testbed, monkeypatch, path, out, *flags):
    import hf_msv.collect.cli as collect_cli_module

    monkeypatch.setattr(collect_cli_module, "load_lm", lambda *args, **kwargs: testbed)
    argv = ["collect", "--model", "testbed", "--traces", str(path), "--output-dir", str(out)]
    cli.main([*argv, "--checker", "exact", "--delimiters", "Wait", "--no-progress", *flags])


def harness_file(harness, directory, tok):
    if harness == "lm_eval":
        return lm_eval_file(directory)
    if harness == "lighteval":
        return lighteval_file(directory)
    # Logged token ids: the first completion ended with EOS (2), the second hit the budget.
    details = []
    for p in HARNESS_PROBLEMS:
        first, second = (tok(c, add_special_tokens=False)["input_ids"] for c in p.completions)
        details.append(lighteval_detail(p, with_tokens=[tok(p.context)["input_ids"], [first + [2], second]]))
    return lighteval_file(directory, details)


@pytest.mark.parametrize("harness", ["lm_eval", "lighteval", "lighteval-token-ids"])
def test_harness_files_become_shards_through_the_cli(harness, testbed, monkeypatch, tmp_path, capsys):
    _, tok = testbed
    collect_cli(testbed, monkeypatch, harness_file(harness, tmp_path, tok), tmp_path / "shards")
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["generated"] == 2 and summary["skipped_lines"] == 0
    ((problems, info),) = [read_shard(f) for f in list_shards(tmp_path / "shards")]
    assert info["collected_from"] == "traces" and info["num_samples"] == 2
    assert info["sampling"]["engine"] == harness.split("-")[0]
    golds = ["92", "7"] if harness == "lm_eval" else [p.gold for p in HARNESS_PROBLEMS]
    assert [(p.problem_id, p.gold) for p in problems] == [("0", golds[0]), ("1", golds[1])]
    # Text completions are read as ended (the harness decoded until EOS); logged ids keep how each one ended.
    ended = [True, harness != "lighteval-token-ids"]
    for got, problem in zip(problems, HARNESS_PROBLEMS):
        expected = [
            tok(c, add_special_tokens=False)["input_ids"] + [2] * e for c, e in zip(problem.completions, ended)
        ]
        assert [ids.tolist() for ids in got.cot_token_ids] == expected
        assert list(got.sequence_finish) == ["eos" if e else "budget" for e in ended]
        assert len(got.answer_text) >= 2
        assert list(got.answer_correct) == [text == got.gold for text in got.answer_text]


def test_a_text_completion_that_fills_its_budget_is_cut_not_ended(testbed, monkeypatch, tmp_path, capsys):
    _, tok = testbed
    samples = []
    for p, target in zip(HARNESS_PROBLEMS, TARGETS):
        sample = lm_eval_sample(p, target)
        lengths = [len(tok(c, add_special_tokens=False)["input_ids"]) for c in p.completions]
        sample["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"] = max(lengths)
        samples.append((sample, lengths))
    path = write_lm_eval_samples(tmp_path / LM_EVAL_NAME, [sample for sample, _ in samples])
    collect_cli(testbed, monkeypatch, path, tmp_path / "shards")
    ((problems, _),) = [read_shard(f) for f in list_shards(tmp_path / "shards")]
    for got, (_, lengths) in zip(problems, samples):
        assert list(got.sequence_finish) == ["budget" if n == max(lengths) else "eos" for n in lengths]
    assert any(n < max(lengths) for _, lengths in samples for n in lengths)  # both cases occur


def test_malformed_files_fail_with_exit_2(testbed, monkeypatch, tmp_path, capsys):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "Q", "response": "A"}) + "\n")
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\x00\xff not a trace")
    for path in (other, binary):
        with pytest.raises(SystemExit) as e:
            collect_cli(testbed, monkeypatch, path, tmp_path / "out")
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "is not a trace file" in err and "lm-eval samples file" in err and "lighteval details" in err
    no_response = tmp_path / "details.parquet"
    write_lighteval_details(no_response, [{"doc": {"query": "Q"}, "metric": {"acc": 1.0}}])
    choice = lm_eval_sample(HARNESS_PROBLEMS[0], "7")
    choice["resps"] = [[["-0.5", "True"]]]
    bad_rows = write_lm_eval_samples(tmp_path / "samples_mc.jsonl", [choice])
    for path, reason in [(no_response, "no ['model_response'] column"), (bad_rows, "trace line 1: resps must hold")]:
        with pytest.raises(SystemExit) as e:
            collect_cli(testbed, monkeypatch, path, tmp_path / "out")
        assert e.value.code == 2 and reason in capsys.readouterr().err
    with pytest.raises(UserError, match="unknown trace format 'csv'"):
        read_traces(other, format="csv")
    with pytest.raises(UserError, match="is not a lighteval details file"):  # a forced format is not detected
        read_traces(bad_rows, format="lighteval")
    assert not (tmp_path / "out").exists()  # refused before anything is written
