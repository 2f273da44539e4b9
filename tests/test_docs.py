"""Every fenced block of the project's READMEs runs as written.

Blocks are found by parsing the markdown, so a section someone adds is tested with no change
here. What a block is decides how it runs:

  * ```python: run with this interpreter; a block that calls ``hvd.`` runs under
    ``mpirun -np 2`` (every rank runs the whole snippet), any other in one process unless a
    ``ranks N`` marker says how many (a torch.distributed snippet: ``ranks 2``).
  * ```diff: its result (context and ``+`` lines) runs as a python block would: a porting diff
    must leave a script that works.
  * ```bash: each command runs in order, in a scratch folder that mirrors the repository's top
    level (so ``examples/...`` and ``.venv/bin/python`` resolve and outputs stay out of the tree),
    under ``set -euo pipefail``.
  * ```text: a picture, not code; never run.

A block without a language fails the test: say which it is. Markers in an HTML comment on the
lines just above a block change how it runs, and each is visible in the markdown source:

  * ``<!-- docs-test: skip: REASON -->``: not run; REASON is required and says where the block is
    exercised instead (a CI step) or why it cannot be.
  * ``<!-- docs-test: when WORD add FLAGS -->``: commands containing WORD get FLAGS appended (a
    CI-sized run of a long command). The README's prose must state FLAGS too, so a reader knows
    the tested command differs from the written one.
  * ``<!-- docs-test: when WORD env VAR=VALUE ... -->``: the same with environment variables.
  * ``<!-- docs-test: needs root -->``: skipped (with the reason) unless run as root with ``ip``
    and ``tc``.
  * ``<!-- docs-test: ranks N -->``: a python or diff block runs under ``mpirun -np N``.
"""
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests._launch import REPO, run_mpi

DOCS = sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("**/README.md")
              if not any(part.startswith(".") or part in ("build", "node_modules")
                         for part in p.relative_to(REPO).parts))
LANGUAGES = ("python", "diff", "bash", "text")
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
BLOCK_TIMEOUT = 300  # seconds for one block; the CI-sized commands take well under a minute


@dataclasses.dataclass
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    markers: list

    @property
    def id(self):
        return f"{self.doc}:{self.line}:{self.language or 'none'}"


def parse_blocks(text, doc="<doc>"):
    """The fenced blocks of a markdown text, each with the docs-test markers just above it."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*(\S*)", lines[i])
        if not m:
            i += 1
            continue
        fence, language, start = m.group(2), m.group(3), i
        markers, j = [], i - 1
        while j >= 0 and (MARKER.search(lines[j]) or not lines[j].strip()):
            markers[:0] = MARKER.findall(lines[j])
            j -= 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(m.group(1)):] if lines[i].startswith(m.group(1)) else lines[i])
            i += 1
        blocks.append(Block(doc, start + 1, language, "\n".join(body) + "\n", markers))
        i += 1
    return blocks


def visible_text(text):
    """The markdown without its HTML comments: what a reader of the rendered page sees."""
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def all_blocks():
    return [b for doc in DOCS for b in parse_blocks((REPO / doc).read_text(), doc)]


BLOCKS = all_blocks()


def test_the_readme_and_the_examples_readme_are_scanned():
    assert "README.md" in DOCS and "examples/dlrm/README.md" in DOCS, DOCS
    languages = {b.language for b in BLOCKS}
    assert {"python", "bash", "diff"} <= languages, languages


def test_parser_finds_blocks_their_language_and_markers():
    text = ("intro\n<!-- docs-test: skip: needs a GPU -->\n\n```bash\necho hi\n```\n"
            "```python\nprint(1)\n```\n  ```\nuntyped\n  ```\n")
    a, b, c = parse_blocks(text)
    assert (a.language, a.code, a.markers) == ("bash", "echo hi\n", ["skip: needs a GPU"])
    assert (b.language, b.code, b.markers) == ("python", "print(1)\n", [])
    assert (c.language, c.code, c.line) == ("", "untyped\n", 10)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_every_block_says_what_it_is(block):
    assert block.language in LANGUAGES, (
        f"{block.id}: fenced block without a known language ({block.language!r}); "
        f"use one of {LANGUAGES} so the docs test knows how to run it")
    for marker in block.markers:
        assert re.match(r"(skip: \S.*|when \S+ (add|env) \S.*|needs root|ranks [1-9])$", marker), (
            f"{block.id}: unknown docs-test marker {marker!r}")


@pytest.mark.parametrize("block", [b for b in BLOCKS
                                   if any(re.match(r"when \S+ (add|env) ", m) for m in b.markers)],
                         ids=lambda b: b.id)
def test_reduced_flags_are_stated_in_the_doc(block):
    text = " ".join(visible_text((REPO / block.doc).read_text()).split())
    for marker in block.markers:
        m = re.match(r"when \S+ (?:add|env) (.*)$", marker)
        if m:
            assert " ".join(m.group(1).split()) in text, (
                f"{block.id}: the test runs it with {m.group(1)!r}; the doc must say so")


def diff_result(code):
    """The text a diff leaves: its context and added lines."""
    return "\n".join(line[1:] for line in code.splitlines()
                     if line[:1] in (" ", "+") or line == "") + "\n"


def bash_commands(code):
    """Logical commands of a bash block: continuation lines joined, comment-only lines dropped."""
    commands, current = [], ""
    for line in code.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line
        if current.rstrip().endswith("\\"):
            current = current.rstrip()[:-1] + " "
            continue
        commands.append(current.strip())
        current = ""
    if current:
        commands.append(current.strip())
    return commands


def reduce_command(command, markers):
    """A command with the block's `when WORD add/env ...` markers applied."""
    for marker in markers:
        m = re.match(r"when (\S+) (add|env) (.*)$", marker)
        code, sep, comment = command.partition(" #")
        if not m or m.group(1) not in code:
            continue
        if m.group(2) == "env":
            command = f"{m.group(3)} {command}"
        else:
            command = f"{code.rstrip()} {m.group(3)}" + (f"  #{comment}" if sep else "")
    return command


