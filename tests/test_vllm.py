"""The vLLM controller (`hf_msv.vllm`) on the CPU build of vLLM: exact answer states, the stopping rule, aborts,
collection shards and input checks. Runs in the `.venv-vllm` environment (`make test-vllm`); skipped without vLLM.
"""

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm")

# An in-process engine core (the hook's buffers are read back in the same process either way) and OpenMP threads
# that do not pin and spin on a shared CPU.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

import hf_msv.testbed  # noqa: E402
from helpers.generation import answer_group, replay_group  # noqa: E402
from helpers.vllm_engines import assert_confidence_equals_transformers, make_engine  # noqa: E402
from hf_msv.evaluation.early_stop import replay  # noqa: E402
from hf_msv.generation import MSVScorer, StopRuleScorer  # noqa: E402
from hf_msv.modeling_msv import MSVVerifier  # noqa: E402
from hf_msv.pruning import PruneRule  # noqa: E402
from hf_msv.stop_rules import StopHead, stop_events  # noqa: E402
from hf_msv.testbed import TESTBED_VERIFIER_DIR, format_prompt  # noqa: E402
from hf_msv.testbed.tasks import get_task  # noqa: E402
from hf_msv.training.pruned_replay import replay_pruning  # noqa: E402
from hf_msv.vllm import (  # noqa: E402
    CaptureError,
    VLLMController,
    capture,
    collect_with_vllm,
    vllm_generate,
)

LM_DIR = Path(hf_msv.testbed.__file__).parent / "lm-v2"
LAMBDA = json.loads((TESTBED_VERIFIER_DIR / "early_stopping.json").read_text())["lambda"]


@pytest.fixture(scope="module")
def engine():
    return make_engine(LM_DIR)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(LM_DIR)


@pytest.fixture(scope="module")
def problems():
    return get_task("v2").generate_problems("evaluation", 4, seed=0)


@pytest.fixture(scope="module")
def collected(engine, tokenizer, problems):
    controller = VLLMController(engine, tokenizer, checker="exact", capture_hidden_states=True, confidence_top_k=5)
    return controller.generate([format_prompt(p) for p in problems[:2]], num_sequences=4, max_new_tokens=180)


def no_requests_left(engine) -> bool:
    return not engine.llm_engine.has_unfinished_requests() and engine.llm_engine.get_num_unfinished_requests() == 0


def assert_equal_to_cache_free_forward(model, prompt_ids, results, tol=1e-4):
    """Every answer: greedy tokens, log-probs and last-layer states equal one transformers forward without cache
    over prompt + kept chain of thought + elicitation tokens + answer."""
    checked = 0
    for result, ids in zip(results, prompt_ids):
        for a in result.answers:
            context = ids + result.sequences[a.sequence][: a.cot_tokens] + a.elicitation_ids + a.token_ids
            with torch.no_grad():
                out = model(torch.tensor([context]), output_hidden_states=True)
            L = a.length
            logits = out.logits[0, -L - 1 : -1].float()
            assert logits.argmax(-1).tolist() == a.token_ids
            logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(a.token_ids)[:, None]).squeeze(1)
            assert torch.allclose(logprobs, torch.tensor(a.token_logprobs), atol=tol)
            assert a.hidden_states.shape == (L, model.config.hidden_size)
            assert (out.hidden_states[-1][0, -L:] - a.hidden_states).abs().max().item() <= tol
            checked += 1
    return checked


