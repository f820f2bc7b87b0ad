"""The README's code blocks run as written.

Python blocks run in order, one namespace per ``##`` section, in a fresh process on the shipped testbed LM and
verifier; bash blocks run command by command. A block preceded by a ``<!-- skip-test ... -->`` line (GPU, Hub, long
runs) is not run, but still has to compile, import names that exist, call hf_msv functions with keywords they
accept, and pass only flags its ``hf-msv`` command knows.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The pages this test also keeps free of broken links and development-process vocabulary.
PAGES = [README, ROOT / "docs/generation.md", ROOT / "docs/design.md", ROOT / "docs/results/README.md"]
SKIP_MARKER = "<!-- skip-test"
# The repository-wide vocabulary check's pattern, spelt with classes so that this file does not match it itself.
PROCESS_WORDS = re.compile(r"issue ?#|sit[t]ing|lea[s]e|\bsess[i]ons?\b", re.IGNORECASE)


@dataclass
class Block:
    lang: str
    code: str
    line: int  # README line of the opening fence
    section: str
    skip: bool


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with their ``##`` section and skip marker."""
    blocks, section, lines, i = [], "", text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            start, lang, body = i, line[3:].strip(), []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            blocks.append(
                Block(lang, "\n".join(body) + "\n", start + 1, section, previous.strip().startswith(SKIP_MARKER))
            )
        elif line.startswith("## "):
            section = line[3:].strip()
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))

# Runs in a fresh process: exec each section's blocks in one namespace, naming the README line that failed.
RUNNER = """
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespaces = {}
for block in blocks:
    namespace = namespaces.setdefault(block["section"], {"__name__": "__readme__"})
    try:
        exec(compile(block["code"], f"README.md:{block['line']}", "exec"), namespace)
    except Exception:
        traceback.print_exc()
        sys.exit(f"README.md line {block['line']} (section {block['section']!r}) failed")
"""


def commands(code: str) -> list[list[str]]:
    """The shell commands of a bash block: continuation lines joined, comments dropped, split like the shell."""
    return [words for line in code.replace("\\\n", " ").splitlines() if (words := shlex.split(line, comments=True))]


def hf_msv_help(command: str) -> str:
    """What ``hf-msv <command> --help`` prints, in this process."""
    from hf_msv import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return out.getvalue()


def env() -> dict:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return dict(
        os.environ,
        PATH=path,
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
    )


def test_readme_is_short_and_the_own_lm_recipe_comes_first():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    recipe = next(i for i, line in enumerate(lines) if line.startswith("## Use it on your own reasoning LM"))
    assert recipe < 120
    assert any(b.lang == "python" and not b.skip for b in BLOCKS), "the README has no runnable Python block"


def test_python_blocks_run_in_order_per_section(tmp_path):
    runnable = [asdict(b) for b in BLOCKS if b.lang == "python" and not b.skip]
    (tmp_path / "blocks.json").write_text(json.dumps(runnable))
    (tmp_path / "runner.py").write_text(RUNNER)
    result = subprocess.run(
        [sys.executable, "runner.py", "blocks.json"],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.lang == "bash" and not b.skip], ids=lambda b: f"line{b.line}"
)
def test_bash_blocks_run(block, tmp_path):
    for words in commands(block.code):
        result = subprocess.run(words, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{shlex.join(words)}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"


def _hf_msv_names(tree: ast.AST) -> dict[str, object]:
    """Every name a block imports from hf_msv, resolved (an ImportError or AttributeError fails the test)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hf_msv":
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name)
    return names


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python" and b.skip], ids=lambda b: f"line{b.line}")
def test_skipped_python_blocks_import_and_call_what_exists(block):
    tree = ast.parse(block.code, filename=f"README.md:{block.line}")
    names = _hf_msv_names(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names):
            continue
        target = names[node.func.id]
        target = target.__init__ if inspect.isclass(target) else target
        parameters = inspect.signature(target).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in parameters):
            continue
        known = {p.name for p in parameters}
        unknown = [k.arg for k in node.keywords if k.arg is not None and k.arg not in known]
        assert not unknown, f"README.md:{node.lineno + block.line}: {node.func.id}() takes no {unknown}"


def test_skipped_bash_commands_use_existing_flags_and_files():
    helps = {}
    for block in (b for b in BLOCKS if b.lang == "bash" and b.skip):
        for words in commands(block.code):
            if words[0] == "hf-msv":
                command = words[1]
                helps.setdefault(command, hf_msv_help(command))
                flags = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
                unknown = sorted(f for f in flags if not re.search(re.escape(f) + r"\b", helps[command]))
                assert not unknown, f"README.md:{block.line}: hf-msv {command} has no {unknown}"
            elif words[0] == "python" and words[1].endswith(".py"):
                assert (ROOT / words[1]).is_file(), f"README.md:{block.line}: no {words[1]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_link_only_what_a_clone_contains(page):
    text = page.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"
    assert "shared/" not in text, "a clone has no shared/ directory"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_carry_no_development_process_vocabulary(page):
    text = page.read_text(encoding="utf-8").replace("MSVSession", "")
    found = sorted({m.group(0) for m in PROCESS_WORDS.finditer(text)})
    assert not found, f"{page.name}: {found}"
