"""Tests of hf_msv.data (shards, dataset, groups): the shard format (bit-exact 16-bit round trip, complete metadata,
atomic writes), the lazy group dataset, fixed groups, and the collate function, whose masks and γ must agree with the
verifier's own construction."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from helpers.shards import D, make_problem, write_dataset
from hf_msv import MSVConfig, MSVVerifier, build_masks, compute_gamma
from hf_msv.data import (
    VERIFIER_INPUTS,
    CollectedProblem,
    ShardDataset,
    answer_group,
    collate_groups,
    list_shards,
    read_shard,
    write_shard,
)
from hf_msv.evaluation import deepconf_scores, token_prob_scores

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------------------------------------------
# Format
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_round_trip_is_bit_exact_and_complete(tmp_path, dtype):
    problems = [make_problem("a/1", seed=1), make_problem("b/ü", num_sequences=3, seed=2)]
    problems[1].answer_text[0] = "\\frac{1}{2} — ünïcode"
    info = {"lm_name_or_path": "x", "delimiters": ["Wait"]}
    path = write_shard(tmp_path / "shard-r000-00000.safetensors", problems, info, dtype=dtype)
    back, back_info = read_shard(path)
    assert back_info == info
    target = getattr(torch, dtype)
    for p, q in zip(problems, back):
        assert q.hidden_states.dtype == target
        # Bit-exact: the stored bits are exactly those of the 16-bit cast.
        assert torch.equal(q.hidden_states.view(torch.int16), p.hidden_states.to(target).view(torch.int16))
        for name in (
            "problem_id",
            "gold",
            "source",
            "question",
            "answer_text",
            "answer_raw_text",
            "answer_trigger",
            "sequence_finish",
        ):
            assert getattr(q, name) == getattr(p, name), name
        for name in (
            "token_ids",
            "token_logprobs",
            "answer_sequence",
            "answer_step",
            "answer_tau",
            "answer_length",
            "answer_class",
            "answer_terminal",
            "answer_correct",
            "sequence_length",
        ):
            np.testing.assert_array_equal(getattr(q, name), getattr(p, name), err_msg=name)
        assert len(q.cot_confidence) == p.num_sequences
        for a, b in zip(p.cot_confidence, q.cot_confidence):
            np.testing.assert_array_equal(a, b)
        assert [t.tolist() for t in q.cot_token_ids] == [t.tolist() for t in p.cot_token_ids]
        assert None in q.answer_text or p.answer_text.count(None) == 0
    # No temporaries left behind, and the file is readable by others.
    assert sorted(f.name for f in tmp_path.iterdir()) == ["shard-r000-00000.safetensors"]
    assert path.stat().st_mode & 0o044 == 0o044


def test_problem_without_confidence_and_answer_group(tmp_path):
    p = make_problem("x", seed=3)
    p.cot_confidence = []
    q = make_problem("y", seed=4)
    write_shard(tmp_path / "shard-r000-00000.safetensors", [p, q])
    back, _ = read_shard(tmp_path / "shard-r000-00000.safetensors", hidden=False)
    assert back[0].hidden_states is None
    assert all(len(c) == 0 for c in back[0].cot_confidence)
    for a, b in zip(q.cot_confidence, back[1].cot_confidence):  # the neighbour's slices are unaffected
        np.testing.assert_array_equal(a, b)
    # Baseline scores from the stored signals.
    expected = np.array(
        [np.exp(q.token_logprobs[a : a + n].mean()) for a, n in zip(q.answer_token_start, q.answer_length)]
    )
    np.testing.assert_allclose(token_prob_scores(back[1]), expected, rtol=1e-6)
    assert deepconf_scores(back[1], window=4).shape == (q.num_answers,)
    group = answer_group(back[1])
    assert group.num_answers == q.num_answers and group.num_sequences == q.num_sequences
    np.testing.assert_array_equal(group.end, q.answer_tau + q.answer_length)


def test_cot_token_ids_and_confidences_are_unknown_independently(tmp_path):
    no_ids, no_conf, both = make_problem("x", seed=3), make_problem("y", seed=4), make_problem("z", seed=5)
    no_ids.cot_token_ids, no_conf.cot_confidence = [], []
    path = write_shard(tmp_path / "shard-r000-00000.safetensors", [no_ids, no_conf, both])
    back, _ = read_shard(path, hidden=False)
    assert back[0].cot_token_ids == [] and back[1].cot_confidence == []
    for p, q in zip([no_ids, no_conf, both], back):  # every known slice lands on its own problem and sequence
        for name in ("cot_token_ids", "cot_confidence"):
            assert [a.tolist() for a in getattr(p, name)] == [b.tolist() for b in getattr(q, name)], name
    ds = ShardDataset(path)
    assert ds.read_problem(2).cot_token_ids[1].tolist() == both.cot_token_ids[1].tolist()
    assert ds.read_problem(0).question == "What is x?"


def test_shards_written_before_cot_token_ids_still_read(tmp_path):
    """A shard as written before CoT token ids and questions were kept (no such tensors and no metadata key)
    reads with both unknown; everything else is unchanged."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    p = make_problem("old", seed=6)
    path = write_shard(tmp_path / "shard-r000-00000.safetensors", [p])
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["hf_msv"])
    for name in ("cot_token_ids", "sequence_cot_token_start"):
        del tensors[name]
    del meta["problem_question"]
    save_file(tensors, str(path), metadata={"hf_msv": json.dumps(meta, sort_keys=True)})
    (q,), _ = read_shard(path)
    assert q.cot_token_ids == [] and q.question == ""
    assert [c.tolist() for c in q.cot_confidence] == [c.tolist() for c in p.cot_confidence]
    np.testing.assert_array_equal(q.answer_tau, p.answer_tau)
    assert ShardDataset(path).read_problem(0).cot_token_ids == []


