"""Every code sample of the documentation runs, and the documentation site builds.

Conventions for ``docs/*.md`` and ``README.md`` (fences at the start of a line only):

* ```` ```python ```` blocks run top to bottom, one namespace per page, as one script would: the
  namespace is a fresh module installed as ``__main__`` while the page runs (so
  ``if __name__ == "__main__":`` guards run, and worker processes forked from this one find the
  page's functions), in a fresh temporary working directory.
* ``print(EXPRESSION)  # OUTPUT`` on one line of a python block quotes what it prints: the sample checks that
  ``str(EXPRESSION)`` is ``OUTPUT``, where ``...`` matches any text (as in transcripts, below).
* ``<!-- file: NAME -->`` on the line before a python block: the block is a script that a later
  console block runs; it is written to ``NAME`` in the working directory and only compiled here.
* ``<!-- not-executed: needs MODULE -->`` on the line before a python block: the block needs an
  optional package; it runs when ``MODULE`` is importable and is only compiled otherwise.
* ```` ```console ```` blocks are transcripts: ``$ command`` lines, each followed by the output it
  must print (stdout and stderr together). ``...`` matches any text within a line, and any number
  of lines when it stands on a line of its own.
  ``guideloom ...`` commands run in this process through the CLI's entry point (so torch is not
  imported again for every command), ``echo $?`` prints the previous command's exit status, and
  any other command runs in a shell whose ``PATH`` starts with this interpreter's directory.
* Other blocks (``bash``, ``text``, no language) are illustrations and do not run.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import tokenize
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from guideloom._cli import main as guideloom_main

REPOSITORY = Path(__file__).resolve().parents[2]
PAGES = [*sorted((REPOSITORY / "docs").glob("*.md")), REPOSITORY / "README.md"]
FENCE = re.compile(r"^```([\w-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(file|not-executed):\s*(.*?)\s*-->\s*$")
NEEDS = re.compile(r"^needs\s+([\w.]+)$")
DISTRIBUTED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # line number (1-based) of the block's first code line in its page
    marker: tuple[str, str] | None  # ("file", NAME) or ("not-executed", REASON)


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, with the marker comment on the line before each, if any."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        assert end < len(lines), f"{page.name}: the fence opened on line {index + 1} is never closed"
        marker = MARKER.match(lines[index - 1]) if index > 0 else None
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(opening.group(1), code, index + 2, marker.groups() if marker else None))  # type: ignore[arg-type]
        index = end + 1
    return found


RUNNABLE = ("python", "console")
SAMPLE_PAGES = [page for page in PAGES if any(block.language in RUNNABLE for block in blocks(page))]


def test_every_page_but_the_format_reference_has_samples() -> None:
    assert {page.name for page in PAGES} - {page.name for page in SAMPLE_PAGES} <= {"format.md"}


def page_id(page: Path) -> str:
    return page.relative_to(REPOSITORY).as_posix()


def numbered(block: Block) -> str:
    return "\n".join(f"{block.line + offset:5} | {line}" for offset, line in enumerate(block.code.splitlines()))


def failure(page: Path, block: Block, number: int, detail: str) -> str:
    return (
        f"{page_id(page)}: {block.language} block {number} (line {block.line}) failed:\n{numbered(block)}\n\n{detail}"
    )


QUOTED_OUTPUT = "__quoted_output__"  # the name the check of a quoted output has in a page's namespace


def check_quoted_output(value: object, quoted: str) -> None:
    """``print(value)``, and fail unless it printed what the page quotes beside it."""
    printed = str(value)
    print(printed)
    if not output_matches(quoted, printed):
        raise AssertionError(f"printed:\n{printed}\nbut the page quotes:\n{quoted}")


class QuotedOutputs(ast.NodeTransformer):
    """Turns each one-line ``print(x)  # OUTPUT`` of a block into ``__quoted_output__(x, "OUTPUT")``."""

    def __init__(self, source: str) -> None:
        lines = io.StringIO(source).readline
        self.comments = {
            token.start[0]: token.string[1:].strip()
            for token in tokenize.generate_tokens(lines)
            if token.type == tokenize.COMMENT
        }

    def visit_Expr(self, node: ast.Expr) -> ast.stmt:
        call = node.value
        quoted = self.comments.get(node.lineno)
        if (
            quoted is None
            or node.end_lineno != node.lineno
            or not isinstance(call, ast.Call)
            or not isinstance(call.func, ast.Name)
            or call.func.id != "print"
            or len(call.args) != 1
            or call.keywords
        ):
            return node
        checked = ast.Call(ast.Name(QUOTED_OUTPUT, ast.Load()), [call.args[0], ast.Constant(quoted)], [])
        return ast.copy_location(ast.Expr(ast.copy_location(checked, call)), node)


def compile_block(page: Path, block: Block) -> types.CodeType:
    # Padding puts each line at its line number in the page, so tracebacks point into the page itself.
    source = "\n" * (block.line - 1) + block.code
    tree = QuotedOutputs(source).visit(ast.parse(source, str(page)))
    return compile(ast.fix_missing_locations(tree), str(page), "exec")


