"""Re-encoding traces (`hf_msv.collect.collect_from_traces`): answers equal live generation's on the testbed LM and
on tiny random LMs of two architectures, shards equal live collection's, resume, process striding, bad lines, the
command line and the vLLM example's writer."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

from helpers.tokenizer import word_level_tokenizer
from hf_msv.collect import (
    Completion,
    Trace,
    TraceError,
    TraceReencoder,
    collect,
    collect_from_traces,
    load_lm,
    read_traces,
    sequence_budget,
    traces_from_results,
    traces_from_shards,
    write_traces,
)
from hf_msv.collect.reencode import encode_trace, plan_branches
from hf_msv.data import list_shards, read_shard
from hf_msv.elicitation import ElicitationSettings
from hf_msv.generation import ElicitationPolicy, eos_token_ids, prepare_generation
from hf_msv.testbed import format_prompt, generate_problems

ROOT = Path(__file__).resolve().parents[1]
NO_LIMIT = lambda prompt_length: None  # a context without a limit
TOK = word_level_tokenizer(["\\boxed", "Wait"])
pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_lm(arch: str, seed: int = 0):
    """A random LM over `TOK` (samples nearly uniformly: budget and EOS endings, delimiters inside word tokens)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=len(TOK), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        config = transformers.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **common,
        )
    else:
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, **common)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def testbed():
    return load_lm("testbed", dtype="float32", device="cpu")


def live_results(model, tok, prompts, *, n, max_new_tokens, seed=0, **elicitation):
    """MSVResults of live generation (hidden states kept) and the token ids of the prompts given as text."""
    with prepare_generation(model, tok, None, checker="exact", capture_hidden_states=True, **elicitation) as s:
        torch.manual_seed(seed)
        results = s.generate(prompts, num_sequences=n, max_new_tokens=max_new_tokens, do_sample=True)
    return results, [tok(p)["input_ids"] if isinstance(p, str) else None for p in prompts]


def reencode(
    model,
    tok,
    traces,
    build_prompt,
    *,
    delimiters,
    every_k=None,
    keep_delimiter=False,
    max_answer_tokens=40,
    **budgets,
):
    settings = ElicitationSettings(
        delimiters=tuple(delimiters or ()),
        every_k_tokens=every_k,
        max_answer_tokens=max_answer_tokens,
        keep_delimiter=keep_delimiter,
    )
    eos_ids = eos_token_ids(model.generation_config)
    reencoder = TraceReencoder(model, tok, ElicitationPolicy(tok, settings, eos_ids), **budgets)
    encoded = [encode_trace(t, tok, build_prompt, eos_ids=eos_ids, budget=NO_LIMIT) for t in traces]
    answers, confidence = reencoder.answers(encoded)
    return answers, confidence, reencoder


def assert_same_answers(results, answers, atol):
    key = lambda a: (a.tau, a.sequence, a.step)
    fields = (
        "tau",
        "end",
        "sequence",
        "step",
        "trigger",
        "terminal",
        "cot_tokens",
        "elicitation_ids",
        "token_ids",
        "text",
    )
    for result, mine in zip(results, answers, strict=True):
        live, got = sorted(result.answers, key=key), sorted(mine, key=key)
        assert [[getattr(a, f) for f in fields] for a in got] == [[getattr(a, f) for f in fields] for a in live]
        for a, b in zip(live, got):
            torch.testing.assert_close(b.hidden_states.float(), a.hidden_states.float(), atol=atol, rtol=0)
            np.testing.assert_allclose(b.token_logprobs, a.token_logprobs, atol=atol)


# ----------------------------------------------------------------------------------------------------------------
# Exactness
# ----------------------------------------------------------------------------------------------------------------


def test_testbed_reencoding_equals_live_generation(testbed):
    model, tok = testbed
    problems = generate_problems("validation", 2, seed=5)
    results, prompts = live_results(
        model, tok, [format_prompt(p) for p in problems], n=4, max_new_tokens=250, delimiters=["Wait"]
    )
    traces = traces_from_results(problems, results, prompts)
    assert any(a.trigger == "delimiter" for r in results for a in r.answers)
    # Tight budgets: several prefill groups and chunks, many elicitation batches; the answers are the same.
    for budgets in (dict(), dict(max_batch_tokens=700, chunk_tokens=50)):
        answers, _, reencoder = reencode(model, tok, traces, format_prompt, delimiters=["Wait"], **budgets)
        assert_same_answers(results, answers, atol=1e-4)
    assert reencoder.forwards > 10