def test_cot_token_ids_need_one_array_of_sequence_length_per_sequence():
    p = make_problem("x", seed=7)
    with pytest.raises(ValueError, match="cot_token_ids"):
        CollectedProblem(**{**p.__dict__, "cot_token_ids": p.cot_token_ids[:-1]})
    short = [t[:-1] for t in p.cot_token_ids]
    with pytest.raises(ValueError, match="cot_token_ids"):
        CollectedProblem(**{**p.__dict__, "cot_token_ids": short})


def test_availability_steps_round_trip_and_default_to_tau_plus_length(tmp_path):
    """`answer_end` (the step an answer became available) is stored; shards written before it existed read as
    τ + L, and every reader (records, lazy columns, groups, verifier items) uses the stored value."""
    p = make_problem("x", seed=5)
    p.answer_end = p.answer_tau + 7 + p.answer_length  # e.g. a 7-token elicitation prompt fed one per step
    path = write_shard(tmp_path / "shard-r000-00000.safetensors", [p])
    (back,), _ = read_shard(path, hidden=False)
    np.testing.assert_array_equal(back.answer_end, p.answer_end)
    dataset = ShardDataset(tmp_path)
    np.testing.assert_array_equal(dataset.answer_columns(0).answer_end, p.answer_end)
    np.testing.assert_array_equal(answer_group(dataset.answer_columns(0)).end, p.answer_end)
    item = dataset.group(0, np.arange(p.num_sequences), "streaming")
    np.testing.assert_array_equal(item["answer_end"].numpy(), p.answer_end)
    # An older shard: the column is absent.
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "answer_end"}  # noqa: SIM118  (not iterable)
        metadata = f.metadata()
    save_file(tensors, str(path), metadata=metadata)
    (old,), _ = read_shard(path, hidden=False)
    np.testing.assert_array_equal(old.answer_end, p.answer_tau + p.answer_length)
    np.testing.assert_array_equal(ShardDataset(tmp_path).answer_columns(0).answer_end, p.answer_tau + p.answer_length)