def shell_environment() -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key not in DISTRIBUTED_VARIABLES}
    environment["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), environment.get("PATH", "")])
    return environment


def run_command(command: str, previous_status: int) -> tuple[int, str]:
    """Run one transcript command in the working directory: its exit status and its output."""
    if command == "echo $?":
        return 0, f"{previous_status}\n"
    words = shlex.split(command)
    if words and words[0] == "guideloom":
        output = io.StringIO()
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            try:
                status = guideloom_main(words[1:])
            except SystemExit as error:  # argparse's usage errors
                status = error.code if isinstance(error.code, int) else 1
        return status, output.getvalue()
    completed = subprocess.run(
        command,
        shell=True,
        env=shell_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
        check=False,
    )
    return completed.returncode, completed.stdout


def transcript(code: str) -> list[tuple[str, str]]:
    """The ``(command, expected output)`` pairs of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].strip(), []))
        else:
            assert steps, f"console output before the first '$ ' command: {line!r}"
            steps[-1][1].append(line)
    return [(command, "\n".join(expected)) for command, expected in steps]


def output_matches(expected: str, actual: str) -> bool:
    """Line by line; ``...`` matches any text within a line, or any lines when it is a line of its own."""

    def normal(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")

    pattern = ""
    for line in normal(expected).splitlines():
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += "[^\n]*".join(re.escape(part) for part in line.split("...")) + r"\n"
    text = normal(actual)
    return re.fullmatch(pattern, text + "\n" if text else "") is not None


def run_console(page: Path, block: Block, number: int) -> None:
    status = 0
    for command, expected in transcript(block.code):
        status, output = run_command(command, status)
        if not output_matches(expected, output):
            pytest.fail(
                failure(
                    page,
                    block,
                    number,
                    f"$ {command}\nexpected:\n{expected}\n\nprinted (exit status {status}):\n{output}",
                ),
                pytrace=False,
            )


def should_execute(page: Path, block: Block) -> bool:
    """Whether a python block runs here (else it is only compiled); writes the scripts of ``file:`` markers."""
    if block.marker is None:
        return True
    kind, argument = block.marker
    if kind == "file":
        Path(argument).write_text(block.code, encoding="utf-8")
        return False
    needs = NEEDS.match(argument)
    assert needs is not None, f"{page_id(page)} line {block.line}: write <!-- not-executed: needs MODULE -->"
    return importlib.util.find_spec(needs.group(1)) is not None


def run_python(page: Path, block: Block, number: int, namespace: dict[str, object]) -> None:
    trace = None
    try:
        code = compile_block(page, block)  # every block, executed or not, must at least compile
        if should_execute(page, block):
            namespace[QUOTED_OUTPUT] = check_quoted_output
            exec(code, namespace)
    except Exception as error:
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next))  # type: ignore[union-attr]
    if trace is not None:  # failing outside the except block keeps pytest's output to one traceback
        pytest.fail(failure(page, block, number, trace), pytrace=False)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("page", SAMPLE_PAGES, ids=page_id)
def test_code_samples_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    runnable = [block for block in blocks(page) if block.language in RUNNABLE]
    monkeypatch.chdir(tmp_path)
    for variable in DISTRIBUTED_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    module = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", module)
    # The samples are tiny: on a busy machine, intra-op threads only add contention (seconds per page).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    for number, block in enumerate(runnable, start=1):
        if block.language == "python":
            run_python(page, block, number, module.__dict__)
        else:
            run_console(page, block, number)


def test_an_output_quoted_beside_a_print_is_compared(capsys: pytest.CaptureFixture[str]) -> None:
    code = 'print("shard 2 is already committed (data/shards/2)")  # shard 2 is already committed (...)\n'
    exec(compile_block(REPOSITORY / "sample.md", Block("python", code, 1, None)), {QUOTED_OUTPUT: check_quoted_output})
    stale = Block("python", 'print("shard 2 is committed")  # shard 2 is already committed\n', 1, None)
    with pytest.raises(AssertionError, match="but the page quotes:\nshard 2 is already committed"):
        exec(compile_block(REPOSITORY / "sample.md", stale), {QUOTED_OUTPUT: check_quoted_output})
    assert capsys.readouterr().out == "shard 2 is already committed (data/shards/2)\nshard 2 is committed\n"


def test_markers_belong_to_python_blocks() -> None:
    """A marker before anything but a python block, or an indented fence, would silently skip a sample."""
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            assert not re.match(r"^\s+```(python|console)", line), f"{page_id(page)}:{number}: indented fence"
            if MARKER.match(line):
                following = lines[number] if number < len(lines) else ""
                assert following.strip() == "```python", f"{page_id(page)}:{number}: marker not before ```python"


def test_site_builds_strictly(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "WARNING" not in output, output


def test_readme_sample_runs_twice_in_one_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Running the README's "In code" sample again where it ran before works (no ShardExistsError)."""
    readme = REPOSITORY / "README.md"
    sample = next(block for block in blocks(readme) if block.language == "python")
    assert "TokenStorage(" in sample.code, "the README's first python block is no longer the 'In code' sample"
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile_block(readme, sample), {"__name__": "__main__"})
    assert sorted(path.name for path in (tmp_path / "data" / "tokens" / "shards").iterdir()) == [
        "000000000000.shard",
        "000000000001.shard",
    ]
