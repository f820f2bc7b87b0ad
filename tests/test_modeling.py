"""MSVVerifier: masks, attention paths, online cache, invariances, serialisation, clear errors, learning."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, LlamaConfig, LlamaForCausalLM

import hf_msv
from helpers.modeling import D, inputs_for, random_answers, select
from hf_msv import (
    ElicitationSettings,
    MSVCache,
    MSVConfig,
    MSVVerifier,
    build_masks,
    check_compatible,
    compute_gamma,
    split_into_groups,
)
from hf_msv.modeling_msv import GROUP


def make_verifier(seed=0, **overrides):
    torch.manual_seed(seed)
    kwargs = dict(hidden_size=D, num_attention_heads=4, num_sequences=8, intermediate_size=64, gamma_hidden_size=8)
    kwargs.update(overrides)
    return MSVVerifier(MSVConfig(**kwargs)).eval()


def set_gamma_skip(verifier, weight, bias):
    """Non-trivial γ-skip scalars (they initialise to zero), keeping the head as initialised."""
    with torch.no_grad():
        verifier.gamma_skip_weight.fill_(weight)
        verifier.gamma_skip_bias.fill_(bias)


# ---- masks -------------------------------------------------------------------------------------------------------


def hand_built_meta():
    # One group, two sequences. Answers: a0 = (seq 0, step 0, end 3, class 0, 2 tokens),
    # a1 = (seq 0, step 1, end 7, class 1, 1 token), a2 = (seq 1, step 0, end 5, class 0, 1 token).
    answer_of_token = [0, 0, 1, 2]
    seq, klass, end = [0, 0, 1], [0, 1, 0], [3, 7, 5]
    return torch.tensor(
        [
            [0] * 4,
            [seq[a] for a in answer_of_token],
            answer_of_token,
            [klass[a] for a in answer_of_token],
            [end[a] for a in answer_of_token],
        ]
    )


def expand(answer_pairs):
    answer_of_token = [0, 0, 1, 2]
    return torch.tensor(
        [[(answer_of_token[u], answer_of_token[v]) in answer_pairs for v in range(4)] for u in range(4)]
    )


ALL = {(a, b) for a in range(3) for b in range(3)}


@pytest.mark.parametrize("streaming", [False, True])
def test_each_mask_allows_exactly_the_papers_pairs(streaming):
    meta = hand_built_meta()
    masks = build_masks(["full", "within_sequence", "equivalence", "within_answer"], meta, meta, streaming)
    causal = {(a, b) for a, b in ALL if [3, 7, 5][a] >= [3, 7, 5][b]} if streaming else ALL
    expected = {
        "full": ALL,
        "within_sequence": {(0, 0), (0, 1), (1, 0), (1, 1), (2, 2)},
        "equivalence": {(0, 0), (0, 2), (2, 0), (2, 2), (1, 1)},
        "within_answer": {(0, 0), (1, 1), (2, 2)},
    }
    for j, name in enumerate(expected):
        assert torch.equal(masks[j], expand(expected[name] & causal)), name


def test_masks_never_cross_groups():
    meta = hand_built_meta()
    other = meta.clone()
    other[GROUP] = 1
    assert not build_masks(["full", "equivalence"], meta, other, streaming=False).any()


def test_within_sequence_equals_within_answer_in_terminal_mode():
    answers, inputs = random_answers(seed=3, terminal=True)
    meta = torch.stack(
        [
            inputs["answer_group"],
            inputs["answer_sequence"],
            torch.arange(len(answers)),
            inputs["answer_class"],
            inputs["answer_end"],
        ]
    )[:, inputs["token_answer"]]
    ws, wa = build_masks(["within_sequence", "within_answer"], meta, meta, streaming=False)
    assert torch.equal(ws, wa)
    assert MSVConfig(mode="terminal").effective_masks == ["full", "within_sequence", "equivalence"]


# ---- gamma, logit averaging -----------------------------------------------------------------------------------


def test_gamma_uses_latest_completed_answer_of_each_sequence():
    # seq 0: class 0 ends at 2, class 1 ends at 6; seq 1: class 1 ends at 4; seq 2: class 0 ends at 9.
    group, seq, step = torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 0, 0])
    end, klass = torch.tensor([2, 6, 4, 9]), torch.tensor([0, 1, 1, 0])
    gamma = compute_gamma(group, seq, step, end, klass, streaming=True)
    # a0 at t=2: only seq 0 done, latest is a0 itself -> 1. a1 at t=6: seq0->a1 (1), seq1->a2 (1) -> 1.
    # a2 at t=4: seq0->a0 (class 0), seq1->a2 -> 1/2. a3 at t=9: seq0->a1 (1), seq1->a2 (1), seq2->a3 (0) -> 1/3.
    assert torch.allclose(gamma, torch.tensor([1.0, 1.0, 0.5, 1 / 3]))
    terminal = compute_gamma(
        group[[1, 2, 3]], seq[[1, 2, 3]], step[[1, 2, 3]], end[[1, 2, 3]], klass[[1, 2, 3]], streaming=False
    )
    assert torch.allclose(terminal, torch.tensor([2 / 3, 2 / 3, 1 / 3]))


def test_logit_averaging_gives_equal_probabilities_inside_a_class():
    verifier = make_verifier(mode="terminal")
    _, inputs = random_answers(seed=5, terminal=True, classes=2)
    with torch.no_grad():
        probs = verifier(**inputs).probabilities
    for group in (0, 1):
        for klass in (0, 1):
            members = (inputs["answer_group"] == group) & (inputs["answer_class"] == klass)
            if members.sum() > 1:
                assert torch.allclose(probs[members], probs[members][0].expand(int(members.sum())))
    raw = make_verifier(mode="terminal", logit_averaging=False)
    with torch.no_grad():
        assert not torch.allclose(raw(**inputs).probabilities, probs)


@pytest.mark.parametrize("mode", ["terminal", "streaming"])
def test_anchored_verifier_outputs_exactly_platt_of_gamma(mode):
    """`anchor_to_vote` makes the verifier calibrated self-consistency: logit = a·γ + b for every answer (after
    logit averaging too: γ is constant within a terminal class), whatever the hidden states; the head still learns."""
    verifier = make_verifier(mode=mode, gamma_skip=True)
    verifier.anchor_to_vote(1.7, -0.4)
    answers, inputs = random_answers(seed=3, terminal=mode == "terminal")
    out = verifier(**inputs, labels=torch.randint(0, 2, (len(answers),)).float())
    torch.testing.assert_close(out.logits, 1.7 * out.gamma - 0.4)
    out.loss.backward()
    assert verifier.head.weight.grad.abs().sum() > 0 and verifier.gamma_skip_weight.grad is not None
    with pytest.raises(ValueError, match="gamma_skip"):
        make_verifier().anchor_to_vote(1.0, 0.0)


def test_gamma_skip_is_off_by_default_and_old_checkpoints_load_unchanged(tmp_path):
    """A config without the key (every checkpoint saved before it existed) builds the old architecture: no skip
    weights, nothing missing or unexpected when loading; the shipped testbed verifier, saved with the key, loads
    cleanly too."""
    from pathlib import Path

    import hf_msv

    assert MSVConfig().gamma_skip is False and not hasattr(make_verifier(), "gamma_skip_weight")
    verifier = make_verifier()
    verifier.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("gamma_skip")
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, inputs = random_answers(seed=31)
    loaded, info = MSVVerifier.from_pretrained(tmp_path, output_loading_info=True)
    assert loaded.config.gamma_skip is False and not any(info.values()), info
    shipped = Path(hf_msv.__file__).parent / "testbed" / "verifier"
    loaded, info = MSVVerifier.from_pretrained(shipped, output_loading_info=True)
    skip = json.loads((shipped / "config.json").read_text())["gamma_skip"]
    assert loaded.config.gamma_skip is skip and hasattr(loaded, "gamma_skip_weight") == skip and not any(info.values())
    with torch.no_grad():
        torch.testing.assert_close(MSVVerifier.from_pretrained(tmp_path)(**inputs).logits, verifier(**inputs).logits)


# ---- attention paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,readout,layers,skip",
    [
        ("streaming", "last", 1, False),
        ("terminal", "last", 1, False),
        ("streaming", "mean", 2, False),
        ("terminal", "mean", 2, False),
        ("streaming", "last", 1, True),
        ("terminal", "last", 1, True),
    ],
)
def test_chunked_attention_matches_dense_reference_with_gradients(mode, readout, layers, skip):
    answers, inputs = random_answers(seed=7, groups=3, sequences=5, terminal=mode == "terminal")
    labels = torch.randint(0, 2, (len(answers),)).float()
    dense = make_verifier(
        mode=mode, readout=readout, num_hidden_layers=layers, attention_backend="dense", gamma_skip=skip
    )
    if skip:
        set_gamma_skip(dense, 1.5, -0.5)
    # A tiny budget forces many chunks with partial key windows.
    fast = make_verifier(
        mode=mode, readout=readout, num_hidden_layers=layers, attention_chunk_elements=300, gamma_skip=skip
    )
    fast.load_state_dict(dense.state_dict())
    with torch.no_grad():  # non-trivial mixture weights so the mask-mixture gradient is exercised
        for model in (dense, fast):
            for layer in model.layers:
                layer.attn.mask_logits.copy_(
                    torch.linspace(-1, 1, layer.attn.mask_logits.numel()).view_as(layer.attn.mask_logits)
                )
    hidden_dense = inputs["hidden_states"].clone().requires_grad_()
    hidden_fast = inputs["hidden_states"].clone().requires_grad_()
    out_dense = dense(**{**inputs, "hidden_states": hidden_dense}, labels=labels)
    out_fast = fast(**{**inputs, "hidden_states": hidden_fast}, labels=labels)
    torch.testing.assert_close(out_fast.logits, out_dense.logits, atol=1e-5, rtol=1e-5)
    out_dense.loss.backward()
    out_fast.loss.backward()
    torch.testing.assert_close(hidden_fast.grad, hidden_dense.grad, atol=1e-5, rtol=1e-4)
    for (name, p_dense), p_fast in zip(dense.named_parameters(), fast.parameters()):
        torch.testing.assert_close(p_fast.grad, p_dense.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bf16_chunked_path_runs_and_stays_close():
    _, inputs = random_answers(seed=2)
    fp32 = make_verifier()
    bf16 = make_verifier().to(torch.bfloat16)
    with torch.no_grad():
        diff = (bf16(**inputs).probabilities - fp32(**inputs).probabilities).abs().max()
    assert diff < 0.05


# ---- streaming causality and online inference ----------------------------------------------------------------


def test_changing_a_later_answer_never_changes_an_earlier_score():
    verifier = make_verifier()
    _, inputs = random_answers(seed=11)
    with torch.no_grad():
        before = verifier(**inputs).logits
        latest = int(torch.argmax(inputs["answer_end"]))
        changed = dict(
            inputs, hidden_states=inputs["hidden_states"].clone(), answer_class=inputs["answer_class"].clone()
        )
        changed["hidden_states"][inputs["token_answer"] == latest] += 5.0
        changed["answer_class"][latest] = 99
        after = verifier(**changed).logits
    earlier = inputs["answer_end"] < inputs["answer_end"][latest]
    assert torch.equal(before[earlier], after[earlier])
    assert not torch.equal(before[latest], after[latest])


@pytest.mark.parametrize(
    "logit_averaging,skip,layers",
    [(False, False, 2), (True, False, 2), (False, True, 2), (True, True, 2), (False, True, 0)],
)
def test_online_scores_equal_offline_forward(logit_averaging, skip, layers):
    # layers=0: the no-block ablation (no Multi-Mask block: nothing for the cache to hold but the answers)
    verifier = make_verifier(logit_averaging=logit_averaging, num_hidden_layers=layers, gamma_skip=skip)
    if skip:
        set_gamma_skip(verifier, 2.0, -1.0)
    answers, inputs = random_answers(seed=13, groups=3, sequences=6, steps=4)
    with torch.no_grad():
        offline = verifier(**inputs).logits
        cache, online = MSVCache(), torch.empty_like(offline)
        ends = inputs["answer_end"]
        for t in sorted(set(ends.tolist())):
            idx = (ends == t).nonzero().squeeze(1)
            online[idx] = verifier(**select(inputs, idx), past_key_values=cache, use_cache=True).logits
    assert cache.num_tokens == len(inputs["token_answer"]) and cache.num_answers == len(answers)
    assert (online - offline).abs().max() <= 1e-5


@pytest.mark.parametrize("vote_pathway", [False, True])
def test_dropping_finished_groups_keeps_every_other_score(vote_pathway):
    """A server's cache forgets each group after its last answer: the other groups' online scores stay the offline
    ones, and the dropped tokens leave the cache once they fill half of it."""
    verifier = make_verifier(logit_averaging=True, vote_pathway=vote_pathway)
    _, inputs = random_answers(seed=23, groups=4, sequences=4, steps=3)
    groups, ends = inputs["answer_group"], inputs["answer_end"]
    last_end = {g: int(ends[groups == g].max()) for g in range(4)}
    with torch.no_grad():
        offline = verifier(**inputs).logits
        cache, online, sizes = MSVCache(), torch.empty_like(offline), []
        for t in sorted(set(ends.tolist())):
            idx = (ends == t).nonzero().squeeze(1)
            online[idx] = verifier(**select(inputs, idx), past_key_values=cache, use_cache=True).logits
            cache.drop([g for g, end in last_end.items() if end == t])
            sizes.append(cache.num_tokens)
    assert (online - offline).abs().max() <= 1e-5
    assert min(sizes[sizes.index(max(sizes)) :]) < max(sizes)  # compacted while groups were still scored
    assert cache.num_tokens == cache.num_answers == 0  # every group dropped: nothing left


def test_returned_cache_carries_the_history_by_either_name():
    """`use_cache=True` without a cache returns the new one (as `cache` and `past_key_values`: transformers 5.24 turned
    an output field of the old name into None) and giving it back, by either name, scores like the offline pass."""
    verifier = make_verifier()
    answers, inputs = random_answers(seed=19, groups=2, sequences=4, steps=3)
    ends = inputs["answer_end"]
    times = sorted(set(ends.tolist()))
    with torch.no_grad():
        offline = verifier(**inputs).logits
        first = (ends == times[0]).nonzero().squeeze(1)
        out = verifier(**select(inputs, first), use_cache=True)
        assert isinstance(out.cache, MSVCache) and out.past_key_values is out.cache
        online = {int(i): x for i, x in zip(first, out.logits)}
        for k, t in enumerate(times[1:]):
            idx = (ends == t).nonzero().squeeze(1)
            name = "cache" if k % 2 else "past_key_values"  # alternate the two names
            out = verifier(**select(inputs, idx), use_cache=True, **{name: out.cache})
            online |= {int(i): x for i, x in zip(idx, out.logits)}
    assert out.cache.num_answers == len(answers)
    assert (torch.stack([online[i] for i in range(len(answers))]) - offline).abs().max() <= 1e-5
    assert "cache" not in verifier(**inputs)  # no cache asked for, none returned


def test_forward_rejects_unknown_arguments_and_two_caches():
    verifier = make_verifier()
    _, inputs = random_answers(seed=3)
    with torch.no_grad():
        verifier(**inputs, return_dict=True, output_attentions=False)  # transformers' generic flags are accepted
        with pytest.raises(TypeError, match="past_key_value"):
            verifier(**inputs, past_key_value=MSVCache(), use_cache=True)  # a typo must not drop the history
        with pytest.raises(ValueError, match="not two different"):
            verifier(**inputs, cache=MSVCache(), past_key_values=MSVCache())


def test_forward_names_token_indices_outside_the_answers_and_answers_without_tokens():
    verifier = make_verifier()
    _, inputs = random_answers(seed=5)
    token_answer, num_answers = inputs["token_answer"], len(inputs["answer_group"])
    with torch.no_grad():
        for bad in (token_answer.clone().fill_(-1), torch.where(token_answer == 0, num_answers, token_answer)):
            with pytest.raises(ValueError, match=rf"index answers in \[0, {num_answers}\)"):
                verifier(**dict(inputs, token_answer=bad))
        # Answer 0's tokens given to answer 1: answer 0 has none.
        with pytest.raises(ValueError, match="at least one token"):
            verifier(**dict(inputs, token_answer=torch.where(token_answer == 0, 1, token_answer)))
        with pytest.raises(ValueError, match="at least one token"):
            verifier(**dict(inputs, hidden_states=inputs["hidden_states"][:0], token_answer=token_answer[:0]))


def test_online_rejects_out_of_order_answers_and_keeps_cache_intact():
    verifier = make_verifier()
    _, inputs = random_answers(seed=17)
    order = torch.argsort(inputs["answer_end"])
    cache = MSVCache()
    with torch.no_grad():
        verifier(**select(inputs, order[-2:]), past_key_values=cache, use_cache=True)
        tokens = cache.num_tokens
        with pytest.raises(ValueError, match="end-time order"):
            verifier(**select(inputs, order[:1]), past_key_values=cache, use_cache=True)
    assert cache.num_tokens == tokens and cache.num_answers == 2


# ---- invariances and grouping --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["terminal", "streaming"])
def test_permuting_sequences_with_their_embeddings_permutes_outputs(mode):
    verifier = make_verifier(mode=mode)
    _, inputs = random_answers(seed=19, sequences=8, terminal=mode == "terminal")
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    permuted_model = make_verifier(mode=mode)
    permuted_model.load_state_dict(verifier.state_dict())
    with torch.no_grad():
        permuted_model.sequence_embedding.weight[perm] = verifier.sequence_embedding.weight
        base = verifier(**inputs).logits
        moved = permuted_model(**dict(inputs, answer_sequence=perm[inputs["answer_sequence"]])).logits
    torch.testing.assert_close(moved, base, atol=1e-5, rtol=1e-5)


def test_grouping_larger_n_scores_each_group_of_m_independently():
    verifier = make_verifier(num_sequences=4, mode="terminal")
    _, inputs = random_answers(seed=23, groups=1, sequences=8, terminal=True)
    with pytest.raises(ValueError, match="split_into_groups"):
        verifier(**inputs)
    group, sequence = split_into_groups(inputs["answer_group"], inputs["answer_sequence"], 4)
    with torch.no_grad():
        grouped = verifier(**dict(inputs, answer_group=group, answer_sequence=sequence)).logits
        first = (inputs["answer_sequence"] < 4).nonzero().squeeze(1)
        alone = verifier(**select(dict(inputs, answer_group=group, answer_sequence=sequence), first)).logits
    torch.testing.assert_close(grouped[first], alone)


# ---- serialisation and Hub -------------------------------------------------------------------------------------


def test_save_load_round_trip_is_safetensors_only_and_autoloads(tmp_path):
    hf_msv.register_auto_classes()
    verifier = make_verifier(base_model_name_or_path="org/base", elicitation=ElicitationSettings(delimiters="\n\n"))
    verifier.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt")) for f in files)
    assert {"configuration_msv.py", "modeling_msv.py", "elicitation.py"} <= files
    _, inputs = random_answers(seed=29)
    for loaded in (MSVVerifier.from_pretrained(tmp_path), AutoModel.from_pretrained(tmp_path)):
        assert isinstance(loaded, MSVVerifier) and loaded.config.elicitation.delimiters == ("\n\n",)
        with torch.no_grad():
            torch.testing.assert_close(loaded(**inputs).logits, verifier(**inputs).logits)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "msv"


def test_remote_code_loads_without_hf_msv_installed(tmp_path):
    make_verifier().save_pretrained(tmp_path / "model")
    script = (
        "import sys; sys.modules['hf_msv'] = None\n"  # make `import hf_msv` fail in this process
        "from transformers import AutoModel\n"
        f"m = AutoModel.from_pretrained({str(tmp_path / 'model')!r}, trust_remote_code=True)\n"
        "print(type(m).__name__, type(m).__module__)\n"
    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "MSVVerifier" in result.stdout and "hf_msv" not in result.stdout


def test_push_to_hub_sends_weights_config_code_and_card(tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    sent = {}

    class Repo:
        repo_id = "me/msv-test"

    def fake_upload_folder(self, *, repo_id, folder_path, **kwargs):
        sent["repo_id"] = repo_id
        sent["files"] = sorted(os.listdir(folder_path))
        sent["config"] = json.loads(Path(folder_path, "config.json").read_text())
        sent["card"] = Path(folder_path, "README.md").read_text()
        return "commit-url"

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: Repo())
    monkeypatch.setattr(HfApi, "upload_folder", fake_upload_folder)
    verifier = make_verifier(base_model_name_or_path="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    assert verifier.push_to_hub("me/msv-test", metrics={"brier": 0.0421}) == "commit-url"
    assert sent["repo_id"] == "me/msv-test"
    assert sent["files"] == [
        "README.md",
        "baselines.py",
        "config.json",
        "configuration_msv.py",
        "elicitation.py",
        "model.safetensors",
        "modeling_msv.py",
    ]
    assert sent["config"]["model_type"] == "msv" and sent["config"]["auto_map"]["AutoModel"].endswith("MSVVerifier")
    assert sent["config"]["elicitation"]["delimiters"] == ["Wait"] and "delimiters" not in sent["config"]
    card = sent["card"]
    assert "base_model: deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B" in card
    assert "0.0421" in card and "### Final Answer ### \\boxed" in card and "'Wait'" in card


def test_configs_saved_with_flat_elicitation_keys_load_into_the_settings(tmp_path):
    old = make_verifier().config.to_dict()
    del old["elicitation"]
    old.update(delimiters=None, every_k_tokens=40, elicitation_prompt="Answer: \\boxed", max_answer_tokens=12)
    (tmp_path / "config.json").write_text(json.dumps(old))
    config = MSVConfig.from_pretrained(tmp_path)
    assert config.elicitation == ElicitationSettings(
        delimiters=(), every_k_tokens=40, prompt="Answer: \\boxed", max_answer_tokens=12
    )
    assert not hasattr(config, "elicitation_prompt") and "delimiters" not in config.to_dict()
    shipped = MSVConfig.from_pretrained(Path(hf_msv.__file__).parent / "testbed" / "verifier")
    assert shipped.elicitation == ElicitationSettings(delimiters=("Wait",))


# ---- clear errors ------------------------------------------------------------------------------------------------


def test_hidden_size_mismatch_with_the_lm_is_named():
    lm = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=50,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
    )
    with pytest.raises(ValueError, match=r"width 32.*hidden size 48"):
        check_compatible(make_verifier(), lm)
    _, inputs = random_answers(seed=1)
    with pytest.raises(ValueError, match=r"shape \(T, 32\)"):
        make_verifier()(**dict(inputs, hidden_states=torch.randn(len(inputs["token_answer"]), 48)))


def test_unknown_mask_name_in_a_saved_config_is_named(tmp_path):
    make_verifier().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["masks"] = ["full", "cross_answer"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="cross_answer"):
        MSVVerifier.from_pretrained(tmp_path)


def test_truncated_weights_file_is_named(tmp_path):
    make_verifier().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(OSError, match="truncated or corrupt"):
        MSVVerifier.from_pretrained(tmp_path)


# ---- learning ----------------------------------------------------------------------------------------------------


def synthetic_groups(num_groups, n, seed):
    """Terminal groups where correctness is only weakly visible in a single answer: correct answers share one
    class and carry a faint signal; wrong answers scatter over classes. Pooling across sequences reveals it."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(D, generator=torch.Generator().manual_seed(999))
    direction /= direction.norm()
    answers, hidden = [], []
    for group in range(num_groups):
        p = float(torch.rand(1, generator=g)) * 0.8 + 0.1
        for seq in range(n):
            correct = bool(torch.rand(1, generator=g) < p)
            klass = 0 if correct else int(torch.randint(1, 4, (1,), generator=g))
            signal = (0.6 if correct else -0.6) * direction
            hidden.append(signal + torch.randn(2, D, generator=g))
            answers.append(dict(group=group, sequence=seq, step=0, end=1, length=2, klass=klass, label=float(correct)))
    token_answer = torch.arange(len(answers)).repeat_interleave(2)
    inputs = inputs_for(answers, torch.cat(hidden), token_answer)
    return inputs, torch.tensor([a["label"] for a in answers])


