"""MSVConfig.vote_pathway: the weighted vote of a single-chain head as a point MSV_N starts at and learns beyond."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import hf_msv
from helpers.modeling import D, inputs_for, random_answers, select
from hf_msv import MSVCache, MSVConfig, MSVVerifier
from hf_msv.baselines import best_of_n, fit_platt, self_consistency, streaming_weighted_voting, weighted_voting
from hf_msv.modeling_msv import weighted_vote_share
from hf_msv.modeling_probe import ProbeConfig, ProbeVerifier

VOTE = dict(vote_pathway=True, vote_hidden_size=16, vote_threshold=3)


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    kwargs = dict(hidden_size=D, num_attention_heads=4, num_sequences=8, intermediate_size=64, gamma_hidden_size=8)
    return MSVVerifier(MSVConfig(**{**kwargs, **overrides})).eval()


def set_skips(model):
    """Non-zero skip scalars (they initialise to zero), so the online test covers every term of the logit."""
    with torch.no_grad():
        model.vote_skip_weight.copy_(torch.tensor([1.5, 0.3]))
        model.vote_skip_bias.fill_(-0.2)
        if model.config.gamma_skip:
            model.gamma_skip_weight.fill_(2.0)
            model.gamma_skip_bias.fill_(-1.0)


def per_group(inputs, fn, *columns):
    group = inputs["answer_group"].numpy()
    out = np.zeros(len(group))
    for g in np.unique(group):
        m = group == g
        out[m] = fn(*(np.asarray(c)[m] for c in columns))
    return out


# ---- exactness -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("logit_averaging,gamma_skip", [(False, False), (True, True)])
def test_online_scores_equal_offline_forward_with_the_vote_pathway(logit_averaging, gamma_skip):
    model = make(logit_averaging=logit_averaging, num_hidden_layers=2, gamma_skip=gamma_skip, **VOTE)
    set_skips(model)
    answers, inputs = random_answers(seed=13, groups=3, sequences=6, steps=4)
    with torch.no_grad():
        offline = model(**inputs)
        cache, online, share = MSVCache(), torch.empty_like(offline.logits), torch.empty_like(offline.logits)
        ends = inputs["answer_end"]
        for t in sorted(set(ends.tolist())):
            idx = (ends == t).nonzero().squeeze(1)
            out = model(**select(inputs, idx), past_key_values=cache, use_cache=True)
            online[idx], share[idx] = out.logits, out.vote_share
    assert cache.num_answers == len(answers) and len(cache.answers["vote_logit"]) == len(answers)
    assert (online - offline.logits).abs().max() <= 1e-5
    assert (share - offline.vote_share).abs().max() <= 1e-6
    # Several answers are past the threshold, so the shares are real weighted votes, not own probabilities.
    assert not torch.allclose(offline.vote_share, torch.sigmoid(offline.vote_logits))


def test_a_later_answer_never_changes_an_earlier_share():
    model = make(**VOTE)
    _, inputs = random_answers(seed=11, groups=2, sequences=5, steps=3)
    with torch.no_grad():
        before = model(**inputs).vote_share
        latest = int(torch.argmax(inputs["answer_end"]))
        changed = dict(inputs, hidden_states=inputs["hidden_states"].clone())
        changed["hidden_states"][inputs["token_answer"] == latest] += 5.0
        after = model(**changed).vote_share
    earlier = inputs["answer_end"] < inputs["answer_end"][latest]
    assert torch.equal(before[earlier], after[earlier]) and not torch.equal(before, after)


# ---- compatibility ---------------------------------------------------------------------------------------------


def test_checkpoints_without_the_option_load_and_score_bit_identically(tmp_path):
    """A config without the vote keys (every checkpoint saved before they existed) builds the paper's modules, loads
    with nothing missing or unexpected and scores bit-identically; the shipped testbed verifier loads cleanly too."""
    from pathlib import Path

    assert MSVConfig().vote_pathway is False
    model = make(gamma_skip=True)
    assert not any(name.startswith("vote_") for name, _ in model.named_parameters())
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in [k for k in config if k.startswith("vote_")]:
        config.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, inputs = random_answers(seed=31)
    loaded, info = MSVVerifier.from_pretrained(tmp_path, output_loading_info=True)
    assert loaded.config.vote_pathway is False and not any(info.values()), info
    with torch.no_grad():
        first, again = model(**inputs), loaded(**inputs)
    assert torch.equal(first.logits, again.logits) and again.vote_share is None
    shipped = Path(hf_msv.__file__).parent / "testbed" / "verifier"
    loaded, info = MSVVerifier.from_pretrained(shipped, output_loading_info=True)
    saved = json.loads((shipped / "config.json").read_text()).get("vote_pathway", False)
    assert loaded.config.vote_pathway is saved and not any(info.values()), info


def test_paper_preset_is_the_papers_architecture():
    config = MSVConfig.paper_preset(hidden_size=D, num_attention_heads=4, mode="terminal")
    assert (
        config.num_hidden_layers,
        config.masks,
        config.gamma_skip,
        config.vote_pathway,
        config.logit_averaging,
    ) == (1, ["full", "within_sequence", "equivalence", "within_answer"], False, False, True)
    with pytest.raises(ValueError, match="paper_preset fixes"):
        MSVConfig.paper_preset(vote_pathway=True)


def test_remote_code_with_the_vote_pathway_loads_without_hf_msv_installed(tmp_path):
    model = make(**VOTE)
    set_skips(model)
    model.save_pretrained(tmp_path / "model")
    _, inputs = random_answers(seed=5)
    torch.save(inputs, tmp_path / "inputs.pt")
    with torch.no_grad():
        expected = model(**inputs).logits
    script = (
        "import sys, torch; sys.modules['hf_msv'] = None\n"
        "from transformers import AutoModel\n"
        f"m = AutoModel.from_pretrained({str(tmp_path / 'model')!r}, trust_remote_code=True).eval()\n"
        f"torch.save(m(**torch.load({str(tmp_path / 'inputs.pt')!r})).logits.detach(), 'out.pt')\n"
        "print(type(m).__module__)\n"
    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "hf_msv" not in result.stdout
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected)


def test_bad_vote_settings_and_calls_are_named():
    with pytest.raises(Exception, match="vote_threshold"):  # transformers wraps it in its validation error
        MSVConfig(vote_threshold=-1)
    with pytest.raises(Exception, match="vote_hidden_act"):
        MSVConfig(vote_hidden_act="nope")
    with pytest.raises(ValueError, match="vote_pathway"):
        make().anchor_to_weighted_vote(1.0, 0.0)
    probe = ProbeVerifier(ProbeConfig(hidden_size=D, intermediate_size=32))
    with pytest.raises(ValueError, match="vote_hidden_size"):
        make(**VOTE).load_vote_head_from_probe(probe)


# ---- the weighted vote it represents ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["terminal", "streaming"])
def test_anchored_output_is_the_calibrated_weighted_vote_of_its_probe(mode):
    """Loaded with a Probe and anchored at (a, b), the verifier outputs σ(a·WV + b) for every answer, WV the
    evaluation's (streaming: causal, with its threshold R) weighted vote of that Probe's probabilities, so best-of-N
    picks Probe+WV's answer; the head and the vote skip still get gradients."""
    terminal = mode == "terminal"
    model = make(mode=mode, gamma_skip=True, vote_pathway=True, vote_hidden_size=32, vote_threshold=3)
    torch.manual_seed(7)
    probe = ProbeVerifier(ProbeConfig(hidden_size=D, intermediate_size=32)).eval()
    model.load_vote_head_from_probe(probe)
    model.anchor_to_weighted_vote(4.0, -1.5)
    answers, inputs = random_answers(seed=3, groups=3, sequences=8, terminal=terminal)
    out = model(**inputs, labels=torch.randint(0, 2, (len(answers),)).float())
    with torch.no_grad():
        p = probe(inputs["hidden_states"], inputs["token_answer"]).probabilities.numpy()
    klass, end = inputs["answer_class"].numpy(), inputs["answer_end"].numpy()
    expected = (
        per_group(inputs, weighted_voting, p, klass)
        if terminal
        else per_group(inputs, lambda *c: streaming_weighted_voting(*c, R=3), p, klass, end)
    )
    np.testing.assert_allclose(torch.sigmoid(out.vote_logits).detach().numpy(), p, atol=1e-6)
    np.testing.assert_allclose(out.vote_share.detach().numpy(), expected, atol=1e-6)
    torch.testing.assert_close(out.logits, 4.0 * out.vote_share - 1.5)
    scores = out.logits.detach().numpy()
    assert all(
        best_of_n(scores[inputs["answer_group"] == g]) == best_of_n(expected[inputs["answer_group"] == g])
        for g in range(3)
    )
    out.loss.backward()
    assert model.head.weight.grad.abs().sum() > 0 and model.vote_skip_weight.grad.abs().sum() > 0


