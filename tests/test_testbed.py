"""The testbed package (``hf_msv.testbed``): its public names, its tokenizer, the one LM it ships, and how another
testbed task joins it (``register_task``)."""

import random
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

import hf_msv.testbed as testbed
from hf_msv.testbed import task_v2
from hf_msv.testbed.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _texts(n=100):
    rng = random.Random(0)
    for split in testbed.SPLITS:
        for p in task_v2.generate_problems(split, n, seed=3):
            yield task_v2.format_prompt(p)
            yield task_v2.sample_trace(p, rng).text
            yield "".join(task_v2.make_elicitation_example(p, rng))


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
    wait = tok.convert_tokens_to_ids(testbed.DELIMITER)
    ids = tok("A: 1+2=3. Wait, 1+2=3? yes.").input_ids
    assert ids[0] == tok.bos_token_id and ids.count(wait) == 1
    assert {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id} == {1, 2, 0}


def test_public_names_are_the_v2_tasks():
    """Every name of ``__all__`` exists; the prompt helpers are task_v2's own (defined once, in the testbed)."""
    assert all(hasattr(testbed, name) for name in testbed.__all__)
    for name in (
        "DELIMITER",
        "ELICITATION_PROMPT",
        "SPLITS",
        "format_prompt",
        "split_of",
        "generate_problems",
        "make_trace",
        "make_elicitation_example",
        "TaskKnobsV2",
    ):
        assert getattr(testbed, name) is getattr(task_v2, name), name
    assert testbed.format_prompt.__module__ == testbed.split_of.__module__ == "hf_msv.testbed.task_v2"
    assert testbed.TESTBED_LM_DIR == testbed.TESTBED_V2_LM_DIR == testbed.TASKS["v2"].lm_dir
    assert testbed.get_task("testbed") is testbed.get_task("testbed-v2") is testbed.TASKS[testbed.DEFAULT_TASK]


def test_the_package_ships_one_testbed_lm_and_its_package_data_exists():
    package = Path(testbed.__file__).resolve().parent
    assert sorted(p.name for p in package.iterdir() if (p / "config.json").exists()) == ["lm-v2", "verifier"]
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["hf_msv"]
    for pattern in data:
        assert list((ROOT / "hf_msv").glob(pattern)), pattern


@pytest.fixture
def restored_tasks(monkeypatch):
    """The testbed tasks, LM names and named LMs as they were before the test."""
    from hf_msv import registry

    registry.named_lms()  # the entry points run now, so that they cannot re-register anything later
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    saved = [(d, dict(d)) for d in (testbed.TASKS, testbed.TESTBED_LM_NAMES)]
    yield
    for d, before in saved:
        d.clear()
        d.update(before)


def test_another_task_joins_with_register_task(restored_tasks):
    """A task registered with `register_task` is a testbed task (`get_task`, ``TASKS``) and a named LM (problem
    specs, ``load_lm``'s missing-checkpoint hint), like the default one."""
    from hf_msv.collect.lm import load_lm, load_problems
    from hf_msv.testbed import registration, tasks

    other = replace(
        testbed.TASKS["v2"],
        name="v9",
        lm_name="testbed-v9",
        lm_dir=Path("/nonexistent/lm-v9"),
        trainer="python -m somewhere.train",
    )
    registration.register_task(other, aliases=("testbed-nine",))
    assert tasks.get_task("v9") is tasks.get_task("testbed-v9") is tasks.get_task("testbed-nine") is other
    assert load_problems("testbed-nine:evaluation:2") == task_v2.generate_problems("evaluation", 2)
    with pytest.raises(FileNotFoundError, match=r"python -m somewhere.train --task v9 --output-dir /nonexistent"):
        load_lm("testbed-v9", device="cpu")
    with pytest.raises(ValueError, match="unknown testbed task"):
        tasks.get_task("v10")