@pytest.mark.parametrize(
    "arch, delimiters, every_k, keep",
    [
        ("llama", ["e", "Wait"], None, False),  # "e" inside the "\\boxed" token: a prefix is re-fed
        ("gpt2", ["e", "Wait"], None, True),
        ("llama", [], 7, False),
    ],
)
def test_tiny_lm_reencoding_equals_live_generation(arch, delimiters, every_k, keep):
    model = tiny_lm(arch)
    prompts = ["Q1: add 1 and 1.", "Q22: twice 11"]
    problems = [
        SimpleNamespace(id=f"p{i}", question=q, gold="2", source="tiny", meta={}) for i, q in enumerate(prompts)
    ]
    results, prompt_ids = live_results(
        model,
        TOK,
        prompts,
        n=3,
        max_new_tokens=40,
        delimiters=delimiters,
        every_k_tokens=every_k,
        keep_delimiter=keep,
        max_answer_tokens=8,
    )
    finishes = {f for r in results for f in r.finish_reasons}
    traces = traces_from_results(problems, results, prompt_ids)
    answers, confidence, _ = reencode(
        model,
        TOK,
        traces,
        None,
        delimiters=delimiters,
        every_k=every_k,
        keep_delimiter=keep,
        max_answer_tokens=8,
        max_batch_tokens=120,
        chunk_tokens=16,
    )
    assert_same_answers(results, answers, atol=1e-5)
    assert "budget" in finishes
    if delimiters and not keep:
        assert any(a.elicitation_ids[0] != TOK.convert_tokens_to_ids("#") for r in results for a in r.answers)
    # Model confidences: one per generated token, EOS included.
    assert [len(c) for cs in confidence for c in cs] == [len(s) for r in results for s in r.sequences]


def test_plan_follows_live_rules_at_the_budget_end():
    """A delimiter completed by the last budget token is the terminal answer (no extra budget answer)."""
    policy = ElicitationPolicy(TOK, ElicitationSettings(delimiters=("Wait",), max_answer_tokens=5), eos_ids={2})
    elicitor = policy.elicitor
    ids = TOK("ab Wait cd Wait", add_special_tokens=False)["input_ids"]
    plan = plan_branches(ids, 0, policy)
    assert [(p.trigger, p.tau, p.terminal, p.kept) for p in plan] == [
        ("delimiter", 3, False, 3),
        ("delimiter", 8, True, 8),
    ]
    plan = plan_branches(ids[:5] + [2], 0, policy)
    assert [(p.trigger, p.tau, p.terminal, p.kept) for p in plan] == [("delimiter", 3, False, 3), ("eos", 5, True, 5)]
    # P, the segment fed live before the answer: the elicitation prompt, plus the newest token when it is kept.
    plan = plan_branches(ids[:5], 0, policy)
    assert [(p.trigger, p.tau, p.terminal, p.kept, p.fed - len(elicitor.prompt_ids)) for p in plan] == [
        ("delimiter", 3, False, 3, 0),
        ("budget", 4, True, 5, 1),
    ]


# ----------------------------------------------------------------------------------------------------------------
# Shards: live collection → traces → collect_from_traces
# ----------------------------------------------------------------------------------------------------------------

TIGHT = ElicitationSettings(max_answer_tokens=600)  # leaves no room in the testbed LM's context
LIVE = dict(
    num_samples=4,
    max_new_tokens=200,
    delimiters=["Wait"],
    checker="exact",
    prompt_template="testbed",
    problems_per_shard=2,
    seed=7,
    progress=False,
)
REENCODE = dict(delimiters=["Wait"], checker="exact", prompt_template="testbed", problems_per_shard=2, progress=False)