def test_share_of_a_group_without_mass_is_zero_with_finite_gradients():
    probs = torch.zeros(4, requires_grad=True)
    share = weighted_vote_share(
        probs, torch.zeros(4, dtype=torch.long), torch.arange(4), torch.tensor([0, 0, 1, 1]), streaming=False
    )
    share.sum().backward()
    assert torch.equal(share.detach(), torch.zeros(4)) and torch.isfinite(probs.grad).all()


# ---- learning --------------------------------------------------------------------------------------------------

N, WIDTH = 8, 16


def hard_groups(num_groups, seed):
    """Terminal groups where the majority is often wrong (wrong chains favour one distractor class) and every chain
    carries a noisy correctness signal, shifted by an offset shared by its group (a problem-level nuisance)."""
    g = torch.Generator().manual_seed(seed)
    answers, hidden = [], []
    for group in range(num_groups):
        p = float(torch.rand(1, generator=g)) * 0.6 + 0.15
        offset = float(torch.randn(1, generator=g)) * 2.0
        names = torch.randperm(4, generator=g)
        for seq in range(N):
            correct = bool(torch.rand(1, generator=g) < p)
            klass = (
                0
                if correct
                else 1
                if torch.rand(1, generator=g) < 0.7
                else int(torch.randint(2, 4, (1,), generator=g))
            )
            h = torch.randn(1, WIDTH, generator=g)
            h[0, 0] += (1.0 if correct else -1.0) + offset
            hidden.append(h)
            answers.append(
                dict(group=group, sequence=seq, step=0, end=1, length=1, klass=int(names[klass]), label=float(correct))
            )
    inputs = inputs_for(answers, torch.cat(hidden), torch.arange(len(answers)))
    return inputs, torch.tensor([a["label"] for a in answers])


