"""The documented commands still run: every shell command of README.md and docs/*.md (fenced
bash / sh / console / unlabelled blocks, and inline `...` spans that start with a launcher) is
parsed, and

- each Python entry point it runs (`python -m <module> [<sub>]`, `python scripts/*.py`,
  `python examples/*.py`, the same under mpirun, horovodrun and torchrun) answers `--help` with
  exit code 0 and lists the long options the documentation passes it;
- each shell script it runs (`bash scripts/*.sh`) exists (never run here: they install);
- each repository path it names exists;
- every relative link of those pages resolves (file and, for a Markdown target, its #anchor).

Nothing here launches mpirun: the launchers are only parsed, the entry points run alone."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
LAUNCHERS = {"python", "torchrun", "mpirun", "horovodrun", "bash", "pytest"}
SUBCOMMAND_MODULES = {"gtopk_hvd.bench"}  # `-m gtopk_hvd.bench <sub>`: the sub is the entry
SEPARATORS = {"|", "||", "&&", ";"}
PATH_ROOTS = {"scripts", "examples", "tests", "gtopk_hvd", "csrc", "results", "docs", ".ci",
              ".venv"}
HELP_TIMEOUT_S = 120

FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
PYTHON = re.compile(r"python(3(\.\d+)?)?$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class EntryPoint:
    """What a documented command runs: ("module", "gtopk_hvd.bench", "topk"), ("script",
    "scripts/studies/convergence.py", None) or ("shell", "scripts/ci/run_tests.sh", None)."""

    kind: str
    target: str
    sub: str | None = None

    def __str__(self) -> str:
        return " ".join(part for part in (self.target, self.sub) if part)

    def help_command(self) -> list[str]:
        if self.kind == "module":
            return [sys.executable, "-m", self.target, *([self.sub] if self.sub else []),
                    "--help"]
        return [sys.executable, self.target, "--help"]


@dataclass
class Documented:
    """Everything the documentation's commands use, with where each was found."""

    entry_points: dict[EntryPoint, set[str]] = field(default_factory=dict)  # -> long options
    paths: dict[str, set[str]] = field(default_factory=dict)  # path -> "file: command"
    errors: list[str] = field(default_factory=list)


def split_markdown(text: str) -> tuple[list[tuple[str, str]], str]:
    """(fenced blocks as (language, body), the prose with the blocks blanked out)."""
    blocks: list[tuple[str, str]] = []
    prose: list[str] = []
    language: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        match = FENCE.match(line)
        if language is None and match:
            language, body = match.group(1).lower(), []
            prose.append("")
        elif language is not None and line.strip() == "```":
            blocks.append((language, "\n".join(body)))
            language = None
            prose.append("")
        elif language is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def block_commands(body: str) -> list[str]:
    """The commands of a shell block: backslash continuations joined, one per line."""
    joined = re.sub(r"\\\n", " ", body)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def inline_commands(prose: str) -> list[str]:
    """Inline code spans (a span may wrap over lines of one paragraph) that start with a
    launcher, after any VAR=value assignments."""
    commands = []
    for span in INLINE_CODE.findall(prose):
        if "\n\n" in span:
            continue
        text = " ".join(span.split())
        words = [word for word in text.split() if not ENV_ASSIGNMENT.match(word)]
        if words and is_launcher(words[0]):
            commands.append(text)
    return commands


def is_launcher(word: str) -> bool:
    name = Path(word).name
    return (name in LAUNCHERS or bool(PYTHON.match(name))
            or word.startswith(".venv/bin/"))


def segments(tokens: list[str]) -> list[list[str]]:
    """A command line's tokens split at |, ||, && and ;."""
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            parts.append([])
        else:
            parts[-1].append(token)
    return [part for part in parts if part]


def long_options(tokens: list[str]) -> set[str]:
    """The --options given to an entry point (up to a lone `--`, which hands over to another
    command); values that are themselves quoted option lists are left out."""
    options = set()
    for token in tokens:
        if token == "--":
            break
        if token.startswith("--") and not any(c.isspace() for c in token):
            options.add(token.split("=", 1)[0])
    return options


def entry_point_of(tokens: list[str]) -> tuple[EntryPoint, list[str]] | None:
    """The entry point a command segment runs and the tokens after it, or None."""
    for i, token in enumerate(tokens):
        name = Path(token).name
        rest = tokens[i + 1:]
        if PYTHON.match(name) or name == "torchrun":
            for j, word in enumerate(rest):
                if word == "-m" and j + 1 < len(rest):
                    module, after = rest[j + 1], rest[j + 2:]
                    sub = None
                    if module in SUBCOMMAND_MODULES and after and not after[0].startswith("-"):
                        sub, after = after[0], after[1:]
                        if any(c in sub for c in "<>{}"):  # a placeholder: the module itself
                            sub = None
                    return EntryPoint("module", module, sub), after
                if word.endswith(".py"):
                    return EntryPoint("script", word), rest[j + 1:]
                if PYTHON.match(name) and not word.startswith("-"):
                    return None  # `python something-else`: not an entry point of ours
            return None
        if name == "bash" and rest:
            return EntryPoint("shell", rest[0]), rest[1:]
        if token.endswith(".sh") and i == 0:
            return EntryPoint("shell", token), rest
    return None


def repository_paths(tokens: list[str]) -> list[str]:
    """Tokens that name a file or folder of the repository (placeholders and globs left out)."""
    paths = []
    for token in tokens:
        candidate = token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
        if ("/" not in candidate or "://" in candidate
                or any(c in candidate for c in "<>*{}$~") or any(c.isspace() for c in candidate)):
            continue
        if candidate.split("/", 1)[0] in PATH_ROOTS:
            paths.append(candidate.rstrip("/"))
    return paths


