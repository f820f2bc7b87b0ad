"""LMs whose decoding state MSV generation cannot fork are refused before any decoding step, by class and cause.

Tiny self-contained LMs (CPU, milliseconds), each keeping its recurrent state where a row copy of the loop's cache
cannot reach it: in a model kwarg beside the cache argument (`KwargStateLM`), in RWKV's ``state`` argument
(`StateArgumentLM`, and `HiddenStateArgumentLM`, whose signature hides it until the prefill returns it), and on its
own modules (`ModuleStateLM`, as RecurrentGemma does). transformers' own RecurrentGemma and RWKV, built tiny from a
config, are refused the same way, while a Llama-like LM and a Mamba LM are still decoded. Each refusal is an
`UnsupportedError` (a `NotImplementedError` and a `UserError`, so ``hf-msv`` reports it as one line).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import transformers
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import StaticCache
from transformers.modeling_outputs import CausalLMOutput
from transformers.utils import ModelOutput

from hf_msv.errors import UnsupportedError, UserError
from hf_msv.generation import caches, lockstep_sample
from hf_msv.generation.caches import check_decodable, check_forkable, check_prefilled, module_state, output_cache

pytestmark = pytest.mark.usefixtures("single_thread")

V, H = 24, 8
EOS = 2


class TinyConfig(PretrainedConfig):
    model_type = "hf_msv_tiny_recurrent"

    def __init__(self, vocab_size=V, hidden_size=H, num_hidden_layers=1, **kwargs):
        kwargs = {"bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": 0, **kwargs}
        super().__init__(**kwargs)
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers


class TinyRecurrentLM(PreTrainedModel, GenerationMixin):
    """A one-layer linear recurrence ``h_t = decay * h_{t-1} + embed(x_t)`` with an LM head; where it keeps ``h``
    between forwards is up to each subclass."""

    config_class = TinyConfig
    main_input_name = "input_ids"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.decay = nn.Parameter(torch.full((config.hidden_size,), 0.5))
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def scan(self, input_ids: torch.Tensor, h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs `(B, T, H)`, the last state `(B, H)`) over `input_ids`, from state `h` (zeros if `None`)."""
        x = self.embed(input_ids)
        h = x.new_zeros(x.shape[0], x.shape[2]) if h is None else h.expand(x.shape[0], -1)
        outs = []
        for t in range(x.shape[1]):
            h = self.decay * h + x[:, t]
            outs.append(h)
        return torch.stack(outs, 1), h


@dataclass
class RecurrentOutput(ModelOutput):
    logits: torch.Tensor | None = None
    recurrent_states: object | None = None
    state: list[torch.Tensor] | None = None


class RecurrentStates:
    """A state object (RecurrentGemma-style: not a transformers Cache): the last `h` and how many tokens it saw."""

    def __init__(self, h: torch.Tensor, seen: int = 0):
        self.h, self.seen = h, seen


class KwargStateLM(TinyRecurrentLM):
    """Takes a cache as ``past_key_values`` (for attention layers it does not have) and keeps its recurrent state in
    the model kwarg ``recurrent_states``, which it sets up beside generate's cache."""

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        model_kwargs["recurrent_states"] = RecurrentStates(torch.zeros(1, self.config.hidden_size))

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        recurrent_states=None,
        use_cache=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if recurrent_states is not None and recurrent_states.seen:
            input_ids = input_ids[:, -1:]  # the state holds every earlier token
        out, h = self.scan(input_ids, recurrent_states.h if recurrent_states is not None else None)
        seen = (recurrent_states.seen if recurrent_states is not None else 0) + input_ids.shape[1]
        return RecurrentOutput(logits=self.head(out), recurrent_states=RecurrentStates(h, seen))

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        model_kwargs["recurrent_states"] = outputs.recurrent_states
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)


class StateArgumentLM(TinyRecurrentLM):
    """RWKV-style: the forward takes and returns ``state`` (a list of tensors) and takes no cache."""

    def forward(self, input_ids, attention_mask=None, state=None, use_cache=None, logits_to_keep=0, **kwargs):
        if state is not None:
            input_ids = input_ids[:, -1:]
        out, h = self.scan(input_ids, state[0] if state is not None else None)
        return RecurrentOutput(logits=self.head(out), state=[h] if use_cache else None)

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        model_kwargs["state"] = outputs.state
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)


class HiddenStateArgumentLM(StateArgumentLM):
    """The same, its ``state`` hidden in ``**kwargs``: only the prefill's output shows it."""

    def forward(self, input_ids, attention_mask=None, use_cache=None, **kwargs):
        return super().forward(input_ids, attention_mask, use_cache=use_cache, **kwargs)


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = None  # per-row state, assigned by the forward: neither a parameter nor a buffer