def test_failed_write_leaves_no_visible_shard(tmp_path, monkeypatch):
    import hf_msv.data.shards as shards

    def broken(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(shards, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        write_shard(tmp_path / "shard-r000-00000.safetensors", [make_problem("x")])
    assert list_shards(tmp_path) == []


# ----------------------------------------------------------------------------------------------------------------
# Dataset
# ----------------------------------------------------------------------------------------------------------------


def test_partition_groups_cover_every_sequence_once_per_epoch(tmp_path):
    problems = write_dataset(tmp_path, num_problems=3, num_sequences=6)
    ds = ShardDataset(tmp_path, num_sequences=2, mode="streaming", seed=5)
    assert len(ds) == 3 * 3 and ds.num_problems == 3 and ds.hidden_size == D
    assert "hidden_states" not in ds.shards[0].arrays  # only metadata is held in memory

    def draws(epoch):
        ds.set_epoch(epoch)
        return [tuple(ds.sequences_of(i)[1]) for i in range(len(ds))]

    first = draws(0)
    for p in range(3):
        chosen = sorted(s for g in first[3 * p : 3 * p + 3] for s in g)
        assert chosen == list(range(6))
    assert draws(0) == first and draws(1) != first
    # Items carry exactly the chosen sequences' answers, renumbered in draw order, with their stored tokens.
    ds.set_epoch(0)
    for i in range(len(ds)):
        p, chosen = ds.sequences_of(i)
        item, src = ds[i], problems[p]
        rows = np.flatnonzero(np.isin(src.answer_sequence, chosen))
        assert item["problem_id"] == src.problem_id
        np.testing.assert_array_equal(item["answer_tau"].numpy(), src.answer_tau[rows])
        mapping = {int(s): j for j, s in enumerate(chosen)}
        assert item["answer_sequence"].tolist() == [mapping[int(s)] for s in src.answer_sequence[rows]]
        expected = torch.cat(
            [src.hidden_states[a : a + n] for a, n in zip(src.answer_token_start[rows], src.answer_length[rows])]
        ).bfloat16()
        assert torch.equal(item["hidden_states"], expected)
        np.testing.assert_array_equal(item["labels"].numpy(), src.answer_correct[rows].astype(np.float32))


def test_terminal_mode_and_random_subsets(tmp_path):
    write_dataset(tmp_path, num_problems=2, num_sequences=6)
    ds = ShardDataset(tmp_path, num_sequences=4, mode="terminal", groups_per_problem=3)
    assert len(ds) == 6
    for i in range(len(ds)):
        item = ds[i]
        assert item["answer_terminal"].all() and len(item["answer_length"]) == 4
        assert sorted(item["answer_sequence"].tolist()) == [0, 1, 2, 3]
        assert (item["answer_step"] == 0).all()
    with pytest.raises(ValueError, match="num_sequences"):
        ShardDataset(tmp_path, num_sequences=7)
    # Pickles without open file handles (DataLoader workers reopen lazily).
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[1]["hidden_states"], ds[1]["hidden_states"])
    loader = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=collate_groups, num_workers=0)
    assert sum(len(b["problem_id"]) for b in loader) == 6


def test_max_problems_keeps_a_prefix_in_shard_order(tmp_path):
    problems = write_dataset(tmp_path, num_problems=5, per_shard=2, num_sequences=6)
    ds = ShardDataset(tmp_path, num_sequences=3, mode="terminal", max_problems=3)
    assert ds.problem_ids == ["q0", "q1", "q2"] and len(ds) == 3 * 2
    stats = ds.stats()
    kept = problems[:3]
    assert stats["problems"] == 3 and stats["sequences"] == 18
    assert stats["answers"] == sum(len(p.answer_text) for p in kept)
    terminal = np.concatenate([p.answer_correct[p.answer_terminal] for p in kept])
    assert stats["terminal_answers"] == terminal.size and stats["terminal_accuracy"] == terminal.mean()
    for bad in (0, 6):
        with pytest.raises(ValueError, match="max_problems"):
            ShardDataset(tmp_path, max_problems=bad)


