"""Tests of hf_msv.collect on a tiny random Llama: records match the generation hook, crash/resume at every point of
the commit protocol (injected faults and a real SIGKILL) gives byte-identical shards, and a 2-process
``accelerate launch`` run merges into the single-process result."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.collect import SETTINGS, TOK, run_collect, tiny_lm, tiny_problems
from helpers.launch import free_port
from hf_msv.collect import ShardStore, batch_seed, collect
from hf_msv.data import ShardDataset, list_shards, read_shard
from hf_msv.equivalence import assign_classes, get_checker
from hf_msv.generation import prepare_generation

TESTS = Path(__file__).resolve().parent


pytestmark = pytest.mark.usefixtures("single_thread")


def shard_bytes(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in list_shards(directory)}


def problems_by_id(directory) -> dict:
    return {p.problem_id: p for f in list_shards(directory) for p in read_shard(f)[0]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    result = run_collect(out)
    return out, result


# ----------------------------------------------------------------------------------------------------------------
# Content
# ----------------------------------------------------------------------------------------------------------------


def test_records_match_the_generation_hook(reference):
    out, result = reference
    assert (result.problems, result.generated, result.already_done) == (7, 7, 0)
    assert [p.name for p in list_shards(out)] == [f"shard-r000-{i:05d}.safetensors" for i in range(3)]
    stored = problems_by_id(out)
    assert sorted(stored) == sorted(p.id for p in tiny_problems(7))
    model, checker = tiny_lm(), get_checker("exact")
    for problem in tiny_problems(2):
        record = stored[problem.id]
        # The same batch, sampled directly through the hook with the batch's seed.
        with prepare_generation(
            model, TOK, None, delimiters=["Wait", "e"], checker=checker, capture_hidden_states=True
        ) as msv:
            torch.manual_seed(batch_seed(3, [problem.id]))
            res = msv.generate(
                [problem.question],
                num_sequences=2,
                max_new_tokens=12,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
            )[0]
        answers = sorted(res.answers, key=lambda a: (a.tau, a.sequence, a.step))
        assert record.answer_text == [a.text for a in answers]
        assert record.answer_tau.tolist() == [a.tau for a in answers]
        assert record.answer_end.tolist() == [a.end for a in answers]  # the availability step, stored
        assert all(a.end > a.tau + a.length for a in answers)  # the elicitation prompt was fed step by step
        assert record.answer_step.tolist() == [a.step for a in answers]
        assert record.answer_terminal.tolist() == [a.terminal for a in answers]
        assert int(record.answer_terminal.sum()) == 2  # one terminal answer per sequence
        assert record.answer_class.tolist() == [a.class_id for a in answers]
        assert record.answer_class.tolist() == assign_classes(record.answer_text, checker)  # arrival order
        assert record.answer_correct.tolist() == [a.text == problem.gold for a in answers]
        assert record.sequence_length.tolist() == [len(s) for s in res.sequences]
        # the chain-of-thought tokens themselves and the question, for post-hoc scorers (a PRM) on shards
        assert [t.tolist() for t in record.cot_token_ids] == [list(s) for s in res.sequences]
        assert record.question == problem.question
        assert torch.equal(record.hidden_states, torch.cat([a.hidden_states for a in answers]).bfloat16())
        assert record.token_ids.tolist() == [t for a in answers for t in a.token_ids]

        # Token log-probs and CoT confidences against a cache-free recomputation of each context.
        prompt = TOK(problem.question)["input_ids"]
        starts = record.answer_token_start
        for i, a in enumerate(answers):
            context = prompt + res.sequences[a.sequence][: a.cot_tokens] + a.elicitation_ids
            with torch.no_grad():  # the scripted logits: the ones generation sampled and elicited from
                logits = model(torch.tensor([context + a.token_ids])).logits[0].float()
            lp = torch.log_softmax(logits[len(context) - 1 : -1], -1)
            expect = lp[torch.arange(a.length), torch.tensor(a.token_ids)].numpy()
            got = record.token_logprobs[starts[i] : starts[i] + a.length]
            np.testing.assert_allclose(got, expect, atol=1e-4)
        for n, seq in enumerate(res.sequences):
            with torch.no_grad():
                logits = model(torch.tensor([prompt + seq])).logits[0, len(prompt) - 1 : -1].float()
            conf = -torch.log_softmax(logits, -1).topk(20, -1).values.mean(-1).numpy()
            np.testing.assert_allclose(record.cot_confidence[n], conf, atol=1e-4)
    index = json.loads((out / "index.json").read_text())
    assert index["problems"] == 7 and sum(len(v) for v in index["shards"].values()) == 7
    assert not list((out / "spool").iterdir())


def test_rerun_skips_everything_and_changed_settings_are_refused(reference, tmp_path):
    out, _ = reference
    before = shard_bytes(out)
    again = run_collect(out)
    assert (again.already_done, again.generated) == (7, 0) and shard_bytes(out) == before
    with pytest.raises(ValueError, match="other settings"):
        run_collect(out, max_new_tokens=13)
    # a retrained LM saved under the same name is another LM: its collection does not resume the old one
    with pytest.raises(ValueError, match="lm_weights_fingerprint"):
        collect(tiny_lm(seed=1), TOK, tiny_problems(7), out, **SETTINGS)
    fresh = run_collect(tmp_path / "x", num_problems=2)
    redo = run_collect(tmp_path / "x", num_problems=2, max_new_tokens=13, overwrite=True)
    assert (fresh.generated, redo.generated) == (2, 2)


# ----------------------------------------------------------------------------------------------------------------
# Crash and resume
# ----------------------------------------------------------------------------------------------------------------


class Crash(Exception):
    pass


@pytest.mark.parametrize(
    "stage,after",
    [("spooled", 2), ("spooled", 4), ("shard_written", 1), ("manifest_written", 2), ("spool_removed", 1)],
)
def test_resume_after_injected_crash_is_identical(reference, tmp_path, monkeypatch, stage, after):
    """Kill the run right after the k-th occurrence of a commit step (mid-shard, between shard and manifest,
    between manifest and spool cleanup...), rerun the same command: same shards, byte for byte, nothing twice."""
    ref_dir, _ = reference
    seen = []

    def crash(name, **info):
        if name == stage:
            seen.append(info)
            if len(seen) == after:
                raise Crash(name)

    monkeypatch.setattr(ShardStore, "on_commit", lambda self, name, **info: crash(name, **info))
    with pytest.raises(Crash):
        run_collect(tmp_path)
    # Whatever is visible after the crash is complete and readable.
    ShardDataset(tmp_path) if list_shards(tmp_path) else None
    monkeypatch.setattr(ShardStore, "on_commit", lambda self, name, **info: None)
    resumed = run_collect(tmp_path)
    assert resumed.already_done + resumed.generated == 7 and resumed.already_done >= (
        after if stage == "spooled" else 3
    )
    assert shard_bytes(tmp_path) == shard_bytes(ref_dir)
    assert not list((tmp_path / "spool").iterdir())
    assert not [f for f in tmp_path.iterdir() if ".tmp-" in f.name]


def _script(tmp_path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from helpers.collect import run_collect
        {body}
    """)
    )
    return path


