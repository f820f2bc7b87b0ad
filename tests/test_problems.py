"""Benchmark loaders on the real files in ../shared/data (read in place, never copied)."""

import random
import re

import pytest

from hf_msv.answers import extract_last_boxed
from hf_msv.data.problems import (
    BENCHMARKS,
    DATA_DIR_ENV,
    Problem,
    clean_latex_answer,
    default_data_dir,
    load_benchmark,
)
from hf_msv.equivalence import Verdict, get_checker

ROWS = {  # shared/data/README.md; the AIME CSV has a title line before its header and 933 problems
    "gsm8k": 1319,
    "math500": 500,
    "aime_1983_2024": 933,
    "aime24": 30,
    "amc23": 40,
    "olympiadbench": 675,
    "omni_math": 2821,
}

pytestmark = pytest.mark.skipif(
    not (default_data_dir() / "math500.jsonl").is_file(), reason=f"benchmark data not found (set ${DATA_DIR_ENV})"
)


@pytest.fixture(scope="module")
def benchmarks():
    return {name: load_benchmark(name) for name in BENCHMARKS}


def test_registry_covers_every_data_file():
    assert set(BENCHMARKS) == set(ROWS)
    files = {p.name for p in default_data_dir().iterdir() if p.suffix in (".jsonl", ".csv")}
    assert {preset.filename for preset in BENCHMARKS.values()} == files


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_row_loads(benchmarks, name):
    problems = benchmarks[name]
    assert len(problems) == ROWS[name]
    assert len({p.id for p in problems}) == len(problems)
    for p in problems:
        assert isinstance(p, Problem) and p.source == name and p.id.startswith(f"{name}/")
        assert p.question.strip() and p.gold.strip()
        assert p.gold == p.gold.strip() and "\x0c" not in p.gold and "\\boxed" not in p.gold
        assert not (p.gold.startswith("$") and p.gold.endswith("$"))


def test_integer_answers(benchmarks):
    assert all(re.fullmatch(r"-?\d+", p.gold) for p in benchmarks["gsm8k"])  # "#### 1,600" -> "1600"
    gsm = benchmarks["gsm8k"][0]
    assert gsm.gold == "18" and "####" not in gsm.meta["solution"]
    for name in ("aime24", "aime_1983_2024", "amc23"):
        assert all(re.fullmatch(r"-?(0|[1-9]\d*)", p.gold) for p in benchmarks[name]), name
    aime24 = {p.id: p for p in benchmarks["aime24"]}
    assert aime24["aime24/67"].gold == "25"  # "025" in the file
    assert benchmarks["amc23"][0].gold == "27"  # 27.0 in the file
    aime = {p.id: p for p in benchmarks["aime_1983_2024"]}
    assert aime["aime_1983_2024/1983-1"].gold == "60" and aime["aime_1983_2024/1983-1"].meta["year"] == 1983
    assert aime["aime_1983_2024/2022-II-8"].meta["gold_alternatives"] == ["80", "81"]
    assert "aime_1983_2024/2024-II-9" not in aime


def test_latex_answers(benchmarks):
    math500 = benchmarks["math500"][0]
    assert math500.id == "math500/math500_0000" and math500.gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert {"level", "subject", "solution"} <= set(math500.meta)
    omni = benchmarks["omni_math"]
    golds = {p.meta["raw_answer"]: p.gold for p in omni}
    assert golds["\x0crac{7}{12}"] == "\\frac{7}{12}"  # a lost backslash: "\f" became form feed
    assert golds["\\boxed{60}"] == "60"
    assert golds["The smallest possible value of \\(a_{10}\\) is \\(248\\)."] == "248"
    either = next(p for p in omni if p.meta.get("gold_alternatives"))
    assert len(either.meta["gold_alternatives"]) == 2 and either.gold == either.meta["gold_alternatives"][0]


def test_olympiadbench_lists_units_and_multiple_answers(benchmarks):
    by_id = {p.id: p for p in benchmarks["olympiadbench"]}
    assert by_id["olympiadbench/1606"].gold == "2"
    multiple = [p for p in benchmarks["olympiadbench"] if p.meta["is_multiple_answer"]]
    assert len(multiple) == 94
    assert any(p.gold == "69, 84" for p in multiple)  # "$69$,$84$"
    assert all("$" not in p.gold for p in benchmarks["olympiadbench"])
    units = {p.gold: p.meta["unit"] for p in benchmarks["olympiadbench"] if p.meta.get("unit")}
    assert units["45"] == "minute" and units["\\frac{600}{7}"] == "km/h"


@pytest.mark.parametrize("name", sorted(ROWS))
def test_gold_answers_grade_correct_against_themselves(benchmarks, name):
    # Through Math-Verify itself (fast paths off): every gold must parse and verify.
    checker = get_checker("symbolic", timeout=5.0, fast_paths=False)
    sample = random.Random(0).sample(benchmarks[name], min(40, len(benchmarks[name])))
    for p in sample:
        assert checker.compare_to_gold(p.gold, p.gold) is Verdict.EQUAL, p.id
        # and as a model would write it at the end of a solution
        assert checker.is_correct(extract_last_boxed(f"So the answer is $\\boxed{{{p.gold}}}$."), p.gold), p.id