def test_reduce_command_appends_flags_before_a_trailing_comment():
    markers = ["when train.py add --steps 4", "when quality.sh env SEEDS=0"]
    assert reduce_command("python train.py --x 1   # note", markers) == (
        "python train.py --x 1 --steps 4  # note")
    assert reduce_command("bash quality.sh", markers) == "SEEDS=0 bash quality.sh"
    assert reduce_command("ls", markers) == "ls"
    assert reduce_command("ls  # not train.py", markers) == "ls  # not train.py"


def scratch_dir(tmp):
    """A folder whose entries link to the repository's top level (outputs land in the folder)."""
    for entry in REPO.iterdir():
        if entry.name not in (".git",):
            os.symlink(entry, tmp / entry.name)
    if not (tmp / ".venv").exists():  # a checkout whose interpreter lives elsewhere
        venv = pathlib.Path(sys.prefix)  # the virtualenv, not the interpreter its python links to
        os.symlink(venv, tmp / ".venv")
    return tmp


def block_env():
    env = dict(os.environ)
    bindir = str(pathlib.Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
               OMPI_MCA_oob_tcp_if_include="lo", OMPI_MCA_rmaps_base_oversubscribe="1",
               OMP_NUM_THREADS="1", HOROVOD_LOG_LEVEL="warning", MPLBACKEND="Agg")
    return env


def can_emulate_links():
    return (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip")
            and shutil.which("tc"))


def block_ranks(block, code):
    """Processes a python block runs on: its `ranks N` marker, else 2 if it calls hvd., else 1."""
    for marker in block.markers:
        if marker.startswith("ranks "):
            return int(marker.split()[1])
    return 2 if re.search(r"\bhvd\.", code) else 1


def test_python_blocks_run_on_the_ranks_their_code_or_marker_asks_for():
    plain = Block("d", 1, "python", "print(1)\n", [])
    assert block_ranks(plain, plain.code) == 1
    assert block_ranks(plain, "hvd.init()\n") == 2
    assert block_ranks(Block("d", 1, "python", "", ["ranks 3"]), "import torch.distributed") == 3


def run_python(code, name, tmp, ranks=1):
    script = tmp / f"{name}.py"
    script.write_text(code)
    if ranks > 1:
        return run_mpi(str(script), np=ranks, timeout=BLOCK_TIMEOUT)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp, env=block_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{proc.stdout}"
    return proc.stdout


def run_bash(commands, name, tmp):
    work = scratch_dir(tmp / "repo")
    script = "set -euo pipefail\n" + "".join(
        f"echo '+ {c}' | cut -c1-200\n{c}\n" for c in commands)
    proc = subprocess.run(["bash", "-c", script], cwd=work, env=block_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT,
                          start_new_session=True)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{proc.stdout[-8000:]}"
    return proc.stdout


RUNNABLE = [b for b in BLOCKS if b.language in ("python", "diff", "bash")]


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_block_runs_as_written(block, tmp_path):
    skips = [m for m in block.markers if m.startswith("skip:")]
    if skips:
        pytest.skip(f"{block.id}: {skips[0]}")
    if "needs root" in block.markers and not can_emulate_links():
        pytest.skip(f"{block.id}: needs root with ip and tc (emulated links)")
    name = re.sub(r"\W+", "_", block.id)
    (tmp_path / "repo").mkdir()
    if block.language == "bash":
        run_bash([reduce_command(c, block.markers) for c in bash_commands(block.code)], name,
                 tmp_path)
    else:
        code = diff_result(block.code) if block.language == "diff" else block.code
        run_python(code, name, tmp_path, block_ranks(block, code))