def test_sigkill_mid_run_then_restart(reference, tmp_path):
    """A real SIGKILL while the process writes: restart with the same command completes the same shards."""
    ref_dir, _ = reference
    out = tmp_path / "out"
    script = _script(tmp_path, f"run_collect({str(out)!r}, num_problems=7)")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    try:
        # Kill as soon as the first batch is durable, i.e. in the middle of the first shard.
        while time.time() < deadline and proc.poll() is None:
            if (out / "spool").is_dir() and any((out / "spool").glob("spool-*.safetensors")):
                break
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    for shard in list_shards(out):  # nothing partial is visible
        read_shard(shard)
    resumed = run_collect(out)
    assert resumed.already_done >= 1 and resumed.already_done + resumed.generated == 7
    assert shard_bytes(out) == shard_bytes(ref_dir)


# ----------------------------------------------------------------------------------------------------------------
# Multi-process
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.slow  # ~20-30 s: two interpreters start and import torch on a shared 2-core machine
def test_two_process_accelerate_collection_merges(reference, tmp_path):
    """Two CPU processes under ``accelerate launch``: ranks stride the problems, write their own shards, and the
    merged content equals the single-process run problem by problem (each batch is seeded by its problem ids).

    ``--cpu --num_processes 2`` needs MPI (accelerate's simple launcher); ``--multi_gpu`` is torchrun, which on a
    machine without accelerators gives gloo CPU processes (`hf_msv.utils.cpu_processes`)."""
    ref_dir, _ = reference
    out = tmp_path / "out"
    script = _script(tmp_path, f"run_collect({str(out)!r}, num_problems=7)")
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "2",
        "--multi_gpu",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        str(script),
    ]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = [p.name for p in list_shards(out)]
    assert any(n.startswith("shard-r000-") for n in names) and any(n.startswith("shard-r001-") for n in names)
    merged, single = problems_by_id(out), problems_by_id(ref_dir)
    assert sorted(merged) == sorted(single)
    for pid, p in single.items():
        q = merged[pid]
        assert torch.equal(p.hidden_states.view(torch.int16), q.hidden_states.view(torch.int16))
        assert p.answer_text == q.answer_text and p.answer_class.tolist() == q.answer_class.tolist()
    index = json.loads((out / "index.json").read_text())
    assert index["problems"] == 7
    assert len(ShardDataset(out, num_sequences=2)) == 7


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def test_collect_config_declares_every_collect_option_once():
    """`hf-msv collect` flags come from `CollectConfig` (one field with help per setting); the elicitation defaults
    are `ElicitationSettings`'; `collect` takes the config whole or its fields as keywords."""
    import dataclasses
    import typing

    from hf_msv.collect import CollectConfig
    from hf_msv.collect.config import build_parser
    from hf_msv.data import STORAGE_DTYPES
    from hf_msv.elicitation import ElicitationSettings

    fields = {f.name: f for f in dataclasses.fields(CollectConfig)}
    assert all(f.metadata.get("help") for f in fields.values())
    assert set(typing.get_type_hints(CollectConfig)["dtype"].__args__) == set(STORAGE_DTYPES)
    assert CollectConfig().elicitation == ElicitationSettings()
    assert CollectConfig().resolved().max_new_tokens == 4096  # an LM that is not registered: the paper's budget

    required = ["--model", "testbed", "--problems", "testbed:train:2", "--output-dir", "out"]
    (config,) = build_parser().parse_args_into_dataclasses(required)
    config.check_command_line()
    resolved = config.resolved()
    assert (resolved.prompt_template, config.progress) == ("testbed", True)
    assert resolved.max_new_tokens < 4096  # the named LM's own budget
    (config,) = build_parser().parse_args_into_dataclasses(
        required
        + [
            "--checker-kwargs",
            '{"timeout": 5}',
            "--delimiters",
            "--no-progress",
            "--num-samples",
            "4",
            "--dtype",
            "float16",
            "--mode",
            "terminal",
            "--overwrite",
            "--every-k-tokens",
            "8",
            "--max-answer-tokens",
            "9",
            "--elicitation-prompt",
            "Answer: \\boxed",
        ]
    )
    assert config.checker_kwargs == {"timeout": 5} and config.delimiters == [] and config.progress is False
    assert (config.num_samples, config.dtype, config.mode, config.overwrite) == (4, "float16", "terminal", True)
    assert config.elicitation == ElicitationSettings(
        mode="terminal", delimiters=(), every_k_tokens=8, max_answer_tokens=9, prompt="Answer: \\boxed"
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args_into_dataclasses(required + ["--dtype", "float32"])
    with pytest.raises(ValueError, match="exactly one of --problems"):
        CollectConfig(model="m", output_dir="o").check_command_line()
    with pytest.raises(ValueError, match="--model"):
        CollectConfig(problems="p.jsonl", output_dir="o").check_command_line()
    with pytest.raises(ValueError, match="do not apply"):
        CollectConfig(model="m", output_dir="o", traces="t.jsonl", num_samples=4).check_command_line()
    with pytest.raises(ValueError, match="every_k_tokens"):
        CollectConfig(every_k_tokens=0)
    with pytest.raises(TypeError, match="unknown collection setting"):
        collect(None, TOK, [], "x", num_sample=3)
    # an ElicitationSettings replaces the flat fields; keyword fields override the config
    settings = ElicitationSettings(delimiters=("e",), max_answer_tokens=7)
    merged = CollectConfig(num_samples=3).replace(elicitation=settings)
    assert merged.elicitation == settings and merged.num_samples == 3


def test_collect_takes_a_config_whole_like_keywords(reference, tmp_path):
    """``collect(..., config)`` and ``collect(..., elicitation=...)`` write the shards the keywords write."""
    from hf_msv.collect import CollectConfig
    from hf_msv.elicitation import ElicitationSettings

    out, _ = reference
    torch.set_num_threads(1)
    flat = {k: v for k, v in SETTINGS.items() if k != "delimiters"}
    config = CollectConfig(**flat)
    collect(
        tiny_lm(),
        TOK,
        tiny_problems(7),
        tmp_path / "a",
        config,
        elicitation=ElicitationSettings(delimiters=("Wait", "e")),
    )
    assert shard_bytes(tmp_path / "a") == shard_bytes(out)


def test_collect_main_runs_from_flags(tmp_path, monkeypatch, capsys):
    import hf_msv.collect.cli as cli

    monkeypatch.setattr(cli, "load_lm", lambda name, dtype: (tiny_lm(), TOK))
    monkeypatch.setattr(cli, "load_problems", lambda spec, columns=None: tiny_problems(2))
    cli.main(
        [
            "--model",
            "tiny",
            "--problems",
            "tiny",
            "--output-dir",
            str(tmp_path),
            "--num-samples",
            "2",
            "--max-new-tokens",
            "12",
            "--delimiters",
            "Wait",
            "e",
            "--checker",
            "exact",
            "--prompt-template",
            "plain",
            "--problems-per-shard",
            "3",
            "--seed",
            "3",
            "--no-progress",
        ]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["generated"] == 2 and summary["shards_written"] == 1 and summary["checks"] > 0
    assert summary["unverifiable"] == 0
    settings = json.loads((tmp_path / "collect_config.json").read_text())
    assert settings["checker_kwargs"] == {} and settings["elicitation"]["delimiters"] == ["Wait", "e"]
    info = read_shard(list_shards(tmp_path)[0], hidden=False)[1]
    assert info["verdicts"]["checks"] == summary["checks"] and info["verdicts"]["unverifiable"] == 0
    with pytest.raises(SystemExit):
        cli.main(["--model", "tiny", "--output-dir", str(tmp_path)])  # neither --problems nor --traces
    assert "exactly one of --problems" in capsys.readouterr().err


def test_collections_recorded_with_flat_elicitation_keys_resume():
    """Settings recorded before `ElicitationSettings` (flat keys) compare equal to the same settings recorded now."""
    from hf_msv.collect.store import _comparable
    from hf_msv.data import collection_elicitation
    from hf_msv.elicitation import ElicitationSettings

    old = {
        "mode": "streaming",
        "delimiters": ["Wait"],
        "every_k_tokens": None,
        "elicitation_prompt": "P \\boxed",
        "max_answer_tokens": 40,
        "seed": 0,
    }
    new = {"elicitation": ElicitationSettings(prompt="P \\boxed").to_dict(), "seed": 0}
    assert _comparable(old) == _comparable(new)
    assert _comparable(old) != _comparable(dict(new, seed=1))
    assert collection_elicitation(old) == collection_elicitation(new) == ElicitationSettings(prompt="P \\boxed")
    assert collection_elicitation({"delimiters": None, "every_k_tokens": 8}).delimiters == ()


def test_resume_accepts_the_same_weights_loaded_from_another_path():
    """A moved checkout (same weights fingerprint, tokenizer beside the LM) extends a collection; other weights or a
    tokenizer from elsewhere do not."""
    from hf_msv.collect.store import _comparable

    base = {"lm_name_or_path": "/a/lm", "tokenizer": "/a/lm", "lm_weights_fingerprint": "f1", "seed": 0}
    moved = base | {"lm_name_or_path": "/b/lm", "tokenizer": "/b/lm"}
    assert _comparable(base) == _comparable(moved)
    assert _comparable(base) != _comparable(moved | {"lm_weights_fingerprint": "f2"})
    assert _comparable(base) != _comparable(moved | {"tokenizer": "/c/tok"})
    assert _comparable(base) != _comparable(base | {"seed": 1})


def test_unverifiable_verdicts_are_counted_per_shard_and_in_the_result(tmp_path, monkeypatch):
    """A checker that cannot decide anything: every undecided verdict is counted in the result and, per shard, in
    the shard info (``verdicts``), which sum to the result's."""
    import hf_msv.equivalence as equivalence
    from hf_msv.equivalence import EquivalenceChecker, Verdict

    class Undecided(EquivalenceChecker):
        name = "undecided"

        def _compare(self, a, b):
            return Verdict.EQUAL if a == b else Verdict.UNVERIFIABLE

    real = equivalence.get_checker
    monkeypatch.setattr(
        equivalence, "get_checker", lambda name, **kw: Undecided() if name == "undecided" else real(name, **kw)
    )
    result = run_collect(tmp_path, num_problems=4, checker="undecided")
    assert 0 < result.unverifiable <= result.checks
    infos = [read_shard(p, hidden=False)[1]["verdicts"] for p in list_shards(tmp_path)]
    assert len(infos) == 2
    assert sum(i["unverifiable"] for i in infos) == result.unverifiable
    assert sum(i["checks"] for i in infos) == result.checks


def test_spaced_answers_are_collected_and_recorded(tmp_path):
    """``min_gap_tokens`` thins a chain's non-terminal answers to one per that many tokens and is recorded with the
    collection (an unspaced collection records nothing new)."""
    plain, spaced = tmp_path / "plain", tmp_path / "spaced"
    run_collect(plain, num_problems=3, delimiters=[], every_k_tokens=2)
    run_collect(spaced, num_problems=3, delimiters=[], every_k_tokens=2, min_gap_tokens=5)
    assert "min_gap_tokens" not in json.loads((plain / "collect_config.json").read_text())["elicitation"]
    assert json.loads((spaced / "collect_config.json").read_text())["elicitation"]["min_gap_tokens"] == 5
    fewer = 0
    for pid, p in problems_by_id(spaced).items():
        q = problems_by_id(plain)[pid]
        for n in range(2):
            steps = sorted(p.answer_tau[(p.answer_sequence == n) & ~p.answer_terminal].tolist())
            assert all(later - earlier >= 5 for earlier, later in itertools.pairwise(steps))
        fewer += len(q.answer_tau) - len(p.answer_tau)
    assert fewer > 0
