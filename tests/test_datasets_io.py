"""🤗 datasets in and out: problems from local files and datasets (column mapping, presets, the Hub id path with
load_dataset isolated), shards exported to a Dataset / parquet / jsonl / arrow, `hf-msv export`, and Hub dataset
repos with the Hub calls isolated."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from helpers.datasets_io import ROWS, FakeHub, write_table
from helpers.shards import write_dataset
from hf_msv.data import (
    BENCHMARKS,
    ProblemColumns,
    ShardDataset,
    TableSpec,
    download_shards,
    export_shards,
    load_benchmark,
    load_problems,
    parse_table_spec,
    push_shards_to_hub,
    read_shard,
    shards_to_dataset,
)
from hf_msv.data.problems import default_data_dir
from hf_msv.errors import UserError

MAPPED = ProblemColumns(question="q", gold="a", id="uid")


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """datasets' Arrow cache of the files read here goes to the test's directory, not the user's cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets_cache")


@pytest.mark.parametrize("kind", ["parquet", "csv", "jsonl", "json", "disk"])
def test_every_local_format_loads_with_a_column_mapping(tmp_path, kind):
    path = write_table(tmp_path, kind)
    problems = load_problems(str(path), MAPPED)
    assert [p.id for p in problems] == [r["uid"] for r in ROWS]
    assert [p.gold for p in problems] == [r["a"] for r in ROWS]  # "04" stays a string in every format
    assert [p.question for p in problems] == [r["q"].strip() for r in ROWS]
    assert problems[2].meta["level"] in (2, "2") and problems[0].source == path.stem
    assert [p.id for p in load_problems(f"{path}:3", MAPPED)] == ["p0", "p1", "p2"]


def test_row_index_ids_gold_formats_and_missing_columns(tmp_path):
    path = write_table(tmp_path, "parquet")
    indexed = load_problems(str(path), ProblemColumns(question="q", gold="a", gold_format="integer"))
    assert [p.id for p in indexed] == [str(i) for i in range(len(ROWS))]  # no id column: the row index
    assert indexed[2].gold == "4"  # "04" read as an integer
    with pytest.raises(UserError, match=r"no column 'question', 'gold'; its columns: \['uid', 'q', 'a', 'level'\]"):
        load_problems(str(path))
    with pytest.raises(UserError, match="no column 'ident'"):
        load_problems(str(path), ProblemColumns(question="q", gold="a", id="ident"))
    with pytest.raises(UserError, match="unknown gold format"):
        ProblemColumns(gold_format="roman")


def test_directories_of_data_files_and_splits(tmp_path):
    import datasets

    directory = tmp_path / "dataset"
    directory.mkdir()
    for split, rows in (("train", ROWS[:4]), ("test", ROWS[4:])):
        datasets.Dataset.from_list(rows).to_parquet(str(directory / f"{split}.parquet"))
    assert [p.id for p in load_problems(str(directory), MAPPED)] == ["p4", "p5"]  # "test" by default
    assert [p.id for p in load_problems(f"{directory}:train:2", MAPPED)] == ["p0", "p1"]
    with pytest.raises(UserError, match=r"no split 'dev'; its splits: \['train', 'test'\]"):
        load_problems(f"{directory}:dev", MAPPED)
    saved = tmp_path / "dict"
    datasets.DatasetDict({"a": datasets.Dataset.from_list(ROWS), "b": datasets.Dataset.from_list(ROWS)}).save_to_disk(
        str(saved)
    )
    with pytest.raises(UserError, match=r"has the splits \['a', 'b'\]; choose one"):
        load_problems(str(saved), MAPPED)
    assert len(load_problems(f"{saved}:b", MAPPED)) == len(ROWS)