class ModuleStateLM(TinyRecurrentLM):
    """RecurrentGemma's mechanism without its ``_setup_cache``: the forward keeps ``h`` on a submodule."""

    def __init__(self, config):
        super().__init__(config)
        self.mixer = Mixer()

    def forward(self, input_ids, attention_mask=None, use_cache=None, logits_to_keep=0, **kwargs):
        out, self.mixer.h = self.scan(input_ids, None)
        return CausalLMOutput(logits=self.head(out))


def tiny(cls):
    torch.manual_seed(0)
    return cls(TinyConfig()).eval()


def count_forwards(model) -> list:
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    return forwards


def prompt_ids() -> dict:
    return {
        "input_ids": torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]]),
        "attention_mask": torch.ones(2, 4, dtype=torch.long),
    }


def msv_generate(model, **kwargs):
    """The lockstep loop alone (what `prepare_generation` installs), greedy, 4 new tokens."""
    return model.generate(**prompt_ids(), do_sample=False, max_new_tokens=4, custom_generate=lockstep_sample, **kwargs)


def assert_refused(model, *patterns: str, forwards_allowed: int = 0):
    forwards = count_forwards(model)
    with pytest.raises(UnsupportedError) as info:
        msv_generate(model)
    message = str(info.value)
    assert type(model).__name__ in message and "docs/caches.md" in message and "use_cache=True" not in message
    for pattern in patterns:
        assert pattern in message, message
    assert len(forwards) <= forwards_allowed  # 0: before the prefill; 1: the prefill, never a decoding step
    assert isinstance(info.value, NotImplementedError) and isinstance(info.value, UserError)
    return message


@pytest.mark.parametrize("cls", [KwargStateLM, StateArgumentLM, ModuleStateLM])
def test_the_tiny_lms_decode_with_plain_generate(cls):
    """They are working LMs: plain generate (which passes their state on) samples them, deterministically."""
    model = tiny(cls)
    runs = [model.generate(**prompt_ids(), do_sample=False, max_new_tokens=4) for _ in range(2)]
    assert runs[0].shape == (2, 8) and torch.equal(runs[0], runs[1])


def test_state_in_a_model_kwarg_is_refused_before_the_prefill():
    message = assert_refused(
        tiny(KwargStateLM), "model kwarg `recurrent_states` (RecurrentStates)", "neither pass it on"
    )
    assert "KwargStateLM" in message


def test_state_argument_is_refused_before_the_prefill():
    assert_refused(tiny(StateArgumentLM), "`state` argument", "takes no cache")


def test_state_returned_by_the_prefill_is_refused_before_decoding():
    assert_refused(tiny(HiddenStateArgumentLM), "returns its state as `state`", forwards_allowed=1)


def test_state_on_the_modules_is_refused_after_the_prefill():
    """The prefill writes `mixer.h` (2 rows): refused right after it, naming the attribute."""
    assert_refused(tiny(ModuleStateLM), "own modules", "mixer.h", forwards_allowed=1)


def recurrent_gemma():
    config = transformers.RecurrentGemmaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        lru_width=16,
        attention_window_size=8,
        block_types=["recurrent", "attention"],
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.RecurrentGemmaForCausalLM(config).eval()


def rwkv():
    config = transformers.RwkvConfig(
        vocab_size=V,
        hidden_size=16,
        attention_hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        context_length=32,
        bos_token_id=1,
        eos_token_id=EOS,
    )
    torch.manual_seed(0)
    return transformers.RwkvForCausalLM(config).eval()


def test_transformers_recurrent_gemma_is_refused_before_the_prefill():
    """RecurrentGemma keeps ``conv1d_state`` and ``rg_lru.recurrent_states`` on its modules (its
    ``_setup_cache``), beside the DynamicCache generate passes it; the prefill returns no cache."""
    model = recurrent_gemma()
    assert_refused(model, "RecurrentGemmaForCausalLM", "_setup_cache", "own modules")


def test_transformers_recurrent_gemma_module_state_is_named_after_the_prefill(monkeypatch):
    """Without the class check, the tensors the prefill wrote onto its modules name it."""
    monkeypatch.setattr(caches, "_module_cache_setup", lambda model: None)
    assert_refused(recurrent_gemma(), "rg_lru.recurrent_states", "conv1d_state", forwards_allowed=1)


def test_transformers_rwkv_is_refused_before_the_prefill():
    assert_refused(rwkv(), "RwkvForCausalLM", "`state` argument")