def test_subset_selects_problems_and_reads_them_like_the_parent(tmp_path):
    """Cross-validation folds: a subset keeps the chosen problems (in the order given), their groups and their
    classes re-derived by a checker, reads the same answers as the parent, and leaves the parent untouched."""
    write_dataset(tmp_path, num_problems=5, per_shard=2, num_sequences=6)
    parent = ShardDataset(tmp_path, num_sequences=3, mode="terminal", checker="exact")
    sub = parent.subset([3, 0])
    assert sub.problem_ids == ["q3", "q0"] and len(sub) == 2 * 2 and sub.num_problems == 2
    assert parent.problem_ids == [f"q{i}" for i in range(5)] and len(parent) == 5 * 2
    for p_sub, p_parent in ((0, 3), (1, 0)):
        a, b = sub.read_problem(p_sub), parent.read_problem(p_parent)
        assert a.problem_id == b.problem_id and list(a.answer_text) == list(b.answer_text)
        np.testing.assert_array_equal(a.answer_class, b.answer_class)
        ids = np.arange(3)
        ga, gb = sub.group(p_sub, ids), parent.group(p_parent, ids)
        assert torch.equal(ga["hidden_states"], gb["hidden_states"]) and torch.equal(ga["labels"], gb["labels"])
    assert sub.stats()["problems"] == 2 and sub[3]["problem_id"] == "q0"
    for bad in ([], [5], [-1]):
        with pytest.raises(ValueError, match="subset"):
            parent.subset(bad)


@pytest.mark.parametrize("mode", ["terminal", "streaming"])
def test_preloaded_hidden_states_give_the_same_items_as_memory_mapped_reads(tmp_path, monkeypatch, mode):
    """Preloading (the default for small datasets) only changes where rows are read from: every item, subset and
    pickled copy reads exactly what the memory-mapped reader reads; above `PRELOAD_BYTES` the dataset stays lazy."""
    import hf_msv.data.dataset as dataset_module

    write_dataset(tmp_path, num_problems=5, per_shard=2, num_sequences=6)
    lazy = ShardDataset(tmp_path, num_sequences=3, mode=mode, preload=False)
    auto = ShardDataset(tmp_path, num_sequences=3, mode=mode)
    assert auto.preload and not lazy.preload
    for epoch in (0, 1):
        lazy.set_epoch(epoch), auto.set_epoch(epoch)
        for i in range(len(lazy)):
            a, b = lazy[i], auto[i]
            assert a.keys() == b.keys() and a["hidden_states"].dtype == b["hidden_states"].dtype
            assert all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)
    assert not lazy._loaded and len(auto._loaded) == len(auto.files)  # each shard read whole, once
    sub = auto.subset([4, 1])  # cross-validation folds share what the parent has read
    assert sub._loaded is auto._loaded and torch.equal(
        sub.group(0, np.arange(3))["hidden_states"], lazy.group(4, np.arange(3))["hidden_states"]
    )
    clone = pickle.loads(pickle.dumps(auto))  # a spawned DataLoader worker reloads rather than receiving a copy
    assert clone.preload and not clone._loaded and torch.equal(clone[0]["hidden_states"], auto[0]["hidden_states"])
    monkeypatch.setattr(dataset_module, "PRELOAD_BYTES", 0)
    assert not ShardDataset(tmp_path, num_sequences=3, mode=mode).preload


def test_duplicate_problem_across_shards_is_refused(tmp_path):
    write_shard(tmp_path / "shard-r000-00000.safetensors", [make_problem("same")])
    write_shard(tmp_path / "shard-r001-00000.safetensors", [make_problem("same", seed=9)])
    with pytest.raises(ValueError, match="appears in both"):
        ShardDataset(tmp_path)


def test_checker_rederives_classes_but_keeps_labels(tmp_path):
    problems = write_dataset(tmp_path, num_problems=2)
    stored = ShardDataset(tmp_path, num_sequences=6)
    exact = ShardDataset(tmp_path, num_sequences=6, checker="exact")
    coin = ShardDataset(tmp_path, num_sequences=6, checker="random", checker_kwargs={"probability": 0.5, "seed": 1})
    for p, src in enumerate(problems):
        # The synthetic classes are online assignment of the texts: the exact checker finds the same partition.
        a, b = stored.read_problem(p).answer_class, exact.read_problem(p).answer_class
        assert len({(x, y) for x, y in zip(a, b)}) == len(set(a)) == len(set(b))
        np.testing.assert_array_equal(coin.read_problem(p).answer_correct, src.answer_correct)
    assert any(
        not np.array_equal(stored.read_problem(p).answer_class, coin.read_problem(p).answer_class) for p in range(2)
    )
    for i in range(len(stored)):
        assert torch.equal(stored[i]["labels"], coin[i]["labels"])


