"""MSV generation on caches beyond full attention, with tiny random models (CPU, seconds).

Recurrent layers (conv / SSM / linear attention): LFM2, Mamba (its cache named ``cache_params`` before transformers
5.24), Mamba-2, Qwen3-Next, Jamba, FalconMamba, Bamba, Falcon-H1 and GraniteMoeHybrid, decoded by the lockstep loop.
The invariants are those of `test_generation`: sampling is unperturbed and every answer equals a cache-free
recomputation of its branch context, here with delimiters split over up to four tokens, so branch rows must start
from a recurrent state saved before the delimiter; a prompt that stops takes its recurrent rows out of the batch.
Sliding-window layers whose window is shorter than a branch's context (Gemma-2, window 4), and caches that cannot
be forked (static, model-specific classes such as MiniMax's, state outside ``cache.layers``), refused by name before
decoding. Random splits, windows and chunk sizes: `test_cache_exactness`.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import LogitsProcessorList
from transformers.cache_utils import DynamicCache, DynamicLayer, StaticCache

from helpers.generation import (
    EOS,
    HIDDEN,
    ID,
    PAD,
    TOK,
    ForceTokens,
    P,
    ScriptedAnswers,
    V,
    generate,
    prompts,
    recompute_answer,
    tiny_verifier,
)
from hf_msv.generation import (
    DelimiterMatcher,
    RecurrentHistory,
    branch_cache,
    caches,
    fork_cache,
    lockstep_sample,
    prepare_generation,
    recurrent_state_bytes,
)
from hf_msv.generation.caches import cache_argument, check_forkable, output_cache, widen_windows

pytestmark = pytest.mark.usefixtures("single_thread")
# Recurrent layers are forked from transformers 5.14 on (refused before: see the version test below).
recurrent = pytest.mark.skipif(not caches._DICT_STATES, reason="recurrent cache layers need transformers >= 5.14")


def hybrid_config(arch: str):
    # Weights larger than the default init, so that a recurrent state that saw the wrong tokens shows in the outputs.
    common = dict(
        vocab_size=V, bos_token_id=1, eos_token_id=EOS, pad_token_id=0, hidden_size=HIDDEN, initializer_range=0.2
    )
    ssm = dict(num_hidden_layers=2, expand=2, conv_kernel=4, **common)
    hybrid_ssm = dict(
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_state=8,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=16,
        **common,
    )
    configs = {
        "lfm2": lambda: transformers.Lfm2Config(
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            layer_types=["conv", "full_attention", "conv"],
            **common,
        ),
        "mamba": lambda: transformers.MambaConfig(state_size=4, **ssm),
        "mamba2": lambda: transformers.Mamba2Config(
            state_size=8, num_heads=4, head_dim=16, n_groups=1, chunk_size=16, **ssm
        ),
        "jamba": lambda: transformers.JambaConfig(
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=2,
            mamba_d_state=4,
            mamba_d_conv=4,
            mamba_expand=2,
            **common,
        ),
        "falcon_mamba": lambda: transformers.FalconMambaConfig(state_size=4, **ssm),
        "bamba": lambda: transformers.BambaConfig(attn_layer_indices=[1], **hybrid_ssm),
        "falcon_h1": lambda: transformers.FalconH1Config(head_dim=8, mamba_d_ssm=64, **hybrid_ssm),
        "granitemoehybrid": lambda: transformers.GraniteMoeHybridConfig(
            layer_types=["mamba", "attention"],
            num_local_experts=2,
            num_experts_per_tok=1,
            shared_intermediate_size=64,
            **hybrid_ssm,
        ),
        "qwen3_next": lambda: transformers.Qwen3NextConfig(
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            layer_types=["linear_attention", "full_attention"],
            **common,
        ),
    }
    return configs[arch]()


# Jamba: attention plus a Mamba-1 mixer, which restarts its scan on a multi-token forward over a cache.
HYBRIDS = ["lfm2", "mamba", "mamba2", "qwen3_next", "jamba"]
# The same layer types again, in other models' mixers (the branch-exactness test only).
MORE_HYBRIDS = ["falcon_mamba", "bamba", "falcon_h1", "granitemoehybrid"]


def hybrid_model(arch: str):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(hybrid_config(arch)).eval()


def gemma2_window_model(window: int = 4):
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=V,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.2,
    )
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def prefill(model, inputs) -> DynamicCache:
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
    return output_cache(out)


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every tensor a cache holds (keys/values, conv and recurrent states), cloned."""
    found = []
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None:
            found += [layer.keys.clone(), layer.values.clone()]
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            found += [s.clone() for s in states.values() if s is not None]
    return found