def llama():
    config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def mamba():
    config = transformers.MambaConfig(
        vocab_size=V,
        hidden_size=16,
        num_hidden_layers=2,
        state_size=4,
        expand=2,
        conv_kernel=4,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.MambaForCausalLM(config).eval()


@pytest.mark.parametrize(
    "build",
    [
        llama,
        pytest.param(
            mamba,
            marks=pytest.mark.skipif(
                not caches._DICT_STATES, reason="recurrent cache layers need transformers >= 5.14"
            ),
        ),
    ],
)
def test_supported_lms_are_still_decoded(build):
    """A Llama-like LM and Mamba pass the checks and decode as plain greedy generate does."""
    model = build()
    plain = model.generate(**prompt_ids(), do_sample=False, max_new_tokens=4)
    assert torch.equal(msv_generate(model), plain)
    assert module_state(model) == {}


def test_use_cache_false_names_the_lm():
    model = llama()
    forwards = count_forwards(model)
    with pytest.raises(
        UnsupportedError,
        match=r"LlamaForCausalLM\.generate was called without: call generate "
        r"with use_cache=True",
    ):
        msv_generate(model, use_cache=False)
    assert forwards == []


def test_refusals_name_the_owner_of_an_unsupported_cache():
    """`check_forkable` names the LM when told it; a Cache under a kwarg that is no cache argument is refused."""
    model = llama()
    static = StaticCache(config=model.config, max_cache_len=8)
    with pytest.raises(UnsupportedError, match=r"StaticLayer cache layer \(the cache of LlamaForCausalLM\)"):
        check_forkable(static, "LlamaForCausalLM")
    with pytest.raises(UnsupportedError, match=r"StaticLayer cache layer \(the cache of LlamaForCausalLM\)"):
        check_decodable(model, {"cache": static})
    with pytest.raises(UnsupportedError, match=r"model kwarg `side_cache` \(StaticCache\)"):
        check_decodable(model, {"side_cache": static})
    with pytest.raises(UnsupportedError, match="2D attention mask"):
        check_decodable(model, {"attention_mask": torch.ones(1, 1, 4, 4)})
    check_decodable(model, {**prompt_ids(), "use_cache": True, "logits_to_keep": 1})


def test_a_forward_that_returns_no_cache_is_refused_by_name():
    model = tiny(ModuleStateLM)
    with pytest.raises(UnsupportedError, match=r"ModuleStateLM: its forward returned no cache"):
        check_prefilled(model, CausalLMOutput(logits=torch.zeros(2, 1, V)), module_state(model), batch=2)


@dataclass
class CacheAndStateOutput(ModelOutput):
    logits: torch.Tensor | None = None
    cache: object | None = None
    ssm_state: torch.Tensor | None = None


def test_state_returned_beside_the_cache_is_refused():
    model = llama()
    with torch.no_grad():
        cache = output_cache(model(**prompt_ids(), use_cache=True))
    kept = CacheAndStateOutput(logits=torch.zeros(2, 1, V), cache=cache)
    assert check_prefilled(model, kept, module_state(model), batch=2) is cache
    with pytest.raises(UnsupportedError, match=r"LlamaForCausalLM: its forward returns state as `ssm_state` beside"):
        check_prefilled(
            model,
            CacheAndStateOutput(logits=kept.logits, cache=cache, ssm_state=torch.zeros(2, 3)),
            module_state(model),
            batch=2,
        )


def char_tokenizer():
    """Characters and "Wait" as tokens (ids 0-3: pad, bos, eos, unk), left padding."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {
        t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", "Wait"] + [chr(c) for c in range(32, 127)])
    }
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"Wait|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


@pytest.mark.parametrize("cls", [KwargStateLM, ModuleStateLM])
def test_refused_through_prepare_generation(cls):
    """The same refusals reach a caller of ``model.generate`` with MSV generation attached, before any decoding."""
    from hf_msv.generation import prepare_generation

    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    model = cls(TinyConfig(vocab_size=len(tokenizer))).eval()
    forwards = count_forwards(model)
    inputs = tokenizer(["Hi", "Hello"], return_tensors="pt", padding=True)
    with (
        prepare_generation(model, tokenizer, checker=None, delimiters=["Wait"], max_answer_tokens=4) as msv,
        pytest.raises(UnsupportedError, match=f"decoding state of {cls.__name__}"),
    ):
        model.generate(**inputs, custom_generate=msv, do_sample=True, num_return_sequences=2, max_new_tokens=4)
    assert len(forwards) <= 1