def test_answers_and_states_equal_a_cache_free_transformers_forward(engine, tokenizer, problems, collected):
    model = AutoModelForCausalLM.from_pretrained(LM_DIR, dtype=torch.float32).eval()
    ids = [tokenizer(format_prompt(p))["input_ids"] for p in problems[:2]]
    assert assert_equal_to_cache_free_forward(model, ids, collected) > 10
    for result in collected:
        triggers = {a.trigger for a in result.answers}
        assert "delimiter" in triggers and triggers & {"eos", "budget"}
        for n, (seq, reason) in enumerate(zip(result.sequences, result.finish_reasons)):
            terminal = [a for a in result.answers if a.sequence == n and a.terminal]
            assert len(terminal) == 1  # one terminal answer per sequence
            assert (reason == "eos") == (seq[-1] == tokenizer.eos_token_id) and len(seq) <= 180
            assert [a.step for a in result.answers if a.sequence == n] == list(
                range(len([a for a in result.answers if a.sequence == n]))
            )
        assert all(a.end > a.tau + a.length for a in result.answers)  # available after its tokens were fed
        assert result.tokens_decoded == sum(map(len, result.sequences))
        assert result.chosen is None and all(a.score is None for a in result.answers)
    # DeepConf's token confidence of every chain token (computed in the engine): as transformers gives it.
    assert assert_confidence_equals_transformers(model, ids, collected, top_k=5) > 100
    assert no_requests_left(engine)
    # What the engine computed for elicitation: each answer's tokens fed once, and its prompt prefilled from the
    # prefix cache up to the last full 32-token block of the chain.
    answers = [a for r in collected for a in r.answers]
    compute = collected[0].compute
    assert compute["elicitation_answer_tokens_fed"] == sum(a.length for a in answers)
    segments = sum(len(a.elicitation_ids) for a in answers)
    assert segments <= compute["elicitation_prefill_tokens"] <= segments + 31 * len(answers)


# A two-part stop head (`hf_msv.stop_rules.fit_stop_rule`'s shape) at the N the test samples: it fires on one
# statistic and picks and reports by another.
TWO_PART = StopHead(
    coef=(1.0, 4.0, -1.0, -0.5, -1.0, 0.2),
    intercept=-1.5,
    num_chains=8,
    confidence_coef=(1.0, 1.0, -0.5, -0.3, -0.5, 0.3),
    confidence_intercept=-0.5,
)


# The same with a support floor that holds only in runs at λ below 0.7 (`StopHead.at`): the run at λ = 0.5 reads the
# floored head, the run at the shipped λ the plain one.
SWITCHING = replace(TWO_PART, min_share=0.3, floor_below=0.7)


def snapshot_rows(result, head) -> list[tuple]:
    """(time, class, statistic) of `head`'s class snapshots over a live result's recorded answers and MSV scores."""
    g = replay_group(result)
    scores = np.array([a.verifier_score for a in result.answers], np.float64)
    ev = stop_events(head, g.klass, g.sequence, g.step, g.end, 8, scores)
    return sorted(zip(ev.time.tolist(), ev.klass.tolist(), np.round(ev.statistic, 5).tolist()))


@pytest.mark.parametrize("head", [None, TWO_PART, SWITCHING], ids=["shipped-head", "two-part-head", "switching"])
def test_stop_decisions_equal_the_evaluation_replay_and_free_every_request(engine, tokenizer, problems, head):
    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).eval()
    scorer = verifier if head is None else StopRuleScorer(MSVScorer(verifier), head)
    controller = VLLMController(engine, tokenizer, scorer, checker="symbolic")
    stopped = floored = 0
    for lam in (LAMBDA, 0.5):
        results = controller.generate(
            [format_prompt(p) for p in problems], num_sequences=8, max_new_tokens=200, threshold=lam
        )
        assert no_requests_left(engine)  # stopped prompts' n = 8 children and their elicitations were aborted
        for result in results:
            group, scores = answer_group(result)  # the stop heads' class snapshots, as recorded live
            assert scores == "live"
            if head is not None and head.switches:  # the live snapshots are those of the head in effect at λ
                live = group.events["live"]
                rows = sorted(zip(live.time.tolist(), live.klass.tolist(), np.round(live.statistic, 5).tolist()))
                assert rows == snapshot_rows(result, head.at(lam))
                floored += lam < head.floor_below and rows != snapshot_rows(result, head.at(None))
            r = replay(group, scores, lam)
            chosen = next(i for i, a in enumerate(result.answers) if a is result.chosen)
            assert (r["chosen"], r["steps"]) == (chosen, result.stop_step)
            events = group.events["live"]
            at_stop = (events.time == result.stop_step) & (events.answer == chosen)
            if result.stopped_early:  # the chosen class's confidence at t*, refreshed there
                assert result.confidence == pytest.approx(events.confidence[at_stop][0])
            assert r["stopped"] == (events.statistic[events.time <= result.stop_step].max() >= lam)
            if result.stopped_early:
                stopped += 1
                assert "stopped" in result.finish_reasons and result.tokens_decoded < result.token_budget
                assert result.tokens_decoded == sum(map(len, result.sequences))
                assert all(a.end <= result.stop_step for a in result.answers if a.score is not None)
    assert stopped >= 1
    assert floored >= 1 or not (head is not None and head.switches)  # the floor changed a snapshot below the switch