def layer_lengths(cache) -> list[int]:
    """Each layer's token count (transformers >= 5.25 keeps a linear layer's in a 0-d tensor updated in place)."""
    return [int(layer.get_seq_length()) for layer in cache.layers if hasattr(layer, "get_seq_length")]


# Row 0: "Wa"+"it" (one consumed token to leave out); row 1: "W"+"a"+"i"+"t" (three); row 2: "\n\nWait" (its
# "\n\n" is fed again) at the step where row 0's every-K branch and row 1's fire too, so segments differ in length.
SCHEDULE = {
    (0, 3): ID["Wa"],
    (0, 4): ID["it"],
    (1, 1): ID["W"],
    (1, 2): ID["a"],
    (1, 3): ID["i"],
    (1, 4): ID["t"],
    (2, 4): ID["\n\nWait"],
    (3, 6): ID["Wa"],
    (3, 7): ID["it"],
    (4, 2): EOS,
    (5, 8): ID["Wait"],
}


@pytest.mark.parametrize("arch", HYBRIDS + MORE_HYBRIDS)
@recurrent
def test_sampling_unperturbed_and_branches_exact(arch):
    """With early stopping off, the sampled tokens equal plain generate's; every answer's tokens and hidden states
    equal a cache-free recomputation of its context, including branches that leave out up to three consumed
    delimiter tokens (restored recurrent state) and several branches of different segment lengths at one step."""
    model = hybrid_model(arch)
    ScriptedAnswers(model)
    inputs = prompts()
    plain = generate(model, inputs, n=3, max_new_tokens=12, schedule=SCHEDULE, criteria=False)
    with prepare_generation(
        model,
        TOK,
        delimiters=["Wait"],
        every_k_tokens=5,
        checker=None,
        max_answer_tokens=6,
        capture_hidden_states=True,
    ) as msv:
        hooked = generate(msv, inputs, n=3, max_new_tokens=12, schedule=SCHEDULE)
        results = msv.pop_results()
    assert torch.equal(plain, hooked)
    answers = [(r, a) for r in results for a in r.answers]
    dropped = {(r.prompt, a.sequence, a.tau): a.tau - a.cot_tokens for r, a in answers if a.trigger == "delimiter"}
    assert dropped == {(0, 0, 4): 1, (0, 1, 4): 3, (0, 2, 4): 0, (1, 0, 7): 1, (1, 2, 8): 0}
    assert {a.trigger for _, a in answers} == {"delimiter", "every_k", "eos", "budget"}
    for result, answer in answers:
        hidden, greedy = recompute_answer(model, inputs, result, answer)
        assert greedy == answer.token_ids
        assert answer.hidden_states.shape == (answer.length, HIDDEN)
        torch.testing.assert_close(answer.hidden_states, hidden, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba"])
@recurrent
def test_stopped_prompt_leaves_the_batch_with_its_recurrent_rows(arch):
    """λ = 0 stops prompt 0 at its first answer (a split "Wa"+"it", so its branch reads a saved recurrent state);
    its rows and their states leave the batch, and prompt 1 goes on sampling exactly as in a plain generate, its
    answers (one of a three-token delimiter) still exact."""
    model = hybrid_model(arch)
    ScriptedAnswers(model)
    inputs = prompts()
    schedule = {(0, 3): ID["Wa"], (0, 4): ID["it"], (2, 6): ID["W"], (2, 7): ID["a"], (2, 8): ID["i"], (2, 9): ID["t"]}
    plain = generate(model, inputs, n=2, max_new_tokens=16, schedule=schedule, criteria=False)
    with prepare_generation(
        model, TOK, tiny_verifier(), delimiters=["Wait"], checker="exact", max_answer_tokens=6
    ) as msv:
        hooked = generate(msv, inputs, n=2, max_new_tokens=16, schedule=schedule, threshold=0.0)
        results = msv.pop_results()
    # Prompt 0 stops when its answer is available (τ + P + L, L = 3 scripted tokens); prompt 1's answer (τ = 9)
    # comes only after the budget, so its rows run to the end, sampled exactly as without MSV.
    first, second = results
    assert first.stopped_early and first.chosen.tau == 4 and first.stop_step == 4 + P + 3 < 15
    assert not second.stopped_early and second.finish_reasons == ["budget", "budget"]
    assert hooked.shape == plain.shape and torch.equal(hooked[2:], plain[2:])
    assert hooked[:2, inputs["input_ids"].shape[1] + first.stop_step + 1 :].eq(PAD).all()  # they left the batch
    answers = [(r, a) for r in results for a in r.answers]
    assert [(r.prompt, a.sequence, a.tau, a.tau - a.cot_tokens) for r, a in answers] == [(0, 0, 4, 1), (1, 0, 9, 3)]
    for result, answer in answers:
        assert recompute_answer(model, inputs, result, answer)[1] == answer.token_ids


@pytest.mark.parametrize("arch", ["mamba", "lfm2"])
@recurrent
def test_decoding_loop_alone_samples_like_plain_generate(arch):
    """The loop without an `MSVSession` (``custom_generate=lockstep_sample``) on a recurrent cache, Mamba's passed as
    ``cache_params`` and decoded without a mask: the tokens of plain generate; a row that ends early leaves the
    batch (its recurrent states gathered out) and is padded as generate pads it."""
    model = hybrid_model(arch)
    inputs = prompts()
    processors = LogitsProcessorList([ForceTokens(inputs["input_ids"].shape[1], {(1, 3): EOS})])
    outs = []
    for custom in (None, lockstep_sample):
        torch.manual_seed(3)
        outs.append(
            model.generate(
                **inputs,
                do_sample=True,
                num_return_sequences=2,
                max_new_tokens=10,
                logits_processor=processors,
                custom_generate=custom,
            )
        )
    assert torch.equal(outs[0], outs[1])
    assert outs[1][1, -6:].eq(PAD).all()


@pytest.mark.parametrize("arch", HYBRIDS)
@recurrent
def test_fork_cache_leaves_the_live_cache_untouched(arch):
    """A fork (rows repeated, in any order, or every row as it is) holds copies of the rows; decoding on it, which
    updates recurrent states and token counters in place, leaves every tensor of the live cache as it was."""
    model = hybrid_model(arch)
    cache = prefill(model, prompts())
    before, lengths = cache_tensors(cache), layer_lengths(cache)
    argument = cache_argument(model)
    for rows in (torch.tensor([1, 1, 0]), torch.tensor([0, 1])):
        fork = fork_cache(cache, rows)
        assert all(torch.equal(f, b[rows]) for f, b in zip(cache_tensors(fork), before))
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7][: len(rows)]]).T, **{argument: fork}, use_cache=True)
        assert any(not torch.equal(f, b[rows]) for f, b in zip(cache_tensors(fork), before))
        assert all(torch.equal(a, b) for a, b in zip(cache_tensors(cache), before))
        assert layer_lengths(cache) == lengths and layer_lengths(fork) != lengths


