"""Registration with the Auto classes is explicit and idempotent, ``import hf_msv`` does the same whatever the program
is called, and running a command changes no attribute of argparse or transformers."""

import argparse
import json
import subprocess
import sys

import pytest
import transformers
from transformers import AutoConfig, AutoModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import hf_msv
from helpers.shards import write_dataset
from hf_msv.cli import COMMANDS, main

# What `import hf_msv` did: which heavy modules it imported, and whether the verifiers' model types are registered.
_IMPORT_EFFECT = """
import json, sys
sys.argv = [{argv0!r}]
import hf_msv
heavy = sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
print(json.dumps({{"heavy": heavy, "registered": [t for t in ("msv", "msv_probe") if t in CONFIG_MAPPING]}}))
"""


def _import_effect(argv0: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EFFECT.format(argv0=argv0)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_has_the_same_effect_whatever_the_program_is_called():
    as_command, as_script = _import_effect("/usr/local/bin/hf-msv"), _import_effect("my_script.py")
    assert as_command == as_script
    assert as_command == {"heavy": [], "registered": []}  # cheap: nothing heavy, nothing registered


def test_register_auto_classes_is_idempotent_and_registers_both_verifiers():
    from hf_msv.configuration_msv import MSVConfig
    from hf_msv.modeling_msv import MSVVerifier
    from hf_msv.modeling_probe import ProbeConfig, ProbeVerifier

    hf_msv.register_auto_classes()
    hf_msv.register_auto_classes()
    assert CONFIG_MAPPING["msv"] is MSVConfig and CONFIG_MAPPING["msv_probe"] is ProbeConfig
    assert AutoModel._model_mapping[MSVConfig] is MSVVerifier
    assert AutoModel._model_mapping[ProbeConfig] is ProbeVerifier
    assert isinstance(AutoConfig.for_model("msv"), MSVConfig)


def test_the_verifiers_carry_their_code_and_hf_msvs_uploader():
    from hf_msv.configuration_msv import MSVConfig
    from hf_msv.modeling_msv import MSVVerifier
    from hf_msv.modeling_probe import ProbeConfig, ProbeVerifier

    assert MSVConfig._auto_class == ProbeConfig._auto_class == "AutoConfig"
    assert MSVVerifier._auto_class == ProbeVerifier._auto_class == "AutoModel"
    assert MSVVerifier.hub_uploader() is hf_msv.push_verifier_to_hub  # the Probe uploads with it too


def _attributes(*owners) -> dict:
    return {(owner.__name__, name): value for owner in owners for name, value in vars(owner).items()}


_PATCHABLE = (
    argparse,
    argparse.ArgumentParser,
    argparse.Namespace,
    transformers,
    transformers.HfArgumentParser,
    transformers.PreTrainedModel,
    transformers.PreTrainedConfig,
    transformers.GenerationMixin,
    transformers.AutoConfig,
    transformers.AutoModel,
)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_changes_no_attribute_of_argparse_or_transformers(command, tmp_path, capsys):
    before = _attributes(*_PATCHABLE)
    with pytest.raises(SystemExit) as done:  # the command's module is imported and the Auto classes registered
        main([command, "--no-such-flag"])
    assert done.value.code == 2
    with pytest.raises(SystemExit):
        main([command, "--help"])
    capsys.readouterr()
    after = _attributes(*_PATCHABLE)
    # transformers' lazy module caches what it resolves (new names); nothing that was there is replaced
    assert {key for key in before if after.get(key, None) is not before[key]} == set()
    assert not {key for key in after.keys() - before.keys() if key[0] != "transformers"}


def test_a_command_that_runs_changes_no_attribute_of_argparse_or_transformers(tmp_path):
    (tmp_path / "shards").mkdir()
    write_dataset(tmp_path / "shards", num_problems=2)
    before = _attributes(*_PATCHABLE)
    main(
        [
            "export",
            "--shards",
            str(tmp_path / "shards"),
            "--output",
            str(tmp_path / "answers.jsonl"),
            "--format",
            "jsonl",
        ]
    )
    assert (tmp_path / "answers.jsonl").stat().st_size > 0
    after = _attributes(*_PATCHABLE)
    assert {key for key in before if after.get(key, None) is not before[key]} == set()
    assert not {key for key in after.keys() - before.keys() if key[0] != "transformers"}