# ----------------------------------------------------------------------------------------------------------------
# Collate: packing, masks and γ agree with the verifier
# ----------------------------------------------------------------------------------------------------------------


def reference_relations(items, mode):
    """Brute-force answer-level relations from the un-packed items: for each pair of answers (by identity
    (group, original row)) whether they share group / sequence / class / answer and whether key ends no later."""
    answers = []
    for g, item in enumerate(items):
        for r in range(len(item["answer_length"])):
            if mode == "terminal" and not item["answer_terminal"][r]:
                continue
            answers.append(
                (g, int(item["answer_sequence"][r]), int(item["answer_class"][r]), int(item["answer_end"][r]), r)
            )
    return answers


@pytest.mark.parametrize("mode", ["streaming", "terminal"])
def test_collate_masks_and_gamma_agree_with_the_verifier(tmp_path, mode):
    write_dataset(tmp_path, num_problems=3, num_sequences=6)
    ds = ShardDataset(tmp_path, num_sequences=3, mode=mode, seed=2)
    items = [ds[i] for i in (0, 2, 5)]
    batch = collate_groups(items, mode)

    # Packing: groups in order, answers within a group by end time, each answer's tokens contiguous.
    group, end = batch["answer_group"], batch["answer_end"]
    assert (group[1:] >= group[:-1]).all()
    same = group[1:] == group[:-1]
    assert (end[1:][same] >= end[:-1][same]).all()
    ta = batch["token_answer"]
    assert (ta[1:] >= ta[:-1]).all() and torch.equal(torch.bincount(ta), batch["answer_length"])
    if mode == "terminal":
        assert batch["answer_terminal"].all() and (batch["answer_step"] == 0).all()

    # Every packed answer maps back to one original answer; its tokens are that answer's hidden states.
    reference = reference_relations(items, mode)
    assert len(reference) == len(group)
    ident = []
    offsets = [torch.cumsum(it["answer_length"], 0) - it["answer_length"] for it in items]
    token_start = torch.cumsum(batch["answer_length"], 0) - batch["answer_length"]
    for a in range(len(group)):
        g = int(group[a])
        cands = [
            r
            for (gg, s, c, e, r) in reference
            if gg == g
            and s == int(batch["answer_sequence"][a])
            and e == int(end[a])
            and c == int(batch["answer_class"][a])
        ]
        assert len(cands) >= 1
        r = (
            cands[0]
            if len(cands) == 1
            else next(r for r in cands if int(items[g]["answer_tau"][r]) == int(batch["answer_tau"][a]))
        )
        ident.append((g, r))
        n, s = int(batch["answer_length"][a]), int(token_start[a])
        o = int(offsets[g][r])
        assert torch.equal(batch["hidden_states"][s : s + n], items[g]["hidden_states"][o : o + n])
    assert len(set(ident)) == len(ident)

    # Masks the verifier builds from the collated metadata == the definitions on the original answers.
    meta = torch.stack([group, batch["answer_sequence"], torch.arange(len(group)), batch["answer_class"], end])[:, ta]
    masks = build_masks(["full", "within_sequence", "equivalence", "within_answer"], meta, meta, mode == "streaming")
    info = {a: next(x for x in reference if (x[0], x[4]) == ident[a]) for a in range(len(group))}
    for u in range(len(ta)):
        for v in range(len(ta)):
            qa, ka = info[int(ta[u])], info[int(ta[v])]
            allowed = qa[0] == ka[0] and (mode == "terminal" or ka[3] <= qa[3])
            expected = [
                allowed,
                allowed and qa[1] == ka[1],
                allowed and qa[2] == ka[2],
                allowed and (qa[0], qa[4]) == (ka[0], ka[4]),
            ]
            assert masks[:, u, v].tolist() == expected

    # γ from collate == γ the verifier computes itself; batched scores == per-group scores.
    torch.manual_seed(0)
    verifier = MSVVerifier(
        MSVConfig(
            hidden_size=D,
            num_attention_heads=2,
            intermediate_size=32,
            num_sequences=3,
            mode=mode,
            gamma_hidden_size=8,
            attention_backend="dense",
        )
    ).eval()
    with torch.no_grad():
        given = verifier(**{k: batch[k] for k in VERIFIER_INPUTS})
        own = verifier(**{k: batch[k] for k in VERIFIER_INPUTS if k != "gamma"})
        torch.testing.assert_close(given.gamma, own.gamma, rtol=0, atol=0)
        torch.testing.assert_close(given.logits, own.logits)
        torch.testing.assert_close(given.loss, own.loss)
        for g in range(len(items)):
            single = collate_groups([items[g]], mode, gamma=False)
            assert single["gamma"] is None
            alone = verifier(**{k: single[k] for k in VERIFIER_INPUTS})
            torch.testing.assert_close(alone.logits, own.logits[group == g], rtol=1e-5, atol=1e-5)
    # The γ definition itself, on the first group: fraction of sequences whose latest completed answer agrees.
    g0 = group == 0
    seq, cls, step = batch["answer_sequence"][g0], batch["answer_class"][g0], batch["answer_step"][g0]
    for a in range(int(g0.sum())):
        done = (end[g0] <= end[g0][a]) if mode == "streaming" else torch.ones_like(seq, dtype=torch.bool)
        latest = {}
        for b in torch.nonzero(done).squeeze(1).tolist():
            if int(seq[b]) not in latest or step[b] > step[latest[int(seq[b])]]:
                latest[int(seq[b])] = b
        expect = sum(int(cls[b]) == int(cls[a]) for b in latest.values()) / len(latest)
        assert abs(float(batch["gamma"][g0][a]) - expect) < 1e-6


