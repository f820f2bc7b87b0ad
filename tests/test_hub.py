"""Model cards: one builder (`hf_msv.hub`) for MSV and Probe verifiers, and model_cards/ generated from it."""

from pathlib import Path

from hf_msv import ElicitationSettings
from hf_msv.hub import build_model_card, example_model_cards, save_verifier
from hf_msv.modeling_msv import MSVConfig
from hf_msv.modeling_probe import ProbeConfig, ProbeVerifier

ROOT = Path(__file__).resolve().parents[1]


def test_model_cards_directory_is_generated_from_the_templates():
    """model_cards/ holds what `write_model_cards` writes; regenerate it (model_cards/README.md) when this fails."""
    for name, text in example_model_cards().items():
        assert (ROOT / "model_cards" / name).read_text(encoding="utf-8") == text, f"model_cards/{name} is stale"


def test_probe_is_saved_with_its_card(tmp_path):
    probe = ProbeVerifier(
        ProbeConfig(hidden_size=8, intermediate_size=16, mode="terminal", base_model_name_or_path="org/lm")
    )
    save_verifier(probe, tmp_path, metrics={"validation brier": 0.12345, "epoch": 3}, training_data="Some data.")
    card = (tmp_path / "README.md").read_text()
    assert card.startswith("---\nbase_model: org/lm\n") and "- probe\n" in card
    assert "# Probe verifier" in card and "(hidden 16)" in card and "each terminal answer" in card
    assert "Some data." in card and "| validation brier | 0.1235 |\n| epoch | 3 |\n" in card
    assert ProbeVerifier.from_pretrained(tmp_path).config.intermediate_size == 16


def test_cards_build_from_a_config_alone():
    msv = MSVConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_sequences=4,
        base_model_name_or_path="org/lm",
        elicitation=ElicitationSettings(delimiters=(), every_k_tokens=32),
    )
    card = str(build_model_card(msv, "me/msv4"))
    assert "# msv4" in card and "every 32 tokens" in card and "Not measured yet." in card
    assert "# Probe verifier" in str(build_model_card(ProbeConfig(hidden_size=8)))