@recurrent
def test_branch_cache_restores_the_saved_recurrent_state_and_counts_its_bytes():
    model = hybrid_model("qwen3_next")
    inputs = prompts()
    cache = prefill(model, inputs)
    history = RecurrentHistory(horizon=2)
    history.save(cache, [1], step=0)
    saved = cache_tensors(cache)
    per_row = recurrent_state_bytes(cache)
    # One linear-attention layer: conv (channels = 2 x 16 + 32, kernel 4) and recurrent (4 heads, 8 x 8), fp32.
    assert per_row == (64 * 4 + 4 * 8 * 8) * 4 and history.nbytes == per_row
    with torch.no_grad():  # the live cache moves on by one token
        model(input_ids=torch.tensor([[5], [6]]), **{cache_argument(model): cache}, use_cache=True)
    branch = branch_cache(cache, [1, 0], drops=[1, 0], step=1, history=history)
    layer, live = branch.layers[0], cache.layers[0]
    assert torch.equal(layer.recurrent_states[0][0], saved[1][1])  # row 1 as before the token
    assert torch.equal(layer.recurrent_states[0][1], live.recurrent_states[0][0])  # row 0 as now
    with pytest.raises(RuntimeError, match="no recurrent state saved"):
        branch_cache(cache, [0], drops=[1], step=1, history=history)
    history.save(cache, [0, 1], step=1, keys=["a", "b"])
    assert history.steps("b") == [1] and history.nbytes == 3 * per_row
    history.discard("b", 1)
    history.forget(3)  # keeps step 1 only: a branch at step 3 may drop up to horizon = 2 tokens
    assert history.steps(1) == [] and history.steps("a") == [1] and history.nbytes == per_row