def test_hub_datasets_go_through_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return datasets.Dataset.from_list(ROWS)

    def fake_builder(path, name=None):
        calls.append(("builder", path, name))
        return SimpleNamespace(info=SimpleNamespace(features=datasets.Dataset.from_list(ROWS).features))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(datasets, "load_dataset_builder", fake_builder)
    columns = ProblemColumns(question="q", gold="a", id="uid", subset="main")
    problems = load_problems("hub:org/problems:validation:2", columns)
    assert calls == [("builder", "org/problems", "main"), ("org/problems", {"name": "main", "split": "validation"})]
    calls.clear()
    with pytest.raises(UserError, match=r"org/problems has no column 'answer'; its columns: \['uid', 'q', 'a'"):
        load_problems("hub:org/problems", ProblemColumns(question="q", gold="answer"))
    assert [c[0] for c in calls] == ["builder"]  # refused before any data was downloaded
    assert [(p.id, p.source) for p in problems] == [("p0", "org/problems"), ("p1", "org/problems")]
    assert parse_table_spec("hub:org/problems") == TableSpec("org/problems", hub=True)
    assert parse_table_spec("hub:org/problems:5").limit == 5 and parse_table_spec("hub:org/p").split is None
    with pytest.raises(UserError, match="problem spec 'hub:not//valid'"):
        load_problems("hub:not//valid", columns)
    with pytest.raises(UserError, match="unknown problem spec 'org/problems'"):  # a bare id is a missing path
        load_problems("org/problems", columns)


def test_jsonl_keeps_its_format_and_line_numbers(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text(
        '{"id": 1, "question": "2+2", "gold": 4, "source": "mine", "meta": {"k": 1}}\n{"id": "b", "q": 1}\n'
    )
    with pytest.raises(UserError, match='own line 2: expected a JSON object with "question" and "gold"'):
        load_problems(str(own))
    own.write_text('{"id": 1, "question": "2+2", "gold": 4}\n{"id": 1, "question": "3+3", "gold": 6}\n')
    with pytest.raises(UserError, match="a second problem with the id '1'"):
        load_problems(str(own))


@pytest.mark.skipif(not (default_data_dir() / "aime24.jsonl").is_file(), reason="benchmark data not found")
def test_presets_go_through_the_same_loader():
    from hf_msv.data import problems_from_table, read_table

    preset = BENCHMARKS["aime24"]
    table = read_table(default_data_dir() / preset.filename, preset.columns)
    direct = problems_from_table(table, preset.columns, source="aime24", id_prefix="aime24/", drop=preset.drop)
    assert direct == load_benchmark("aime24") == load_problems("aime24")
    assert load_problems("aime24:3") == direct[:3]
    with pytest.raises(UserError, match="has its own columns"):
        load_problems("aime24", MAPPED)


# ------------------------------------------------------------------------------------------------ shards out


@pytest.fixture
def collection(tmp_path):
    directory = tmp_path / "collection"
    directory.mkdir()
    problems = write_dataset(directory, num_problems=3, per_shard=2, num_sequences=3)
    (directory / "collect_config.json").write_text(json.dumps({"checker": "exact"}))
    return directory, problems


def test_shards_become_one_row_per_answer(collection):
    directory, problems = collection
    dataset = shards_to_dataset(directory, hidden_states=True)
    assert len(dataset) == sum(p.num_answers for p in problems)
    assert dataset["problem_id"] == [p.problem_id for p in problems for _ in range(p.num_answers)]
    assert dataset["answer_text"] == [t for p in problems for t in p.answer_text]
    assert dataset["correct"] == [bool(c) for p in problems for c in p.answer_correct]
    assert dataset["answer_class"] == [int(c) for p in problems for c in p.answer_class]
    stored, _ = read_shard(sorted(directory.glob("shard-*"))[0])
    first = stored[0]
    row = dataset[1]
    start, length = int(first.answer_token_start[1]), int(first.answer_length[1])
    assert row["token_ids"] == first.token_ids[start : start + length].tolist() and row["length"] == length
    np.testing.assert_allclose(row["hidden_states"], first.hidden_states[start : start + length].float().numpy())
    assert row["sequence_length"] == first.sequence_length[first.answer_sequence[1]]
    assert "hidden_states" not in shards_to_dataset(directory).column_names


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "arrow"])
def test_export_round_trips(collection, tmp_path, fmt):
    import datasets

    directory, problems = collection
    output = tmp_path / f"answers.{fmt}"
    result = export_shards(directory, output, fmt)
    assert (result.num_rows, result.num_problems, result.num_shards) == (sum(p.num_answers for p in problems), 3, 2)
    if fmt == "arrow":
        back = datasets.load_from_disk(str(output))
    else:
        back = datasets.load_dataset("parquet" if fmt == "parquet" else "json", data_files=str(output), split="train")
    expected = shards_to_dataset(directory)
    assert back["problem_id"] == expected["problem_id"] and back["correct"] == expected["correct"]
    assert back["answer_text"] == expected["answer_text"] and back["token_ids"] == expected["token_ids"]
    with pytest.raises(UserError, match="exists"):
        export_shards(directory, output, fmt)
    with pytest.raises(UserError, match="unknown export format"):
        export_shards(directory, tmp_path / "x", "xlsx")