def live_prunes(result, head, rule) -> dict[int, int]:
    """Replay `rule` (`hf_msv.training.pruned_replay.replay_pruning`) on a live result's recorded stream with its
    recorded scores: (chain → its cut step) for the chains the replay prunes. A chain the live run cut (pruned or
    stopped) has no known end: it is decoding for the replay until the replay cuts it."""
    group = replay_group(result)
    a = result.answers
    scores = [np.array([x.verifier_score for x in a], np.float64)]  # the MSV's own, not the stop head's statistic
    stream = replay_pruning(rule, head, [group], lambda groups, keeps: scores, scores)[0]
    return {n: int(c) for n, c in enumerate(stream.cut) if c < group.seq_len[n]}


# The regret clause weighted on "the held class leads" alone: it prunes the chains holding the leading class, so it
# reads the snapshot's confidences.
LEADERS = PruneRule(regret=0.01, regret_coef=(0.0, 0.0, -6.0, 0.0, 0.0, 0.0, 0.0, 0.0), regret_intercept=0.0)


@pytest.mark.parametrize("rule", [PruneRule(steady=2), LEADERS], ids=["steady", "regret"])
def test_pruned_chains_equal_the_replay_and_free_their_requests(engine, tokenizer, problems, rule):
    """A chain the rule prunes is aborted alone (its request and elicitations, nothing left in the engine), decodes
    no further answer, and the replay of the rule on the recorded stream prunes the same chains at the same steps;
    its token confidences, read from the engine after the abort, cover the tokens it decoded."""
    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).eval()
    head = StopHead.of(verifier.config)
    controller = VLLMController(engine, tokenizer, verifier, checker="symbolic", confidence_top_k=3)
    results = controller.generate(
        [format_prompt(p) for p in problems], num_sequences=8, max_new_tokens=200, threshold=1.01, prune=rule
    )
    assert no_requests_left(engine)
    pruned = 0
    for result in results:
        cuts = live_prunes(result, head, rule)
        assert dict(result.pruned) == {n: c + 1 for n, c in cuts.items()}  # cut at step c: c + 1 tokens
        for n, length in result.pruned:
            assert result.finish_reasons[n] == "pruned" and len(result.sequences[n]) == length
            assert all(x.end <= length - 1 for x in result.answers if x.sequence == n)
        pruned += len(cuts)
        assert result.tokens_decoded == sum(map(len, result.sequences))
    assert pruned > 0  # the rule prunes here: not a vacuous comparison
    model = AutoModelForCausalLM.from_pretrained(LM_DIR, dtype=torch.float32).eval()
    ids = [tokenizer(format_prompt(p))["input_ids"] for p in problems]
    assert assert_confidence_equals_transformers(model, ids, results, top_k=3) > 0
    # The engine's confidence setting is each run's: a controller without it on the same engine records none, and
    # the first one records again after it.
    plain = VLLMController(engine, tokenizer, checker="exact").generate(
        [format_prompt(problems[0])], num_sequences=2, max_new_tokens=40, threshold=None
    )
    again = controller.generate([format_prompt(problems[0])], num_sequences=2, max_new_tokens=40, threshold=None)
    assert plain[0].cot_confidence is None and assert_confidence_equals_transformers(model, ids[:1], again, 3) > 0