def test_msv_n_learns_cross_sequence_agreement_that_single_sequence_models_cannot():
    n = 8
    train_x, train_y = synthetic_groups(64, n, seed=0)
    test_x, test_y = synthetic_groups(48, n, seed=1)

    def fit_msv(group_size):
        verifier = make_verifier(seed=0, mode="terminal", num_sequences=group_size).train()
        group, sequence = split_into_groups(train_x["answer_group"], train_x["answer_sequence"], group_size)
        x = dict(train_x, answer_group=group, answer_sequence=sequence)
        optimizer = torch.optim.AdamW(verifier.parameter_groups(lr=3e-3, embedding_lr=3e-3, mask_lr=1e-1))
        for _ in range(60):
            loss = verifier(**x, labels=train_y).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        group, sequence = split_into_groups(test_x["answer_group"], test_x["answer_sequence"], group_size)
        with torch.no_grad():
            probs = verifier.eval()(**dict(test_x, answer_group=group, answer_sequence=sequence)).probabilities
        return ((probs - test_y) ** 2).mean().item()

    def fit_probe():
        torch.manual_seed(0)
        probe = torch.nn.Sequential(torch.nn.Linear(D, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
        optimizer = torch.optim.AdamW(probe.parameters(), lr=3e-3)
        last = lambda x: x["hidden_states"][1::2]
        for _ in range(200):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(probe(last(train_x)).squeeze(-1), train_y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            return ((torch.sigmoid(probe(last(test_x)).squeeze(-1)) - test_y) ** 2).mean().item()

    brier_n, brier_1, brier_probe = fit_msv(n), fit_msv(1), fit_probe()
    print(f"Brier MSV_{n}={brier_n:.4f} MSV_1={brier_1:.4f} probe={brier_probe:.4f}")
    assert brier_n < 0.7 * min(brier_1, brier_probe), (brier_n, brier_1, brier_probe)
