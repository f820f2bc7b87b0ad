"""Loading a researcher's own LM as transformers / TRL do (`ModelArguments`, `load_lm`): remote code, accelerate's
``device_map`` and offloading under the generation hook, and ``--config FILE`` / ``--log-level`` of every command."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from helpers.cli import run_command
from helpers.lm_loading import collect_args, lm_module_names, save_remote_code_lm, write_device_map
from hf_msv.collect import CollectConfig, collect
from hf_msv.collect.lm import ModelArguments, load_lm, load_problems, weights_fingerprint
from hf_msv.data import list_shards, read_shard
from hf_msv.errors import UserError


@pytest.fixture(autouse=True)
def _threads(single_thread):
    return


def collected(output_dir) -> list:
    """Every `CollectedProblem` of a collection, in shard order."""
    return [p for path in list_shards(output_dir) for p in read_shard(path)[0]]


def assert_same_collection(a, b) -> None:
    """Same answers and tokens; hidden states equal to 1e-5."""
    first, second = collected(a), collected(b)
    assert [p.problem_id for p in first] == [p.problem_id for p in second] and first
    for x, y in zip(first, second):
        assert x.answer_text == y.answer_text and x.answer_terminal.tolist() == y.answer_terminal.tolist()
        assert [t.tolist() for t in x.token_ids] == [t.tolist() for t in y.token_ids]
        torch.testing.assert_close(x.hidden_states.float(), y.hidden_states.float(), atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# Flags and remote code
# ----------------------------------------------------------------------------------------------------------------


def test_collect_help_lists_the_loading_flags(capsys):
    code, out, _ = run_command(["collect", "--help"], capsys)
    assert code == 0
    for flag in ("--revision", "--trust-remote-code", "--attn-implementation", "--device-map", "--offload-folder"):
        assert flag in out
    assert "--load-in-4bit" in out and "--config" in out and "--log-level" in out and "--model-dtype" in out


def test_model_arguments_are_collect_config_fields_and_not_collection_settings():
    config = CollectConfig(model="testbed", revision="main", attn_implementation="eager", model_dtype="float32")
    args = config.model_arguments
    assert type(args) is ModelArguments and (args.model, args.revision, args.model_dtype) == (
        "testbed",
        "main",
        "float32",
    )
    kwargs = args.from_pretrained_kwargs()
    assert kwargs["dtype"] is torch.float32 and kwargs["attn_implementation"] == "eager"
    assert "device_map" not in kwargs and not kwargs["trust_remote_code"]


def test_an_lm_with_its_own_code_loads_only_with_trust_remote_code(tmp_path, capsys):
    lm = save_remote_code_lm(tmp_path / "lm")
    code, _, err = run_command(collect_args(tmp_path / "refused", model=str(lm)), capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("hf-msv collect: error:") and "--trust-remote-code" in last
    assert not (tmp_path / "refused").exists()  # refused before anything was written

    code, out, _ = run_command(collect_args(tmp_path / "out", "--trust-remote-code", model=str(lm)), capsys)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["generated"] == 2
    model, _ = load_lm(ModelArguments(model=str(lm), trust_remote_code=True), "cpu")
    assert type(model).__name__ == "TinyRemoteForCausalLM"
    # the same weights as the testbed LM: its own code, the same collection
    run_command(collect_args(tmp_path / "testbed"), capsys)
    assert_same_collection(tmp_path / "out", tmp_path / "testbed")


def test_loading_options_refused_before_loading(tmp_path):
    with pytest.raises(UserError, match="give one"):
        ModelArguments(model="testbed", load_in_4bit=True, load_in_8bit=True)
    (tmp_path / "map.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="JSON object"):
        ModelArguments(model="testbed", device_map=str(tmp_path / "map.json"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        CollectConfig(model="testbed", device_map=str(tmp_path / "missing.json"))


def test_quantization_without_bitsandbytes_is_a_user_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    with pytest.raises(UserError, match="pip install bitsandbytes"):
        ModelArguments(model="testbed", load_in_4bit=True)


def test_vllm_engine_takes_the_loading_options_it_has():
    from hf_msv.vllm.cli import engine_model_arguments

    args = ModelArguments(model="m", revision="v1", trust_remote_code=True, model_dtype="bfloat16")
    assert engine_model_arguments(args) == {"revision": "v1", "trust_remote_code": True, "dtype": "bfloat16"}
    with pytest.raises(UserError, match="--device-map"):
        engine_model_arguments(dataclasses.replace(args, device_map="auto"))


# ----------------------------------------------------------------------------------------------------------------
# device_map and offloading under the generation hook
# ----------------------------------------------------------------------------------------------------------------


def test_an_lm_dispatched_by_accelerate_collects_the_same_shards(tmp_path):
    """Every layer on the cpu but dispatched through accelerate (hooks on every module): the same collection."""
    from accelerate import dispatch_model

    problems = load_problems("testbed:train:2")
    config = CollectConfig(model="testbed", num_samples=2, max_new_tokens=64, checker="exact", progress=False)
    config = config.resolved()
    model, tokenizer = load_lm("testbed", device="cpu")
    collect(model, tokenizer, problems, tmp_path / "whole", config)
    model = dispatch_model(model, {name: "cpu" for name in lm_module_names()}, force_hooks=True)
    assert hasattr(model.model.layers[0], "_hf_hook")
    collect(model, tokenizer, problems, tmp_path / "dispatched", config)
    assert_same_collection(tmp_path / "whole", tmp_path / "dispatched")


def test_a_disk_offloaded_lm_collects_the_same_shards_and_resumes_the_whole_ones(tmp_path, capsys):
    device_map = write_device_map(tmp_path / "map.json", offloaded=("model.layers.1", "model.layers.2"))
    offload = ["--device-map", str(device_map), "--offload-folder", str(tmp_path / "offload")]
    model, _ = load_lm(ModelArguments(model="testbed", device_map=str(device_map), offload_folder=str(tmp_path / "o")))
    assert model.hf_device_map["model.layers.1"] == "disk"
    assert model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # its values are on disk
    assert weights_fingerprint(model) == weights_fingerprint(load_lm("testbed", device="cpu")[0])

    assert run_command(collect_args(tmp_path / "whole"), capsys)[0] == 0
    code, out, _ = run_command(collect_args(tmp_path / "offloaded", *offload), capsys)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["generated"] == 2
    assert_same_collection(tmp_path / "whole", tmp_path / "offloaded")
    # how the LM is loaded is no collection setting: the offloaded LM resumes (here: finds done) the whole one's
    code, out, _ = run_command(collect_args(tmp_path / "whole", *offload), capsys)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["generated"] == 0
    # generation feeds its inputs where the LM's first module is: offloading that one is refused, in one line
    first = write_device_map(tmp_path / "first.json", offloaded=("model.embed_tokens", "lm_head"))  # tied
    code, _, err = run_command(collect_args(tmp_path / "first", "--device-map", str(first), *offload[2:]), capsys)
    assert code == 2 and "input embedding" in err.strip().splitlines()[-1]


# ----------------------------------------------------------------------------------------------------------------
# --config FILE and --log-level
# ----------------------------------------------------------------------------------------------------------------


def test_collect_reads_a_config_file_and_flags_override_it(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: testbed\nproblems: testbed:train:2\noutput_dir: {tmp_path / 'out'}\nnum_samples: 2\n"
        "max_new_tokens: 64\nchecker: exact\nseed: 5\nprogress: false\n"
    )
    code, out, _ = run_command(["collect", "--config", str(config), "--seed", "3"], capsys)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["generated"] == 2
    settings = json.loads((tmp_path / "out" / "collect_config.json").read_text())
    assert (settings["seed"], settings["num_samples"], settings["max_new_tokens"]) == (3, 2, 64)

    config.write_text(config.read_text() + "num_smaples: 4\n")
    code, _, err = run_command(["collect", "--config", str(config)], capsys)
    assert code == 2 and "num_smaples" in err.strip().splitlines()[-1]


def test_train_reads_a_config_file_and_flags_override_it(tmp_path, capsys):
    from hf_msv.training.cli import parse_train_args

    config = tmp_path / "train.yaml"
    config.write_text(
        "train_dir: data/train\nval_dir: data/val\noutput_dir: out/a\nnum_sequences: 4\nlr_sweep: true\n"
    )
    args, training = parse_train_args(["--config", str(config), "--output-dir", "out/b"])
    assert (args.train_dir, args.val_dir, args.output_dir, args.lr_sweep) == ("data/train", "data/val", "out/b", True)
    assert training.num_sequences == 4
    config.write_text("train_dir: data/train\nbogus_option: 1\n")
    code, _, err = run_command(["train", "--config", str(config)], capsys)
    assert code == 2 and "bogus_option" in err


def test_evaluate_reads_a_config_file_and_flags_override_it(tmp_path, capsys, monkeypatch):
    import hf_msv.evaluation.cli as cli

    seen = []
    monkeypatch.setattr(cli, "evaluate_study", lambda config: seen.append(config) or {})
    config = tmp_path / "eval.yaml"
    config.write_text("eval_dir: data/eval\noutput_dir: reports/a\nbootstrap: 7\nfigures: false\n")
    code, _, _ = run_command(["evaluate", "--config", str(config), "--output-dir", "reports/b"], capsys)
    assert code == 0 and len(seen) == 1
    assert (seen[0].eval_dir, seen[0].output_dir, seen[0].bootstrap, seen[0].figures) == (
        "data/eval",
        "reports/b",
        7,
        False,
    )
    config.write_text("eval_dir: data/eval\noutput_dir: reports/a\nbootstraps: 7\n")
    code, _, err = run_command(["evaluate", "--config", str(config)], capsys)
    assert code == 2 and "bootstraps" in err and not seen[1:]


def test_demo_reads_a_config_file_with_the_loading_flags(tmp_path, capsys, monkeypatch):
    import hf_msv.demo as demo

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda config: seen.append(config) or [])
    config = tmp_path / "demo.yaml"
    config.write_text("problems: 3\nmodel_dtype: float32\ndevice_map: cpu\nfigure: false\n")
    assert run_command(["demo", "--config", str(config), "--problems", "2"], capsys)[0] == 0
    assert (seen[0].problems, seen[0].model_dtype, seen[0].device_map, seen[0].figure) == (2, "float32", "cpu", False)
    assert ModelArguments.from_fields(seen[0]).device_map == "cpu"


def test_log_level_info_shows_the_library_info_lines(tmp_path, capsys):
    code, _, err = run_command(collect_args(tmp_path / "quiet"), capsys)
    assert code == 0 and "INFO hf_msv" not in err
    code, _, err = run_command(collect_args(tmp_path / "loud", "--log-level", "info"), capsys)
    assert code == 0 and "INFO hf_msv.collect.lm: loading the LM testbed" in err
    code, _, err = run_command(collect_args(tmp_path / "bad", "--log-level", "chatty"), capsys)
    assert code == 2 and "--log-level" in err