def test_hf_msv_export_end_to_end(collection, tmp_path, capsys):
    import datasets

    from hf_msv import cli

    directory, problems = collection
    output = tmp_path / "rows.parquet"
    cli.main(["export", "--shards", str(directory), "--output", str(output)])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["export"]["num_rows"] == sum(p.num_answers for p in problems) and printed["push"] is None
    assert (
        len(datasets.load_dataset("parquet", data_files=str(output), split="train")) == printed["export"]["num_rows"]
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", "--shards", str(directory)])
    assert exit_info.value.code == 2 and "give --output" in capsys.readouterr().err


def test_push_and_download_with_the_hub_isolated(collection, tmp_path, monkeypatch):
    directory, problems = collection
    hub = FakeHub(tmp_path / "remote").install(monkeypatch)
    pushed = push_shards_to_hub(directory, "org/collection", revision="v1", private=True)
    assert pushed.files == ["collect_config.json", "shard-r000-00000.safetensors", "shard-r000-00001.safetensors"]
    assert [c[0] for c in hub.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert hub.calls[0][2] == {"repo_type": "dataset", "private": True, "exist_ok": True}
    upload = hub.calls[2][2]
    assert (upload["repo_id"], upload["repo_type"], upload["revision"]) == ("org/collection", "dataset", "v1")
    assert upload["folder_path"] == str(directory)
    downloaded = download_shards("org/collection", tmp_path / "local", revision="v1")
    assert hub.calls[-1][1] == ("org/collection",) and hub.calls[-1][2]["repo_type"] == "dataset"
    assert hub.calls[-1][2]["revision"] == "v1" and [p.name for p in downloaded.shards] == pushed.files[1:]
    readable = ShardDataset(downloaded.local_dir)
    assert readable.problem_ids == [p.problem_id for p in problems]
    FakeHub(tmp_path / "empty").install(monkeypatch)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no hf_msv shards"):
        download_shards("org/empty", tmp_path / "nothing")


def test_hub_refusals_and_bad_repo_ids_are_user_errors(collection, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    directory, _ = collection

    def refuse(api, *args, **kwargs):
        response = SimpleNamespace(headers={}, request=None)  # what the error reads of an HTTP response
        raise HfHubHTTPError("403 Forbidden: no write access", response=response)

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    with pytest.raises(UserError, match="cannot push to the dataset 'org/collection': 403 Forbidden"):
        push_shards_to_hub(directory, "org/collection")
    with pytest.raises(UserError, match="not a Hub repository id"):
        push_shards_to_hub(directory, "not//valid")


def test_collect_reads_a_parquet_with_its_own_column_names(tmp_path, capsys):
    """``hf-msv collect --problems table.parquet --question-column q --gold-column a --id-column uid``: the shards
    hold the table's problems under their ids and golds; a column that is not there fails before the LM loads."""
    from hf_msv import cli

    path = write_table(tmp_path, "parquet", ROWS[:2])
    out = tmp_path / "shards"
    argv = ["collect", "--model", "testbed", "--problems", f"{path}", "--output-dir", str(out), "--no-progress"]
    sampling = ["--num-samples", "2", "--max-new-tokens", "24", "--checker", "exact"]
    cli.main([*argv, *sampling, "--question-column", "q", "--gold-column", "a", "--id-column", "uid"])
    problems = [p for f in sorted(out.glob("shard-*.safetensors")) for p in read_shard(f)[0]]
    assert [(p.problem_id, p.gold) for p in problems] == [("p0", "00"), ("p1", "02")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv[:-3], "--output-dir", str(tmp_path / "other"), *sampling, "--question-column", "question"])
    assert exit_info.value.code == 2 and "uid" in capsys.readouterr().err  # the columns that exist are named