def best_of_n_accuracy(inputs, labels, scores):
    group = inputs["answer_group"].numpy()
    return float(np.mean([labels.numpy()[group == g][best_of_n(scores[group == g])] for g in np.unique(group)]))


def test_msv_with_the_vote_pathway_beats_the_vote_and_probe_weighted_voting():
    """Probe trained on single chains → loaded into the vote pathway → anchored at Platt(Probe+WV) → 150 steps on
    groups. On held-out groups it beats both the vote and Probe+WV in best-of-N accuracy and Brier."""
    torch.set_num_threads(1)
    train, y_train = hard_groups(128, seed=0)
    test, y_test = hard_groups(200, seed=1)
    torch.manual_seed(0)
    probe = ProbeVerifier(ProbeConfig(hidden_size=WIDTH, intermediate_size=32))
    optimizer = torch.optim.AdamW(probe.parameters(), lr=3e-3, weight_decay=0.01)
    for _ in range(100):
        loss = probe(train["hidden_states"], train["token_answer"], labels=y_train).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        p_train, p_test = (probe(x["hidden_states"], x["token_answer"]).probabilities.numpy() for x in (train, test))
    klass = lambda x: x["answer_class"].numpy()
    probe_wv = per_group(test, weighted_voting, p_test, klass(test))
    vote = per_group(test, self_consistency, klass(test))

    model = make(hidden_size=WIDTH, mode="terminal", num_sequences=N, vote_pathway=True, vote_hidden_size=32).train()
    model.load_vote_head_from_probe(probe)
    model.anchor_to_weighted_vote(*fit_platt(per_group(train, weighted_voting, p_train, klass(train)), y_train))
    optimizer = torch.optim.AdamW(model.parameter_groups(lr=1e-4, embedding_lr=1e-4, vote_lr=1e-3), weight_decay=0.01)
    for _ in range(150):
        loss = model(**train, labels=y_train).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        msv = model.eval()(**test).probabilities.numpy()

    accuracy = {
        name: best_of_n_accuracy(test, y_test, s) for name, s in (("msv", msv), ("probe_wv", probe_wv), ("vote", vote))
    }
    brier = {
        name: float(np.mean((s - y_test.numpy()) ** 2))
        for name, s in (("msv", msv), ("probe_wv", probe_wv), ("vote", vote))
    }
    print(accuracy, brier)
    assert accuracy["msv"] >= max(accuracy["probe_wv"], accuracy["vote"]) + 0.03, accuracy
    assert brier["msv"] <= 0.85 * min(brier["probe_wv"], brier["vote"]), brier