def test_could_start_marks_tokens_that_may_begin_a_split_delimiter():
    matcher = DelimiterMatcher(TOK, ["Wait", "\n\n"])
    ids = lambda *tokens: [ID[t] for t in tokens]
    assert matcher.could_start(ids("o", "Wa")) and matcher.could_start(ids("o", "W"))
    assert matcher.could_start(ids("o", "\n"))
    assert not matcher.could_start(ids("o", "a"))  # "a" alone is no prefix of "Wait"
    assert not matcher.could_start(ids("W", "a"))  # the occurrence started in the previous token
    assert not matcher.could_start(ids("o", "Wait")) and not matcher.could_start(ids("o", " Wait"))
    # An earlier start stays open while the text since then is a proper prefix of a delimiter.
    assert matcher.could_start(ids("o", "W", "a"), back=2) and matcher.could_start(ids("W", "a", "i"), back=3)
    assert not matcher.could_start(ids("o", "W", "o"), back=2)
    assert not matcher.could_start(ids("W", "a", "i", "t"), back=4)  # complete: no later completion


def test_unsupported_cache_layers_fail_naming_the_layer():
    class CustomLayer(DynamicLayer):
        pass

    cache = DynamicCache()
    cache.layers = [CustomLayer()]
    with pytest.raises(NotImplementedError, match=r"CustomLayer.*reorder_cache"):
        fork_cache(cache, torch.tensor([0]))
    static = StaticCache(config=gemma2_window_model(64).config, max_cache_len=8)
    with pytest.raises(NotImplementedError, match=r"Static.*Layer.*dynamic cache"):
        fork_cache(static, torch.tensor([0]))


def test_state_outside_the_known_tensors_is_refused_by_name():
    """The whole cache object is inspected: a tensor kept beside ``cache.layers`` (even inside a list), a tensor a
    supported layer holds under an unknown attribute, and a cache class other than DynamicCache are refused."""
    cache = prefill(gemma2_window_model(4), prompts())  # sliding, then full attention
    check_forkable(cache)
    cache.side_states = [[], torch.zeros(2, 3)]
    with pytest.raises(NotImplementedError, match=r"DynamicCache\.side_states holds per-row state outside cache"):
        fork_cache(cache, torch.tensor([0]))
    del cache.side_states
    cache.layers[1].extra_keys = torch.zeros(2, 3)
    with pytest.raises(NotImplementedError, match=r"DynamicLayer\.extra_keys"):
        fork_cache(cache, torch.tensor([0]))

    class ModelCache(DynamicCache):
        pass

    with pytest.raises(NotImplementedError, match="cannot fork ModelCache: it forks transformers' DynamicCache"):
        check_forkable(ModelCache())


def minimax_model():
    if not hasattr(transformers, "MiniMaxConfig"):
        pytest.skip("this transformers has no MiniMax")
    torch.manual_seed(0)
    config = transformers.MiniMaxConfig(
        vocab_size=V,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        layer_types=["linear_attention", "full_attention"],
        block_size=4,
    )
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def test_minimax_linear_cache_is_refused_before_decoding():
    """MiniMax keeps its linear-attention states in ``MiniMaxCache.linear_cache``, outside ``cache.layers``: refused
    with a NotImplementedError naming it, right after the prefill (no decoding forward runs)."""
    model = minimax_model()
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    with (
        prepare_generation(model, TOK, delimiters=["Wait"], checker=None, max_answer_tokens=4) as msv,
        pytest.raises(NotImplementedError, match=r"MiniMaxCache\.linear_cache"),
    ):
        generate(msv, prompts(), n=2, max_new_tokens=6)
    assert len(forwards) == 1  # the prefill
    with pytest.raises(NotImplementedError, match="MiniMaxCache"):
        check_forkable(type(prefill(model, prompts()))())  # the class alone, before it holds any tensor


