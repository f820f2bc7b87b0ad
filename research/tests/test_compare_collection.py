"""`research/compare_main_collection.py`: a re-made collection against a committed main study's statistics."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from helpers.evaluation import write_split
from hf_msv.evaluation import load_split, split_statistics

SCRIPT = Path(__file__).resolve().parents[1] / "compare_main_collection.py"


def _script():
    spec = importlib.util.spec_from_file_location("compare_main_collection", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_collection_is_compared_with_the_committed_statistics(tmp_path, capsys):
    val = write_split(tmp_path / "work" / "data" / "val", 3, seed=1)
    write_split(tmp_path / "work" / "data" / "eval", 3, seed=1)  # the same draw: only the committed side differs
    stats = split_statistics(load_split(val, hidden=False)[0])
    other = dict(stats, mean_sequence_tokens=stats["mean_sequence_tokens"] + 1 / 24)  # one token in 24 sequences
    results = tmp_path / "main.json"
    results.write_text(json.dumps({"data": {"val": stats, "eval": other}}))

    out = _script().main(["--work-dir", str(tmp_path / "work"), "--results", str(results), "--splits", "val", "eval"])
    assert out["val"] == {"identical": True, "differences": {}, "statistics": stats}
    assert not out["eval"]["identical"] and list(out["eval"]["differences"]) == ["mean_sequence_tokens"]
    assert out["eval"]["differences"]["mean_sequence_tokens"][1] == other["mean_sequence_tokens"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == json.loads(json.dumps(out))  # last line: JSON