@pytest.fixture(scope="module")
def live_collection(testbed, tmp_path_factory):
    model, tok = testbed
    out = tmp_path_factory.mktemp("live")
    problems = generate_problems("validation", 3, seed=2)
    collect(model, tok, problems, out, **LIVE)
    traces = traces_from_shards(out)
    path = write_traces(out.parent / "live_traces.jsonl", traces)
    return out, path


def problems_by_id(directory):
    return {p.problem_id: p for f in list_shards(directory) for p in read_shard(f)[0]}


def test_collect_from_traces_writes_the_live_shards(testbed, live_collection, tmp_path):
    model, tok = testbed
    live_dir, path = live_collection
    result = collect_from_traces(model, tok, path, tmp_path / "re", **REENCODE)
    assert (result.generated, result.answers > 0) == (3, True)
    live, mine = problems_by_id(live_dir), problems_by_id(tmp_path / "re")
    assert sorted(live) == sorted(mine)
    for pid, a in live.items():
        b = mine[pid]
        for name in (
            "answer_sequence",
            "answer_step",
            "answer_tau",
            "answer_end",
            "answer_length",
            "answer_class",
            "answer_terminal",
            "answer_correct",
            "token_ids",
            "sequence_length",
        ):
            np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
        assert (b.answer_text, b.answer_trigger, b.sequence_finish) == (
            a.answer_text,
            a.answer_trigger,
            a.sequence_finish,
        )
        assert [c.tolist() for c in b.cot_token_ids] == [c.tolist() for c in a.cot_token_ids]
        assert b.question == a.question
        # bf16 storage: states computed within 1e-5 may round to neighbouring bf16 values.
        torch.testing.assert_close(b.hidden_states.float(), a.hidden_states.float(), atol=0.05, rtol=0.01)
        np.testing.assert_allclose(b.token_logprobs, a.token_logprobs, atol=1e-4)
        for x, y in zip(b.cot_confidence, a.cot_confidence, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-4)
    info = read_shard(list_shards(tmp_path / "re")[0])[1]
    assert info["collected_from"] == "traces" and info["cot_confidence_source"] == "model"
    assert info["skipped_lines"] == 0 and info["sampling"]["engine"] == "hf_msv"
    assert (info["temperature"], info["max_new_tokens"]) == (1.0, LIVE["max_new_tokens"])


def test_resume_after_a_crash_and_process_striding(testbed, live_collection, tmp_path, monkeypatch):
    import hf_msv.collect.job as job  # where a collection learns its process rank (start_collection)

    model, tok = testbed
    _, path = live_collection
    collect_from_traces(model, tok, path, tmp_path / "whole", **REENCODE)
    whole = {p.name: p.read_bytes() for p in list_shards(tmp_path / "whole")}

    # A crash after the first batch is spooled; the rerun finishes with byte-identical shards.
    from hf_msv.collect.store import ShardStore

    def crash(self, event, **_):
        if event == "spooled":
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(ShardStore, "on_commit", crash)
        with pytest.raises(KeyboardInterrupt):
            collect_from_traces(model, tok, path, tmp_path / "crash", **REENCODE)
    result = collect_from_traces(model, tok, path, tmp_path / "crash", **REENCODE)
    assert (result.already_done, result.generated) == (1, 2)
    assert {p.name: p.read_bytes() for p in list_shards(tmp_path / "crash")} == whole
    with pytest.raises(ValueError, match="other settings"):
        collect_from_traces(model, tok, path, tmp_path / "crash", **dict(REENCODE, max_answer_tokens=9))

    # Two processes (as under accelerate launch) take every other trace and together write the same problems.
    for rank in (0, 1):
        state = SimpleNamespace(
            process_index=rank,
            num_processes=2,
            is_main_process=rank == 0,
            is_local_main_process=rank == 0,
            wait_for_everyone=lambda: None,
        )
        monkeypatch.setattr(job, "process_state", lambda state=state: state)
        result = collect_from_traces(model, tok, path, tmp_path / "split", **REENCODE)
        assert result.problems == (2 if rank == 0 else 1)
    split, single = problems_by_id(tmp_path / "split"), problems_by_id(tmp_path / "whole")
    assert sorted(split) == sorted(single)
    assert all(split[k].answer_text == single[k].answer_text for k in single)


