"""Builders shared by the test modules, so that no test module imports another.

tests/ is on ``sys.path`` under pytest (tests/ has no ``__init__.py``, and pytest's default ``prepend`` import mode
puts a test module's directory first on the path), so test modules import these as ``from helpers.generation import
...``; subprocess scripts and research/tests put tests/ on the path themselves.
Nothing here is collected: no module here is named ``test_*.py`` and nothing defined here is named ``test*``.

* `helpers.tokenizer`: the character-level tokenizer with whole-word tokens every tiny LM uses.
* `helpers.generation`: scripted tiny LMs and verifiers of the generation tests, and their reference computations.
* `helpers.collect`: the tiny scripted Llama, problems and settings of the collection tests.
* `helpers.shards`: synthetic collected problems and shard directories shaped like collected data.
* `helpers.modeling`: packed random verifier inputs of the MSVVerifier tests.
* `helpers.evaluation`: synthetic splits whose correctness is visible in the hidden states.
* `helpers.testbed`: a tiny trained testbed v2 LM (a module-scoped fixture).
* `helpers.launch`: what multi-process (``accelerate launch``) tests need.
* `helpers.lm_loading`: tiny LMs saved with remote code, device maps and offload (the LM-loading tests).
* `helpers.datasets_io`: problem tables in every format `load_problems` reads, and a stand-in for the Hub.
* `helpers.hub`: a recording stand-in for the Hub calls of an upload, offline model-card checks, checkpoint evidence.
* `helpers.harness`: lm-evaluation-harness samples and lighteval details rows built from their schemas.
* `helpers.cli`: ``hf-msv`` commands run in the test process.
* `helpers.vllm_engines`: CPU vLLM engines on the testbed LM and the serving tests' problems.
"""