def test_sliding_window_shorter_than_the_context_with_split_delimiters_is_exact():
    """Gemma-2, window 4, a sliding layer before a full one: branches that leave out one ("Wa"+"it") or three
    ("W"+"a"+"i"+"t") consumed tokens see the window before them, as a cache-free forward does."""
    model = gemma2_window_model(4)
    ScriptedAnswers(model)
    inputs = prompts()
    schedule = {
        (0, 6): ID["Wa"],
        (0, 7): ID["it"],
        (1, 3): ID["W"],
        (1, 4): ID["a"],
        (1, 5): ID["i"],
        (1, 6): ID["t"],
        (2, 2): ID["Wait"],
    }
    plain = generate(model, inputs, n=2, max_new_tokens=12, schedule=schedule, criteria=False)
    with prepare_generation(
        model, TOK, delimiters=["Wait"], checker=None, max_answer_tokens=6, capture_hidden_states=True
    ) as msv:
        hooked = generate(msv, inputs, n=2, max_new_tokens=12, schedule=schedule)
        results = msv.pop_results()
    assert torch.equal(plain, hooked)
    answers = [(r, a) for r in results for a in r.answers]
    dropped = {(r.prompt, a.sequence, a.tau): a.tau - a.cot_tokens for r, a in answers if a.trigger == "delimiter"}
    assert dropped == {(0, 0, 7): 1, (0, 1, 6): 3, (1, 0, 2): 0}
    for result, answer in answers:
        hidden, greedy = recompute_answer(model, inputs, result, answer)
        assert greedy == answer.token_ids
        torch.testing.assert_close(answer.hidden_states, hidden, atol=1e-4, rtol=1e-4)


def test_widened_window_and_shifted_branch_rows():
    """`widen_windows` keeps `margin` more tokens (zero slots stand for those the prefill let go, so the stored
    span matches the mask sizes); `branch_cache` moves a dropping row's keys `drop` slots later, in the fork only."""
    model = gemma2_window_model(4)
    live = prefill(model, prompts())  # 22 tokens: the sliding layer keeps the last 3
    sliding, full = live.layers
    assert sliding.keys.shape[-2] == 3 and full.keys.shape[-2] == 22
    cache = fork_cache(live, torch.arange(2))
    widen_windows(cache, 2)
    assert cache.layers[0].keys.shape[-2] == 5 and cache.layers[0].get_mask_sizes(1) == (6, 17)
    assert sliding.keys.shape[-2] == 3 and sliding.sliding_window == 4  # the live layer is untouched
    assert cache.layers[0].keys[:, :, :2].eq(0).all()
    before = [layer.keys.clone() for layer in cache.layers]
    branch = branch_cache(cache, [1, 0], drops=[0, 2], step=5)
    for layer, keys in zip(branch.layers, before):
        assert torch.equal(layer.keys[0], keys[1]) and torch.equal(layer.keys[1], keys[0].roll(2, dims=-2))
    assert all(torch.equal(layer.keys, keys) for layer, keys in zip(cache.layers, before))


def test_recurrent_layers_before_transformers_5_14_fail_naming_the_version(monkeypatch):
    """transformers before 5.14 keeps recurrent states as tensors, not per-state dicts: refused with the version
    needed (``make test-floor`` runs the rest of the suite on the 5.12.0 floor)."""
    cache = prefill(hybrid_model("lfm2"), prompts())
    monkeypatch.setattr(caches, "_DICT_STATES", False)
    with pytest.raises(NotImplementedError, match=r"Lfm2.*Layer.*transformers >= 5\.14\.0|LinearAttention.*5\.14\.0"):
        fork_cache(cache, torch.tensor([0]))


def test_mamba_without_cache_is_a_clear_error():
    model = hybrid_model("mamba")
    with prepare_generation(model, TOK, checker=None) as msv, pytest.raises(RuntimeError, match="use_cache=True"):
        model.generate(**prompts(["Hi"]), custom_generate=msv, do_sample=False, max_new_tokens=2, use_cache=False)