@pytest.mark.parametrize(
    "name, problem_id, prediction",
    [
        ("aime24", "aime24/67", "025"),
        ("aime24", "aime24/67", "25.0"),
        ("amc23", "amc23/0", "27"),
        ("gsm8k", "gsm8k/0", "\\$18"),
        ("math500", "math500/math500_0000", "(3, \\pi/2)"),
        ("omni_math", "omni_math/916", "0.583333"),  # 7/12, rounded to 6 decimals
        ("olympiadbench", "olympiadbench/1606", "2"),
    ],
)
def test_typical_predictions_are_correct(benchmarks, name, problem_id, prediction):
    gold = next(p.gold for p in benchmarks[name] if p.id == problem_id)
    assert get_checker("symbolic").is_correct(prediction, gold)


def test_clean_latex_answer():
    assert clean_latex_answer("\\[\n\\boxed{\\frac{\\pi}{4}}\n\\]") == "\\frac{\\pi}{4}"
    assert clean_latex_answer("$\\frac{40}{9}$") == "\\frac{40}{9}"
    assert clean_latex_answer("\\( n \\leq 2 \\)") == "n \\leq 2"
    assert clean_latex_answer("$a$ and $b$") == "$a$ and $b$"
    assert clean_latex_answer("a^{2}<a<\x0crac{1}{a}") == "a^{2}<a<\\frac{1}{a}"


def test_paths_and_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("nope")
    directory = default_data_dir()
    assert len(load_benchmark("aime24", directory)) == 30  # a directory
    assert len(load_benchmark("aime24", directory / "aime24.jsonl")) == 30  # a file
    monkeypatch.setenv(DATA_DIR_ENV, str(directory))
    assert default_data_dir() == directory
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=DATA_DIR_ENV):
        load_benchmark("amc23")


# ----------------------------------------------------------------------------------------------------------------
# Problem specs and named LMs (hf_msv.collect.load_problems / load_lm through hf_msv.registry)
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture
def named_lm(tmp_path):
    """A named LM registered for one test, with a problem generator, a prompt and an empty checkpoint directory."""
    from hf_msv import registry

    def problems(split, n, seed=0):
        return [Problem(id=f"toy/{split}/{seed}/{i}", question=f"{i}+{seed}", gold=str(i + seed)) for i in range(n)]

    lm = registry.NamedLM(
        name="toy-lm",
        path=tmp_path / "toy",
        prompt=lambda p: f"Q: {p.question}",
        max_new_tokens=123,
        problems=problems,
        missing_hint="train it with `make toy`",
    )
    registry.register_lm(lm)
    yield lm
    registry._REGISTRY.pop("toy-lm", None)


def test_problem_specs_of_named_lms_files_and_benchmarks(named_lm, tmp_path, monkeypatch):
    from hf_msv.collect import load_problems

    assert [p.id for p in load_problems("toy-lm:train:2:5")] == ["toy/train/5/0", "toy/train/5/1"]
    assert load_problems("toy-lm:eval:1")[0].gold == "0"
    with pytest.raises(ValueError, match=r"toy-lm:<split>:<n>\[:<seed>\]"):
        load_problems("toy-lm:train")
    own = tmp_path / "own.jsonl"
    own.write_text('{"id": 1, "question": "2+2", "gold": 4}\n\n{"id": "b", "question": "1+1", "gold": "2"}\n')
    assert [(p.id, p.gold, p.source) for p in load_problems(str(own))] == [("1", "4", "own"), ("b", "2", "own")]
    own.write_text('{"id": 1, "question": "2+2", "gold": 4}\n{"id": 2, "question": "x"}\n')
    with pytest.raises(ValueError, match="line 2: expected a JSON object with"):
        load_problems(str(own))
    with pytest.raises(ValueError, match=r"unknown problem spec 'nope.jsonl'.*toy-lm"):
        load_problems("nope.jsonl")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "no-data"))
    with pytest.raises(FileNotFoundError, match=rf"\${DATA_DIR_ENV}.*--problems your own .jsonl"):
        load_problems("math500:10")


def test_named_lm_checkpoints_defaults_and_prompt(named_lm, tmp_path):
    from transformers import PreTrainedTokenizerFast

    from hf_msv.collect import CollectConfig, load_lm
    from hf_msv.collect.lm import prompt_builder

    with pytest.raises(FileNotFoundError, match=r"no checkpoint of the named LM 'toy-lm'.*train it with `make toy`"):
        load_lm("toy-lm", device="cpu")
    resolved = CollectConfig(model="toy-lm").resolved()
    assert (resolved.max_new_tokens, resolved.prompt_template) == (123, "toy-lm")
    assert CollectConfig(model="toy-lm", max_new_tokens=7, prompt_template="plain").resolved().max_new_tokens == 7
    assert prompt_builder("toy-lm", PreTrainedTokenizerFast)(Problem("a", "1+1", "2")) == "Q: 1+1"
    with pytest.raises(ValueError, match="prompt_template must be one of"):
        prompt_builder("no question here", None)