def test_shards_have_the_live_format_and_equal_the_reencoded_tokens(engine, tokenizer, problems, tmp_path):
    from safetensors import safe_open

    from hf_msv.collect import collect, collect_from_traces
    from hf_msv.collect.traces import traces_from_shards
    from hf_msv.data import read_shard

    settings = dict(
        num_samples=3,
        max_new_tokens=120,
        checker="exact",
        prompt_template="testbed",
        seed=0,
        problems_per_shard=2,
        progress=False,
    )
    result = collect_with_vllm(engine, problems[:2], tmp_path / "vllm", **settings)
    assert result.generated == 2 and len(result.shards) == 1 and no_requests_left(engine)
    assert read_shard(result.shards[0])[1]["seeded_batches"] is False  # CPU backend: the engine's generator
    model = AutoModelForCausalLM.from_pretrained(LM_DIR, dtype=torch.float32).eval()
    live = collect(model, tokenizer, problems[:2], tmp_path / "live", **settings)
    ours, info = read_shard(result.shards[0])
    theirs, live_info = read_shard(live.shards[0])
    assert [p.problem_id for p in ours] == [p.problem_id for p in theirs]
    assert set(live_info) - {"lm_weights_fingerprint"} <= set(info) | {"cot_confidence_source"}
    with safe_open(result.shards[0], "pt") as a, safe_open(live.shards[0], "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        keys = a.keys()  # a safetensors file, not a dict
        assert all(a.get_tensor(k).dtype == b.get_tensor(k).dtype for k in keys)
    for record in ours:
        assert record.hidden_states.shape == (int(record.answer_length.sum()), model.config.hidden_size)
        assert record.num_answers > 0 and len(record.cot_token_ids) == 3
    # The same tokens re-encoded by transformers (`collect_from_traces`) give the same answers and states.
    reencoded = collect_from_traces(
        model,
        tokenizer,
        traces_from_shards(tmp_path / "vllm"),
        tmp_path / "re",
        checker="exact",
        prompt_template="testbed",
        problems_per_shard=2,
        progress=False,
    )
    again_ids, _ = read_shard(reencoded.shards[0])
    for a, b in zip(ours, again_ids):
        for column in (
            "answer_tau",
            "answer_sequence",
            "answer_step",
            "answer_trigger",
            "answer_terminal",
            "answer_text",
            "answer_length",
            "answer_class",
            "answer_correct",
            "token_ids",
        ):
            assert list(getattr(a, column)) == list(getattr(b, column)), column
        assert (a.hidden_states.float() - b.hidden_states.float()).abs().max().item() <= 0.05  # bf16 storage
    # Resuming with the same settings does nothing; other settings are refused before sampling.
    again = collect_with_vllm(engine, problems[:2], tmp_path / "vllm", **settings)
    assert again.generated == 0
    with pytest.raises(ValueError, match="there, 4 now"):
        collect_with_vllm(engine, problems[:2], tmp_path / "vllm", **dict(settings, num_samples=4))
    # A batch with more chains than the engine's chain slots (96 of its 128 sequences) is named, and still runs.
    wide = dict(settings, num_samples=49, problems_per_batch=2, max_new_tokens=8)
    with pytest.warns(UserWarning, match="runs 96 chains at once, fewer than a batch's 2 x 49.*max_num_seqs=131"):
        assert collect_with_vllm(engine, problems[:1], tmp_path / "wide", **wide).generated == 1


def test_bad_input_is_refused_before_sampling(engine, tokenizer, monkeypatch):
    with pytest.raises(ValueError, match="cannot express the delimiter"):
        VLLMController(engine, tokenizer, delimiters=("Ωait",))
    wide = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR)
    wide.config.hidden_size = 256
    with pytest.raises(ValueError, match="width 256"):
        VLLMController(engine, tokenizer, wide)
    controller = VLLMController(engine, tokenizer, checker="exact")
    assert not controller.supports_seeds  # the CPU backend with chunked prefill
    with pytest.raises(ValueError, match="per-request seeds"):
        controller.generate(["Q: 1+1=?\nA:"], num_sequences=2, max_new_tokens=10, seed=1)
    with pytest.raises(ValueError, match="max_model_len"):
        controller.generate(["Q: 1+1=?\nA:"], num_sequences=2, max_new_tokens=1000)
    with pytest.raises(ValueError, match="needs a verifier"):
        vllm_generate(engine, ["Q: 1+1=?\nA:"], tokenizer=tokenizer, threshold=0.5, checker="exact")
    with pytest.raises(CaptureError, match="tested on vLLM"):
        capture.check_vllm_version("0.31.0")
    monkeypatch.setattr(vllm, "__version__", "0.40.0")
    with pytest.raises(CaptureError, match=r"found 0\.40\.0"):
        VLLMController(engine, tokenizer)

    class Runner:  # a runner whose model has no sampling head: nothing to hook
        model = torch.nn.Linear(2, 2)
        input_batch = None

    class Worker:
        model_runner = Runner()

    with pytest.raises(CaptureError, match="cannot hook Linear"):
        capture._install(Worker())
    assert no_requests_left(engine)