# ----------------------------------------------------------------------------------------------------------------
# Text traces and bad input
# ----------------------------------------------------------------------------------------------------------------


def test_text_traces_reencode_like_token_ids_and_bad_round_trips_are_reported(testbed, live_collection, tmp_path):
    model, tok = testbed
    _, path = live_collection
    file = read_traces(path)
    texts = []
    for t in file.traces:
        completions = []
        for c in t.completions:
            eos = c.token_ids[-1] == 2
            completions.append(
                Completion(
                    text=tok.decode(c.token_ids[:-1] if eos else c.token_ids),
                    finish_reason="stop" if eos else "length",
                )
            )
        texts.append(Trace(t.id, t.question, t.gold, completions))
    encoded = [encode_trace(t, tok, format_prompt, eos_ids={2}, budget=NO_LIMIT) for t in texts]
    reference = [encode_trace(t, tok, format_prompt, eos_ids={2}, budget=NO_LIMIT) for t in file.traces]
    # The testbed tokenizer's sampled tokens are canonical: text gives the same ids.
    assert [e.sequences for e in encoded] == [e.sequences for e in reference]
    assert [e.prompt_ids for e in encoded] == [e.prompt_ids for e in reference]

    bad = Trace("x", "q", "1", [Completion(text="3 + é = 4")], line=7)
    with pytest.raises(TraceError, match="trace line 7: completion 0 does not survive the tokenizer round trip"):
        encode_trace(bad, tok, format_prompt, eos_ids={2}, budget=NO_LIMIT)
    long = Trace("y", "q", "1", [Completion(token_ids=[5] * 600), Completion(token_ids=[5] * 30 + [2])], line=3)
    cut = encode_trace(long, tok, format_prompt, eos_ids={2}, budget=lambda n: 450 - n)
    prompt = len(cut.prompt_ids)
    assert (cut.cut, [len(s) for s in cut.sequences], cut.finish) == (1, [450 - prompt, 31], ["budget", "eos"])
    with pytest.raises(TraceError, match=r"trace line 3: .*leaves no room"):
        encode_trace(long, tok, format_prompt, eos_ids={2}, budget=lambda n: sequence_budget(model, tok, TIGHT, n))
    early = Trace("z", "q", "1", [Completion(token_ids=[5, 2, 5])], line=4)
    with pytest.raises(TraceError, match="EOS token at position 1"):
        encode_trace(early, tok, format_prompt, eos_ids={2}, budget=NO_LIMIT)


def test_bad_lines_raise_naming_the_line_or_are_skipped_and_counted(testbed, live_collection, tmp_path):
    model, tok = testbed
    _, path = live_collection
    good = path.read_bytes().splitlines()
    lines = [
        good[0],
        b'{"id": "a", "question": "q"}',  # 2: missing fields
        b'{"id": "b", "question": "q\xff", "gold": "1", "completions": ["x"]}',  # 3: not UTF-8
        json.dumps({"id": "c", "question": "q", "gold": "1", "completions": ["x"]}).encode(),  # 4: N = 1
        json.dumps(
            {"id": "d", "question": "q", "gold": "1", "completions": ["", "a", "b", "c"]}
        ).encode(),  # 5: empty completion
        json.dumps(
            {"id": "e", "question": "q", "gold": "1", "completions": [{"token_ids": [5] * 900}] * 4}
        ).encode(),  # 6: good, cut at the context
        b"not json",  # 7
        good[1],
        good[2],
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TraceError, match="trace line 2: missing field"):
        collect_from_traces(model, tok, bad, tmp_path / "out", **REENCODE)
    assert not (tmp_path / "out").exists()  # checked before anything is written
    for line, reason in [
        (3, "not UTF-8"),
        (4, "1 completions, but N = 4"),
        (5, "completion 0 is empty"),
        (7, "not JSON"),
    ]:
        one = tmp_path / f"one{line}.jsonl"
        one.write_bytes(b"\n".join([good[0]] + [b""] * (line - 2) + [lines[line - 1]]))  # blank lines count
        with pytest.raises(TraceError, match=f"trace line {line}: {reason}"):
            read_traces(one)
    result = collect_from_traces(model, tok, bad, tmp_path / "out", skip_bad_lines=True, **REENCODE)
    assert (result.generated, result.skipped_lines, result.cut_sequences) == (4, 5, 4)
    info = read_shard(list_shards(tmp_path / "out")[0])[1]
    assert info["skipped_lines"] == 5 and [b[0] for b in info["bad_lines"]] == [2, 3, 4, 5, 7]
    assert info["cut_sequences"] == 4


