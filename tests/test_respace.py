"""``hf-msv respace``: an unspaced collection respaced equals the same chains collected with the spacing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.cli import run_command
from helpers.collect import run_collect
from hf_msv.collect import RespaceConfig, respace_collection, respace_problem
from hf_msv.data import ShardDataset, collection_elicitation, list_shards, read_shard
from hf_msv.elicitation import ElicitationSettings
from hf_msv.errors import UserError

GAP = 5


def problems_by_id(directory) -> dict:
    return {p.problem_id: p for f in list_shards(directory) for p in read_shard(f)[0]}


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    """The same three problems collected unspaced and spaced (every 2 tokens, gap 5), and the unspaced one
    respaced."""
    root = tmp_path_factory.mktemp("respace")
    run_collect(root / "plain", num_problems=3, delimiters=[], every_k_tokens=2)
    run_collect(root / "spaced", num_problems=3, delimiters=[], every_k_tokens=2, min_gap_tokens=GAP)
    result = respace_collection(RespaceConfig(str(root / "plain"), str(root / "derived"), GAP))
    return root, result


def test_respaced_collection_equals_the_spaced_collection(collections):
    root, result = collections
    live, derived = problems_by_id(root / "spaced"), problems_by_id(root / "derived")
    assert sorted(live) == sorted(derived) and result.problems == 3
    assert result.answers_after == sum(p.num_answers for p in live.values()) < result.answers_before
    for pid, want in live.items():
        got = derived[pid]
        for name in ("answer_tau", "answer_step", "answer_sequence", "answer_end", "answer_terminal", "token_ids"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        assert got.answer_text == want.answer_text and got.answer_trigger == want.answer_trigger
        torch.testing.assert_close(got.hidden_states.float(), want.hidden_states.float(), atol=2e-2, rtol=0)
    settings = [
        collection_elicitation(json.loads((root / d / "collect_config.json").read_text()))
        for d in ("spaced", "derived")
    ]
    assert settings[0] == settings[1] and settings[1].min_gap_tokens == GAP
    assert collection_elicitation(read_shard(list_shards(root / "derived")[0])[1]).min_gap_tokens == GAP
    assert len(ShardDataset(root / "derived")) == 3  # readable as training data, index included


def test_terminal_answer_at_a_skipped_delimiter_is_kept_and_counted(collections):
    """Every-K answers at the budget are the budget answer (compared above); a delimiter one there is kept, counted."""
    root, _ = collections
    problem = next(iter(problems_by_id(root / "plain").values()))
    # One chain cut by the budget at a delimiter just after its previous answer (the every-K steps stand in for it).
    n = int(problem.answer_sequence[problem.answer_terminal & (np.array(problem.answer_trigger) == "every_k")][0])
    rows = np.flatnonzero(problem.answer_sequence == n)
    last = rows[np.argmax(problem.answer_tau[rows])]
    assert problem.answer_tau[last] - np.sort(problem.answer_tau[rows])[-2] < GAP
    problem.answer_trigger[last] = "delimiter"
    settings = ElicitationSettings(delimiters=(), every_k_tokens=2, min_gap_tokens=GAP)
    respaced, early = respace_problem(problem, settings)
    terminal = np.flatnonzero((respaced.answer_sequence == n) & respaced.answer_terminal)
    assert early == 1 and len(terminal) == 1 and respaced.answer_trigger[terminal[0]] == "delimiter"


def test_refusals_write_nothing(collections, tmp_path):
    root, _ = collections
    cases = [
        (RespaceConfig(str(root / "spaced"), str(tmp_path / "a"), 10), "already spaced"),
        (RespaceConfig(str(root / "plain"), str(tmp_path / "b"), 0), "at least 1"),
        (RespaceConfig(str(tmp_path / "missing"), str(tmp_path / "c"), 5), "no collection"),
        (RespaceConfig(str(root / "plain"), str(root / "plain"), 5), "must differ"),
        (RespaceConfig(str(root / "plain"), str(root / "derived"), 5), "not empty"),
    ]
    for config, message in cases:
        with pytest.raises(UserError, match=message):
            respace_collection(config)
    assert not any((tmp_path / d).exists() for d in "abc")


def test_cli_prints_the_result(collections, tmp_path, capsys):
    root, _ = collections
    argv = ["respace", "--source", str(root / "plain"), "--output-dir", str(tmp_path / "out"), "--min-gap-tokens", "9"]
    code, out, _ = run_command(argv, capsys)
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert result["problems"] == 3 and result["answers_after"] < result["answers_before"]
    code, _, err = run_command(argv, capsys)
    assert code == 2 and "not empty" in err
