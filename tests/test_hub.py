"""Model cards: one builder (`hf_msv.hub`) for MSV and Probe verifiers, built from a checkpoint's evidence and
uploaded with it (mocked Hub calls), and model_cards/ generated from it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hub import FakeHub, check_card_offline, write_evidence
from hf_msv import ElicitationSettings
from hf_msv.errors import UserError
from hf_msv.hub import build_model_card, example_model_cards, hub_base_model, push_verifier_to_hub, save_verifier
from hf_msv.modeling_msv import MSVConfig, MSVVerifier
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


# ---- the card travels with the checkpoint's evidence ---------------------------------------------------------------


def _msv(base="org/lm", **overrides):
    config = MSVConfig(hidden_size=16, num_attention_heads=2, num_sequences=4, base_model_name_or_path=base)
    for key, value in overrides.items():
        setattr(config, key, value)
    return MSVVerifier(config)


def _trained_checkpoint(directory, passed=True):
    """A checkpoint directory as `hf-msv train` leaves it: weights, config with its stopping rule, log, card."""
    verifier = _msv()
    log = write_evidence(directory, verifier.config, passed=passed)
    save_verifier(verifier, directory)
    return log


def test_the_training_card_is_built_from_the_log_and_the_stopping_rule(tmp_path):
    log = _trained_checkpoint(tmp_path, passed=False)
    kept = log["history"][log["best_epoch"]]
    text = (tmp_path / "README.md").read_text()
    metadata = check_card_offline(text)
    metrics = {m["type"]: m["value"] for m in metadata["model-index"][0]["results"][0]["metrics"]}
    assert metrics["brier_score"] == kept["val_brier"] and metrics["roc_auc"] == kept["val_auroc"]
    assert metrics["ece"] == kept["val_ece"] and metrics["accuracy"] == 0.7 and metrics["token_fraction"] == 0.6
    assert f"| validation bce | {kept['val_bce']:.4f} |" in text and "| step | 10 |" in text
    assert "| validation bce | 0.6000 |" not in text  # not the checkpoint that was kept
    assert "| guard | FAILED: worse than Probe+WV |" in text and "| validation brier (Probe+WV) | 0.0900 |" in text
    assert "λ = 0.80: loses at most 0.02" in text and "ε = 0.02, δ = 0.1, on 300 calibration problems" in text
    assert "certified: yes" in text and "ε = –" not in text and "over 3 stopping features of 4 chains" in text
    assert "ridge penalty 16 beyond the class's mean score, chosen by cross-validation over problems" in text
    assert "Four problems of a test." in text and "pipeline_tag" not in metadata


def test_a_card_without_evidence_has_no_model_index_and_extra_rows_add_to_the_evidence(tmp_path):
    untrained = check_card_offline(str(build_model_card(_msv(), "me/msv4")))
    assert "model-index" not in untrained and untrained["base_model"] == "org/lm"
    _trained_checkpoint(tmp_path)
    verifier = MSVVerifier.from_pretrained(tmp_path)
    card = save_verifier(verifier, tmp_path / "copy", metrics={"test brier": 0.5, "step": 99})
    assert (tmp_path / "copy" / "training_log.json").read_bytes() == (tmp_path / "training_log.json").read_bytes()
    text = str(card)
    assert "| test brier | 0.5000 |" in text and "| step | 99 |" in text and "| guard | passed |" in text


@pytest.mark.parametrize(
    "name, hub_id",
    [
        ("org/lm", "org/lm"),
        ("hf_msv-testbed (hf_msv/testbed/lm-v2)", None),
        ("local/checkpoint", None),  # a directory of that name exists in the working directory
        ("/abs/path/to/lm", None),
        ("lm-without-org", None),
        (None, None),
    ],
)
def test_base_model_is_set_only_for_hub_ids(tmp_path, monkeypatch, name, hub_id):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local" / "checkpoint").mkdir(parents=True)
    assert hub_base_model(name) == hub_id
    for card in (build_model_card(_msv(name), "me/v"), build_model_card(ProbeConfig(base_model_name_or_path=name))):
        metadata = check_card_offline(str(card))
        assert metadata.get("base_model") == hub_id and "pipeline_tag" not in metadata
        assert f"`{name or 'an unrecorded base LM'}`" in str(card)


def test_push_to_hub_uploads_the_training_card_and_its_evidence(tmp_path, monkeypatch):
    _trained_checkpoint(tmp_path)
    (tmp_path / "early_stopping.json").write_text(json.dumps({"lambda": 0.8}))
    hub = FakeHub(monkeypatch)
    verifier = MSVVerifier.from_pretrained(tmp_path)
    result = verifier.push_to_hub(
        "me/msv4",
        tags=["math", "hf_msv"],
        commit_message="first",
        commit_description="validated on 300 problems",
        private=True,
        revision="v1",
        token="hf_x",
        metrics={"note": "pushed"},
    )
    assert result == "commit of me/msv4"
    assert hub.calls["create_repo"] == [{"repo_id": "me/msv4", "private": True, "exist_ok": True}]
    assert hub.calls["create_branch"] == [{"repo_id": "me/msv4", "branch": "v1", "exist_ok": True}]
    (upload,) = hub.calls["upload_folder"]
    assert {k: v for k, v in upload.items() if k != "folder_path"} == {
        "repo_id": "me/msv4",
        "commit_message": "first",
        "commit_description": "validated on 300 problems",
        "revision": "v1",
        "create_pr": False,
    }
    assert "create_commit" not in hub.calls
    assert {"model.safetensors", "config.json", "modeling_msv.py", "training_log.json", "early_stopping.json"} <= set(
        hub.files
    )
    assert hub.files["training_log.json"] == (tmp_path / "training_log.json").read_bytes()
    assert json.loads(hub.files["config.json"])["early_stopping"]["lambda"]["lam"] == 0.8
    pushed, local = check_card_offline(hub.card()), check_card_offline((tmp_path / "README.md").read_text())
    assert pushed["model-index"][0]["results"] == local["model-index"][0]["results"]
    assert pushed["model-index"][0]["name"] == "msv4" and pushed["tags"].count("hf_msv") == 1
    assert "math" in pushed["tags"] and "| note | pushed |" in hub.card() and "| guard | passed |" in hub.card()
    assert 'MSVVerifier.from_pretrained("me/msv4")' in hub.card()


@pytest.mark.parametrize("kwargs", [{"tags": "math"}, {"tags": ["ok", 3]}, {"repo_id": "me/bad..name"}])
def test_push_to_hub_rejects_bad_arguments_before_creating_the_repository(monkeypatch, kwargs):
    hub = FakeHub(monkeypatch)
    kwargs = {"repo_id": "me/msv4"} | kwargs
    with pytest.raises(UserError, match="push_to_hub"):
        push_verifier_to_hub(_msv(), **kwargs)
    assert hub.calls == {}


def test_the_probe_pushes_its_card_and_loads_as_remote_code_without_hf_msv(tmp_path, monkeypatch):
    probe = ProbeVerifier(ProbeConfig(hidden_size=8, intermediate_size=16, base_model_name_or_path="org/lm"))
    write_evidence(tmp_path)
    save_verifier(probe, tmp_path)
    hub = FakeHub(monkeypatch)
    ProbeVerifier.from_pretrained(tmp_path).push_to_hub("me/probe", tags=["probe-test"], create_pr=True)
    assert "create_branch" not in hub.calls and hub.calls["upload_folder"][0]["create_pr"] is True
    config = json.loads(hub.files["config.json"])
    assert config["auto_map"] == {
        "AutoConfig": "modeling_probe.ProbeConfig",
        "AutoModel": "modeling_probe.ProbeVerifier",
    }
    assert {"modeling_probe.py", "modeling_msv.py", "configuration_msv.py", "training_log.json"} <= set(hub.files)
    metadata = check_card_offline(hub.card())
    assert "probe-test" in metadata["tags"] and metadata["model-index"][0]["name"] == "probe"
    assert "# Probe verifier" in hub.card() and "| guard | passed |" in hub.card()
    upload = tmp_path / "upload"
    upload.mkdir()
    for name, data in hub.files.items():
        (upload / name).write_bytes(data)
    script = (
        "import sys; sys.modules['hf_msv'] = None\n"  # make `import hf_msv` fail in this process
        "import torch\nfrom transformers import AutoModel\n"
        f"m = AutoModel.from_pretrained({str(upload)!r}, trust_remote_code=True)\n"
        "out = m(torch.ones(3, 8), torch.tensor([0, 0, 1]))\n"
        "print(type(m).__name__, type(m).__module__, tuple(out.logits.shape))\n"
    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ProbeVerifier" in result.stdout and "hf_msv" not in result.stdout and "(2,)" in result.stdout


def test_a_verifier_loaded_from_the_hub_takes_its_cached_evidence_along(tmp_path, monkeypatch):
    """For a verifier loaded by repo id, the evidence files come from the local Hub cache (nothing is downloaded)."""
    import hf_msv.hub

    cache = tmp_path / "cache"
    cache.mkdir()
    _trained_checkpoint(cache)
    verifier = MSVVerifier.from_pretrained(cache)
    verifier.name_or_path = "me/msv4"  # what from_pretrained("me/msv4") records
    cached = {"training_log.json": str(cache / "training_log.json")}
    monkeypatch.setattr(
        hf_msv.hub, "try_to_load_from_cache", lambda repo_id, name: repo_id == "me/msv4" and cached.get(name)
    )
    hub = FakeHub(monkeypatch)
    verifier.push_to_hub("me/msv4-copy")
    assert "training_log.json" in hub.files and "early_stopping.json" not in hub.files
    assert "| guard | passed |" in hub.card()