# ----------------------------------------------------------------------------------------------------------------
# Command line and the vLLM recipe
# ----------------------------------------------------------------------------------------------------------------


def test_cli_collect_traces(testbed, live_collection, tmp_path, monkeypatch, capsys):
    import hf_msv.collect.cli as cli

    _, path = live_collection
    monkeypatch.setattr(cli, "load_lm", lambda name, dtype: testbed)
    cli.main(
        [
            "--model",
            "testbed",
            "--traces",
            str(path),
            "--output-dir",
            str(tmp_path / "cli"),
            "--checker",
            "exact",
            "--delimiters",
            "Wait",
            "--confidence",
            "none",
            "--no-progress",
        ]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["generated"] == 3 and summary["shards_written"] == 1 and summary["skipped_lines"] == 0
    problems, info = read_shard(list_shards(tmp_path / "cli")[0])
    assert info["prompt_template"] == "testbed" and info["cot_confidence_source"] == "missing"
    assert all(not p.cot_confidence for p in problems)
    # a broken line skipped: counted in the summary, with a warning
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(path.read_bytes() + b"not json\n")
    cli.main(
        [
            "--model",
            "testbed",
            "--traces",
            str(broken),
            "--output-dir",
            str(tmp_path / "skip"),
            "--checker",
            "exact",
            "--skip-bad-lines",
            "--no-progress",
        ]
    )
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1])["skipped_lines"] == 1
    assert "warning: skipped 1 bad line(s)" in out.err
    with pytest.raises(SystemExit):
        cli.main(["--model", "testbed", "--output-dir", str(tmp_path / "cli")])
    assert "exactly one of --problems" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--model", "testbed", "--traces", str(path), "--output-dir", "x", "--num-samples", "4"])
    assert "['num_samples'] do not apply" in capsys.readouterr().err


