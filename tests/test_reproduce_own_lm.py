"""``hf-msv reproduce --model``: the main study on an LM given as an outside model, with problem files.

The testbed LM's directory is passed as ``--model`` (not by its registered name) and its problems as ``.jsonl``
files of ``{id, question, gold}`` (no testbed metadata). The end-to-end run uses the smallest sizes that still train
and evaluate every main-study verifier (8 / 4 / 4 problems × 4 samples of ≤ 160 tokens, N in {1, 4}, one training
seed, the quick step budget) and still takes minutes on 2 shared CPU cores: it is marked slow (`make test-slow`).
"""

from __future__ import annotations

import json

import pytest

from hf_msv.collect.lm import load_problems
from hf_msv.errors import UserError
from hf_msv.reproduction import ReproduceConfig, main, parse_arguments, reproduce
from hf_msv.reproduction.own_lm import reproduction_task
from hf_msv.testbed import TESTBED_LM_DIR

PROMPT = "Q: {question}\nA:"  # the testbed LM's prompt format, given as an outside LM's template


def _write_problems(path, spec: str) -> str:
    rows = [{"id": p.id, "question": p.question, "gold": p.gold} for p in load_problems(spec)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture
def problem_files(tmp_path):
    return [
        "--train-problems",
        _write_problems(tmp_path / "train.jsonl", "testbed:train:8:1"),
        "--val-problems",
        _write_problems(tmp_path / "val.jsonl", "testbed:validation:4:1"),
        "--eval-problems",
        _write_problems(tmp_path / "eval.jsonl", "testbed:evaluation:4:1"),
    ]


def _argv(tmp_path, problem_files, *more):
    return [
        "--model",
        str(TESTBED_LM_DIR),
        *problem_files,
        "--prompt-template",
        PROMPT,
        "--quick",
        "--training-seeds",
        "1",
        "--num-samples",
        "4",
        "--num-sequences",
        "1",
        "4",
        "--max-new-tokens",
        "160",
        "--output-dir",
        str(tmp_path / "out"),
        "--work-dir",
        str(tmp_path / "work"),
        "--no-progress",
        *more,
    ]


def test_own_lm_defaults_come_from_the_model_and_the_problem_specs(tmp_path, problem_files):
    cfg = parse_arguments(_argv(tmp_path, problem_files)[:-7]).reproduce_config()  # without --max-new-tokens ...
    assert cfg.own_lm and cfg.task == "own" and cfg.name == "lm-v2"
    assert (cfg.train_problems, cfg.val_problems, cfg.eval_problems) == (8, 4, 4)  # every problem of each spec
    assert (cfg.num_samples, cfg.num_sequences, cfg.training_seeds, cfg.studies) == (4, (1, 4), 1, ("main",))
    assert (cfg.stem, cfg.default_work_dir) == ("msv-lm-v2-quick", "outputs/reproduce-lm-v2-quick")
    assert cfg.max_new_tokens == 4096  # an unregistered LM's budget; its context cuts each sequence
    collect = cfg.collect_config(4)
    assert collect.prompt_template == PROMPT and collect.elicitation.delimiters == ("Wait",)
    # a collection's key holds the problems: another problem file under the same path is collected again
    task = reproduction_task(cfg)
    assert [p.question for p in task.problems("train", 8)] == [p.question for p in load_problems("testbed:train:8:1")]
    before = task.collection_settings("train")
    _write_problems(tmp_path / "train.jsonl", "testbed:train:8:2")
    assert reproduction_task(cfg).collection_settings("train")["problems"] != before["problems"]
    # a registered LM's budget (the testbed's length cap), the template auto without one given, another name
    named = parse_arguments(["--model", "testbed", *problem_files, "--name", "tb"]).reproduce_config()
    assert (named.max_new_tokens, named.collection_prompt_template, named.stem) == (272, "auto", "msv-tb")
    # a testbed run's settings read as before: no own-LM keys
    assert "model" not in ReproduceConfig().to_dict() and "model" in cfg.to_dict()


def test_bad_own_lm_input_is_a_user_error_before_any_work(tmp_path, problem_files):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cases = {
        "--task is for a testbed task": ["--model", "x", "--task", "v2", *problem_files],
        "needs --train-problems": ["--model", "x", "--train-problems", problem_files[1]],
        "unknown problem spec": ["--model", "x", *problem_files[:5], str(tmp_path / "missing.jsonl")],
        "empty": ["--model", "x", *problem_files[:5], str(empty)],  # the loader's words, naming the file
        "give --model": problem_files,
        "--shipped-verifier": ["--model", "x", *problem_files, "--shipped-verifier"],
        "use letters": ["--model", "x", *problem_files, "--name", "a/b"],
    }
    for message, argv in cases.items():
        with pytest.raises(UserError, match=message):
            main(argv)
    args = parse_arguments(_argv(tmp_path, problem_files, "--studies", "masks"))
    with pytest.raises(UserError, match="main study only"):
        reproduce(args)
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 10-20 min on 2 shared CPU cores: collection, 6 fits, the evaluation; the rerun
def test_main_study_on_an_outside_lm_end_to_end_and_resumed(tmp_path, problem_files):
    from hf_msv.reproduction import ReproductionResults

    def run(argv: list[str]) -> dict:
        """`hf-msv reproduce` with `argv`: its typed summary, as the JSON it writes."""
        result = main(argv)
        assert isinstance(result, ReproductionResults)
        return result.to_json()

    summary = run(_argv(tmp_path, problem_files))
    out = tmp_path / "out"
    md, js = out / "msv-lm-v2-quick.md", out / "msv-lm-v2-quick.json"
    assert md.exists() and js.exists() and (out / "msv-lm-v2-quick-main.md").exists()
    written = json.loads(js.read_text())
    assert written["studies"] == ["main"] and written["config"]["model"] == str(TESTBED_LM_DIR)
    assert written["config"]["problem_specs"] == [problem_files[1], problem_files[3], problem_files[5]]
    assert summary["verifiers"]["trained"] == 6  # Probe, MSV_1, MSV_4 × terminal, streaming × 1 seed
    assert set(written["lm_costs"]) == {"1", "4"} and written["main"]["4"]["msv"] == "MSV_4"
    assert {"Self-consistency", "Probe", "MSV_1", "MSV_4"} <= set(written["main"]["4"]["terminal"])
    assert written["main"]["data"]["eval"]["mean_sequence_tokens"] <= 160
    text = md.read_text()
    assert "8 train / 4 validation / 4 evaluation problems × 4 samples" in text
    assert "| **MSV_4** |" in text and "| Probe |" in text and "| Self-consistency |" in text
    main_results = json.loads((out / "msv-lm-v2-quick-main.json").read_text())
    assert {"Probe", "MSV_1", "MSV_4"} <= set(main_results["terminal"]["4"])

    shards = sorted((tmp_path / "work" / "data").glob("*/*.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    again = run(_argv(tmp_path, problem_files))
    # (an edit of the collection code between the two runs changes the shards' key: they are collected again)
    reused = " ".join(again["reuse"]["reused"])
    assert all(f"shards data/{split} (same settings" in reused for split in ("train", "val", "eval")), again["reuse"]
    assert [p.stat().st_mtime_ns for p in shards] == stamps  # nothing recollected
    assert again["verifiers"] == {"trained": 0, "reused": 6}
    assert again["main"] == written["main"]