def test_collate_matches_compute_gamma_and_handles_many_groups(tmp_path):
    write_dataset(tmp_path, num_problems=4, num_sequences=6)
    ds = ShardDataset(tmp_path, num_sequences=6)
    batch = collate_groups([ds[i] for i in range(len(ds))])
    expected = compute_gamma(
        batch["answer_group"],
        batch["answer_sequence"],
        batch["answer_step"],
        batch["answer_end"],
        batch["answer_class"],
        True,
    )
    assert torch.equal(batch["gamma"], expected)
    assert batch["problem_id"] == ds.problem_ids


def test_fixed_groups_read_like_records_and_items(tmp_path):
    """`ShardDataset.group` (lazy, from the shard) and `read_group` on a record read with its hidden states give the
    same item; training items are such groups; `answer_groups` equals `answer_group` of each record."""
    from hf_msv.data import read_group, select_answers

    write_dataset(tmp_path, num_problems=3, num_sequences=6)
    ds = ShardDataset(tmp_path, num_sequences=2, mode="streaming", seed=5)
    records = ds.read_problems(hidden=True)
    for p, record in enumerate(records):
        for mode in ("terminal", "streaming"):
            chosen = np.array([4, 1, 3])
            lazy, eager = ds.group(p, chosen, mode), read_group(record, record.hidden_states, chosen, mode)
            assert lazy.keys() == eager.keys()
            for key, value in lazy.items():
                assert value == eager[key] if key == "problem_id" else torch.equal(value, eager[key]), key
            rows, seq = select_answers(record, chosen, mode)
            assert lazy["answer_index"].tolist() == rows.tolist() and lazy["answer_sequence"].tolist() == seq.tolist()
        assert ds.answer_groups()[p].end.tolist() == answer_group(record).end.tolist()
    p, chosen = ds.sequences_of(4)
    item = ds[4]
    for key, value in ds.group(p, chosen).items():
        assert value == item[key] if key == "problem_id" else torch.equal(value, item[key]), key
    batch = collate_groups([ds[i] for i in range(len(ds))])
    assert len(batch["answer_index"]) == len(batch["answer_group"])