def test_collect_command_line_splits_engine_options():
    from hf_msv.vllm.cli import engine_arguments, split_arguments

    flags, options = split_arguments(
        [
            "--engine",
            "vllm",
            "--model",
            "testbed",
            "--vllm-arg",
            "block_size=64",
            "--vllm-arg=dtype=float32",
            "--num-samples",
            "4",
        ]
    )
    assert flags == ["--model", "testbed", "--num-samples", "4"]
    assert engine_arguments(options) == {
        "enable_prefix_caching": True,
        "block_size": 64,
        "async_scheduling": False,
        "dtype": "float32",
    }
    # A batch of 8 prompts x 64 chains gets the sequences to decode at once (512 chains + the elicitation reserve),
    # unless --vllm-arg names max_num_seqs; one within vLLM's least default keeps the engine's own.
    assert engine_arguments(options, 8 * 64)["max_num_seqs"] == 683
    assert engine_arguments([*options, "max_num_seqs=300"], 8 * 64)["max_num_seqs"] == 300
    assert "max_num_seqs" not in engine_arguments(options, 8 * 16)
    with pytest.raises(ValueError, match="--engine vllm"):
        split_arguments(["--engine", "transformers"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        engine_arguments(["block_size"])


def test_collect_command_line_runs_end_to_end(tmp_path):
    """``hf-msv collect --engine vllm`` flags, in a process of its own (its own engine)."""
    import subprocess
    import sys

    from hf_msv.data import list_shards

    argv = [
        "--engine",
        "vllm",
        "--model",
        "testbed",
        "--problems",
        "testbed:evaluation:2",
        "--output-dir",
        str(tmp_path),
        "--num-samples",
        "2",
        "--max-new-tokens",
        "60",
        "--checker",
        "exact",
        "--no-progress",
        "--vllm-arg",
        f"kv_cache_memory_bytes={64 << 20}",
        "--vllm-arg",
        "enforce_eager=true",
    ]
    code = f"from hf_msv.vllm.cli import main; main({argv!r})"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["generated"] == 2 and summary["answers"] > 0 and len(list_shards(tmp_path)) == 1


def test_a_random_llama_with_grouped_heads_every_k_tokens(tmp_path, tokenizer):
    """Another architecture variant (grouped KV heads, untied embeddings, random weights), answers every K tokens."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    llm = make_engine(tmp_path, seed=3)  # last in the file: a second in-process engine owns the process state
    controller = VLLMController(
        llm,
        tokenizer,
        checker="exact",
        capture_hidden_states=True,
        delimiters=(),
        every_k_tokens=16,
        max_answer_tokens=6,
    )
    results = controller.generate(["Q: 1+2=?\nA:"], num_sequences=3, max_new_tokens=40)
    ids = [tokenizer("Q: 1+2=?\nA:")["input_ids"]]
    assert assert_equal_to_cache_free_forward(model, ids, results) >= 3
    assert {a.trigger for a in results[0].answers} >= {"every_k"}
    assert no_requests_left(llm)