def _vllm_example():
    spec = importlib.util.spec_from_file_location("sample_with_vllm", ROOT / "examples" / "sample_with_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # vllm is imported lazily, inside its sampling function
    return module


def test_vllm_example_writer_on_hf_msv_samples(testbed, tmp_path):
    """The example's writer turns vLLM-shaped outputs into the trace format; fed hf_msv's own samples (as vLLM's
    RequestOutput objects would carry them), the re-encoded answers equal the live ones."""
    model, tok = testbed
    problems = generate_problems("validation", 2, seed=9)
    # Up to the testbed's length cap, where its LM ends most traces with EOS.
    results, prompts = live_results(
        model, tok, [format_prompt(p) for p in problems], n=3, max_new_tokens=272, delimiters=["Wait"]
    )
    # Half of the EOS-ended completions without their EOS id, as an engine may return them.
    outputs = [
        SimpleNamespace(
            prompt_token_ids=prompt,
            outputs=[
                SimpleNamespace(
                    token_ids=seq[:-1] if f == "eos" and n % 2 else seq,
                    finish_reason="stop" if f == "eos" else "length",
                    stop_reason=None,
                    logprobs=None,
                )
                for n, (seq, f) in enumerate(zip(r.sequences, r.finish_reasons))
            ],
        )
        for prompt, r in zip(prompts, results)
    ]
    assert any(f == "eos" for r in results for f in r.finish_reasons[1::2])
    example = _vllm_example()
    path = example.write_vllm_traces(
        tmp_path / "vllm.jsonl", problems, outputs, {"temperature": 1.0}, eos_token_id=tok.eos_token_id
    )
    traces = read_traces(path).traces
    assert traces[0].sampling == {"temperature": 1.0, "engine": "vllm"}
    answers, _, _ = reencode(model, tok, traces, format_prompt, delimiters=["Wait"])
    assert_same_answers(results, answers, atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Memory: the budgets bound every batch; buffered cache layers
# ----------------------------------------------------------------------------------------------------------------


def test_budgets_bound_prefill_and_elicitation_batches(testbed, live_collection, monkeypatch):
    model, tok = testbed
    traces = read_traces(live_collection[1]).traces
    elicit, seen = TraceReencoder.elicit, {"elicit": [], "prefill": []}

    def spy_elicit(self, cache, mask, position, segments):
        seen["elicit"].append((len(segments), cache.get_seq_length()))
        return elicit(self, cache, mask, position, segments)

    def spy_forward(module, args, kwargs):
        if "logits_to_keep" not in kwargs:  # prefill chunks (the elicitor always keeps one position)
            seen["prefill"].append(tuple(kwargs["attention_mask"].shape))

    monkeypatch.setattr(TraceReencoder, "elicit", spy_elicit)
    hook = model.register_forward_pre_hook(spy_forward, with_kwargs=True)
    budget, chunk = 900, 120
    answers, _, _ = reencode(
        model, tok, traces, format_prompt, delimiters=["Wait"], max_batch_tokens=budget, chunk_tokens=chunk
    )
    hook.remove()
    encoded = [encode_trace(t, tok, format_prompt, eos_ids={2}, budget=NO_LIMIT) for t in traces]
    longest = max(len(e.prompt_ids) + len(s) for e in encoded for s in e.sequences)
    assert sum(n for n, _ in seen["elicit"]) == sum(map(len, answers)) and len(seen["elicit"]) > 1
    assert all(n * width <= max(budget, longest) for n, width in seen["elicit"])
    assert all(rows * width <= max(budget, longest) for rows, width in seen["prefill"])
    assert max(rows for rows, _ in seen["prefill"]) > 1  # short sequences share a prefill


def test_buffered_layer_writes_in_place_and_grows():
    from hf_msv.collect.reencode import BufferedLayer

    layer = BufferedLayer(capacity=4)
    chunks = [torch.randn(2, 1, n, 3) for n in (3, 1, 2)]
    for c in chunks:
        keys, values = layer.update(c, -c)
    torch.testing.assert_close(keys, torch.cat(chunks, dim=2))
    torch.testing.assert_close(values, -torch.cat(chunks, dim=2))
    ptr = layer.keys.data_ptr()
    layer.update(chunks[1], chunks[1])  # room left after growing: written in place
    assert layer.keys.data_ptr() == ptr and layer.get_seq_length() == 7
    layer.batch_select_indices(torch.tensor([1]))  # a gather: new tensors, moved into a new buffer on update
    keys, _ = layer.update(chunks[1][:1], chunks[1][:1])
    torch.testing.assert_close(keys[0, :, :7], torch.cat(chunks + [chunks[1]], dim=2)[1])


def test_confidences_from_trace_logprobs(testbed, live_collection, tmp_path):
    model, tok = testbed
    traces = read_traces(live_collection[1]).traces
    for t in traces:
        for c in t.completions[:2]:  # the others carry none: their confidences are missing
            c.logprobs = [[-3.0, -1.0, -0.5]] * len(c.token_ids)
    collect_from_traces(model, tok, traces, tmp_path / "conf", confidence="trace", confidence_top_k=2, **REENCODE)
    problems, info = read_shard(list_shards(tmp_path / "conf")[0])
    assert info["cot_confidence_source"] == "trace"
    for p in problems:
        assert [float(c[0]) if len(c) else None for c in p.cot_confidence] == [0.75, 0.75, None, None]
        assert [len(c) for c in p.cot_confidence[:2]] == p.sequence_length[:2].tolist()


def test_collect_config_carries_every_trace_option():
    from hf_msv.collect.config import build_parser

    (config,) = build_parser().parse_args_into_dataclasses(
        [
            "--model",
            "testbed",
            "--traces",
            "t.jsonl",
            "--output-dir",
            "out",
            "--skip-bad-lines",
            "--confidence",
            "trace",
            "--max-batch-tokens",
            "4096",
            "--keep-delimiter",
        ]
    )
    config.check_command_line()
    assert config.resolved().prompt_template == "testbed" and config.elicitation.keep_delimiter
    assert (config.skip_bad_lines, config.confidence, config.max_batch_tokens) == (True, "trace", 4096)


# ----------------------------------------------------------------------------------------------------------------
# The context rule: live collection and re-encoding accept the same traces
# ----------------------------------------------------------------------------------------------------------------

ROOMY = ElicitationSettings(max_answer_tokens=300)  # most of the testbed LM's context kept for the answer


def test_live_collection_samples_up_to_the_context_and_reencoding_cuts_there(testbed, tmp_path):
    """On the default LM, with an answer cap that leaves ~130 chain-of-thought positions: live collection lowers its
    budget to the context rule (sequences end there with a budget answer); its traces re-encode to the same shards,
    and the same traces made longer than the context are cut at the same token, giving the same records."""
    model, tok = testbed
    problems = generate_problems("validation", 3, seed=2)
    settings = dict(LIVE, max_new_tokens=272)
    settings.pop("delimiters")
    live = collect(model, tok, problems, tmp_path / "live", elicitation=ROOMY, **settings)
    budgets = {p.id: sequence_budget(model, tok, ROOMY, len(tok(format_prompt(p))["input_ids"])) for p in problems}
    assert max(budgets.values()) < 272 and live.cut_sequences > 0
    shards = problems_by_id(tmp_path / "live")
    for pid, p in shards.items():
        assert max(p.sequence_length) <= budgets[pid]
    traces = traces_from_shards(tmp_path / "live")
    extended = 0
    for t in traces:
        for c in t.completions:
            if c.finish_reason == "length" and len(c.token_ids) == budgets[t.id]:
                c.token_ids = c.token_ids + c.token_ids[:50]  # past the context: cut where live stopped
                extended += 1
    assert extended == live.cut_sequences
    again = collect_from_traces(
        model,
        tok,
        traces,
        tmp_path / "re",
        elicitation=ROOMY,
        **{k: v for k, v in REENCODE.items() if k != "delimiters"},
    )
    assert again.cut_sequences == extended and again.answers == live.answers
    mine = problems_by_id(tmp_path / "re")
    for pid, a in shards.items():
        b = mine[pid]
        for name in ("answer_tau", "answer_end", "answer_class", "answer_correct", "token_ids", "sequence_length"):
            np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
        assert (b.answer_text, b.answer_trigger, b.sequence_finish) == (
            a.answer_text,
            a.answer_trigger,
            a.sequence_finish,
        )
    with pytest.raises(ValueError, match="leaves no room"):  # refused before any work
        collect(model, tok, problems, tmp_path / "none", elicitation=TIGHT, **settings)
    assert not (tmp_path / "none").exists()


def test_chat_prompts_are_rebuilt_with_the_sampling_template():
    """A trace that gives chat messages (no prompt ids) is prompted with the template passed as `chat_template`,
    exactly as live generation rendered it; the tokenizer's own template (none here) is not needed."""
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
    chat_tok = word_level_tokenizer(["\\boxed", "Wait"])
    chat_tok.chat_template = template
    model = tiny_lm("llama", seed=1)
    messages = [[{"role": "user", "content": "add 2 and 3"}]]
    results, _ = live_results(model, chat_tok, messages, n=2, max_new_tokens=20, delimiters=["e"], max_answer_tokens=6)
    live_prompt = chat_tok(
        chat_tok.apply_chat_template(messages[0], tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )["input_ids"]
    problem = SimpleNamespace(id="c", question="add 2 and 3", gold="5", source="", meta={})
    trace = traces_from_results([problem], results, [live_prompt])[0]
    trace.prompt_token_ids, trace.messages = None, messages[0]
    encoded = encode_trace(trace, TOK, None, eos_ids={2}, budget=NO_LIMIT, chat_template=template)
    assert encoded.prompt_ids == live_prompt
    answers, _, _ = reencode(model, chat_tok, [trace], None, delimiters=["e"], max_answer_tokens=6)
    assert_same_answers(results, answers, atol=1e-5)
    with pytest.raises(TraceError, match="cannot build the prompt"):  # TOK has no template of its own
        encode_trace(trace, TOK, None, eos_ids={2}, budget=NO_LIMIT)