def add_command(documented: Documented, where: str, command: str) -> None:
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError as error:
        documented.errors.append(f"{where}: cannot parse {command!r}: {error}")
        return
    for segment in segments(tokens):
        words = [word for word in segment if not ENV_ASSIGNMENT.match(word)]
        for path in repository_paths(words):
            documented.paths.setdefault(path, set()).add(f"{where}: {command}")
        found = entry_point_of(words)
        if found is not None:
            entry, after = found
            options = documented.entry_points.setdefault(entry, set())
            if entry.kind != "shell":
                options.update(long_options(after))


@cache
def documented_commands() -> Documented:
    documented = Documented()
    for doc in DOC_FILES:
        name = doc.relative_to(REPO_ROOT).as_posix()
        blocks, prose = split_markdown(doc.read_text(encoding="utf-8"))
        for language, body in blocks:
            if language in SHELL_LANGUAGES:
                for command in block_commands(body):
                    add_command(documented, name, command)
        for command in inline_commands(prose):
            add_command(documented, name, command)
    return documented


def python_entry_points() -> list[EntryPoint]:
    return sorted((e for e in documented_commands().entry_points if e.kind != "shell"),
                  key=str)


def shell_entry_points() -> list[EntryPoint]:
    return sorted((e for e in documented_commands().entry_points if e.kind == "shell"),
                  key=str)


def run_help(entry: EntryPoint) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        return subprocess.run(entry.help_command(), cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=HELP_TIMEOUT_S, env=environment)
    except subprocess.TimeoutExpired as error:
        return subprocess.CompletedProcess(error.cmd, -1, "", f"timed out after {error.timeout} s")


@pytest.fixture(scope="module")
def help_outputs() -> dict[EntryPoint, subprocess.CompletedProcess[str]]:
    """Every entry point's `--help`, run concurrently once for the module (TensorFlow and torch
    imports take seconds each)."""
    entries = python_entry_points()
    workers = max(1, min(8, 2 * (os.cpu_count() or 1), len(entries)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(entries, pool.map(run_help, entries), strict=True))


def test_the_documentation_has_commands() -> None:
    documented = documented_commands()
    assert documented.errors == []
    readme = [e for e in documented.entry_points if e.kind == "shell"]
    # The README's two commands; `.ci/run` runs the second.
    assert EntryPoint("shell", "scripts/ci/run_main.sh") in readme
    assert EntryPoint("shell", "scripts/ci/run_tests.sh") in readme
    assert "bash scripts/ci/run_tests.sh" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "bash scripts/ci/run_tests.sh" in (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert len(python_entry_points()) >= 5, python_entry_points()


@pytest.mark.parametrize("entry", python_entry_points(), ids=str)
def test_entry_point_answers_help(
        entry: EntryPoint,
        help_outputs: dict[EntryPoint, subprocess.CompletedProcess[str]]) -> None:
    if entry.kind == "script":
        assert (REPO_ROOT / entry.target).is_file(), f"{entry.target} does not exist"
    result = help_outputs[entry]
    assert result.returncode == 0, (
        f"`{' '.join(result.args[1:])}` exited {result.returncode}:\n{result.stderr[-3000:]}")
    text = result.stdout + result.stderr
    missing = sorted(option for option in documented_commands().entry_points[entry]
                     if option not in text)
    assert missing == [], f"{entry}: documented options its --help does not list: {missing}"


@pytest.mark.parametrize("entry", shell_entry_points(), ids=str)
def test_shell_entry_point_exists(entry: EntryPoint) -> None:
    path = REPO_ROOT / entry.target
    assert path.is_file(), f"{entry.target} does not exist"
    assert path.read_text(encoding="utf-8").startswith("#!"), f"{entry.target}: no shebang"


@pytest.mark.parametrize("path", sorted(documented_commands().paths), ids=str)
def test_path_in_a_command_exists(path: str) -> None:
    if path.startswith(".venv/") and not (REPO_ROOT / ".venv").is_dir():
        pytest.skip("no .venv here (scripts/ci/install.sh makes it)")
    where = sorted(documented_commands().paths[path])
    assert (REPO_ROOT / path).exists(), f"{path} does not exist; named in {where}"


def github_anchor(heading: str) -> str:
    """The #anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(doc: Path) -> frozenset[str]:
    _, prose = split_markdown(doc.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for line in prose.splitlines():
        match = HEADING.match(line)
        if match:
            anchor = github_anchor(match.group(2))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return frozenset(found)


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda d: d.relative_to(REPO_ROOT).as_posix())
def test_relative_links_resolve(doc: Path) -> None:
    _, prose = split_markdown(doc.read_text(encoding="utf-8"))
    prose = INLINE_CODE.sub("", prose)
    broken = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_text, _, anchor = target.partition("#")
        path = (doc.parent / path_text).resolve() if path_text else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert broken == [], f"{doc.relative_to(REPO_ROOT)}: broken links: {broken}"


def test_every_docs_page_is_listed_in_both_indexes() -> None:
    """README.md's Documentation list and docs/README.md link every page of docs/."""
    pages = {doc.name for doc in DOC_FILES if doc.parent.name == "docs"} - {"README.md"}
    for index, prefix in ((REPO_ROOT / "README.md", "docs/"),
                          (REPO_ROOT / "docs" / "README.md", "")):
        targets = {target.partition("#")[0] for target in LINK.findall(
            index.read_text(encoding="utf-8"))}
        unlisted = sorted(page for page in pages if prefix + page not in targets)
        assert unlisted == [], f"{index.relative_to(REPO_ROOT)} does not link {unlisted}"
