"""README.md's and docs/deploy.md's command and config blocks, run as a reader pastes them.

Every fenced block of the two documents is taken from the document itself, in order, and
run in one scratch folder per document that looks like a checkout (``data``, ``deploy``,
``rules`` and ``dashboards`` linked in), so a block that writes a file a later block reads
(a secret, a snapshot) works as it does for the reader:

- a ``yaml`` block with ``scrape_configs`` (or a ``- job_name`` continuing the one before)
  goes through ``promtool check config``; one with only web config keys through gpufleet's
  web config parser and its TLS context, with an ``openssl`` certificate under the names it
  gives; any other through gpufleet's config loader, and, when its sources can run here
  (the simulator), through ``assemble``, the start ``gpufleet serve`` makes short of binding
  the port (which reads the advisor's secret files). README's config blocks are also
  assembled pasted together, as one file;
- an ``sh`` block runs command by command: ``gpufleet`` from this checkout (``replay`` and
  ``load``, a minute and 5 s of CPU, are parsed by gpufleet's own parser only), ``openssl``
  as written, ``make`` as ``make -n``, VictoriaMetrics' binaries with ``-dryRun`` (the
  single-node server with vmagent's scrape config to check), and ``curl`` of a running
  exporter's ``/v1/snapshot`` as the default fleet's body. Absolute ``/etc`` and ``/var``
  paths land in the scratch folder.

The README's install block (``python3 -m venv``, ``pip install '.[extras]'``, ``export
PATH``) is checked here (the extras it names exist), and run for real by
:func:`test_the_readme_runs_installed_outside_the_checkout`: a fresh virtual environment with
only the documented install, and every README command run by that ``gpufleet``, in a folder
outside the checkout, without the checkout on ``PYTHONPATH`` (a repository file a command
names is given by its path in the clone, as a reader in another folder would).

A block that cannot run on one machine starts with ``# not run by the tests: needs ...``
(a Kubernetes cluster, root and systemd, a container daemon, a terminal): its ``gpufleet``
commands are still parsed and the repository files it names must exist. A block that fits
no runner and carries no such line fails the test, so a new block is either run or marked.
A block with no language is a drawing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, require_binary

DOCS = ("README.md", "docs/deploy.md")
# the README's config blocks are parts of one file; docs/deploy.md's are separate files
PASTED_TOGETHER = {"README.md": True, "docs/deploy.md": False}
NOT_RUN = re.compile(r"^# not run by the tests: (?P<why>needs .+)$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*) *$")
LINKED = ("data", "deploy", "rules", "dashboards")
REPO_PATH = re.compile(r"^(?:\./)?(?:data|deploy|rules|dashboards|docs|bench|exporter)/\S*$")
VM_BINARIES = ("victoria-metrics", "vmagent", "vmalert")
TIMEOUT = 60
# the wheels of a fresh install's dependencies, kept between runs: only a changed
# dependency is fetched from the package index again
WHEELHOUSE = REPO / ".venv" / "docs-wheelhouse"


def parse_only(argv: list[str]) -> str | None:
    """Why a gpufleet command takes longer than this test may (then it is parsed, not run)."""
    if argv[:1] == ["replay"]:
        return "21 placement runs: about a minute"
    if argv[:1] == ["load"]:
        return "six pools' 184 days by three policies: 5 s of CPU"
    if argv[:1] == ["analyze"] and "--placed-by" in argv:
        return "a placement of the whole trace: 2.5 s of CPU (tests/test_analyze_cmd.py runs one)"
    if argv[:1] == ["simulate"]:
        return "a day of arrivals: 10 s of CPU (run installed, outside the checkout, below)"
    return None


def pip_install(words: list[str]) -> list[str] | None:
    """What ``pip install`` installs in ``words`` (None: not a pip install)."""
    if Path(words[0]).name in ("pip", "pip3") and words[1:2] == ["install"]:
        return [w for w in words[2:] if not w.startswith("-")]
    return None


def extras_problem(specs: list[str]) -> str | None:
    """Why a ``.[extra,...]`` the install names is not one of pyproject's extras, if so."""
    import tomllib

    known = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                ["optional-dependencies"])
    for spec in (s for s in specs if s.startswith(".")):  # the clone's, not a built wheel
        match = re.fullmatch(r"\.(?:\[(?P<extras>[\w,-]+)\])?", spec)
        if match is None:
            return f"{spec}: not an install of the clone ('.' or '.[extras]')"
        unknown = set((match.group("extras") or "").split(",")) - known - {""}
        if unknown:
            return f"{spec}: no extra {', '.join(sorted(unknown))} in pyproject.toml"
    return None


@dataclasses.dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def not_run(self) -> str | None:
        first = self.text.split("\n", 1)[0]
        match = NOT_RUN.match(first)
        return match.group("why") if match else None


def blocks(doc: str, text: str) -> list[Block]:
    """The fenced blocks of ``text``, dedented by their fence's indentation (list items)."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, start, body = len(match.group("indent")), i, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        assert i < len(lines), f"{doc}:{start + 1}: fence never closed"
        out.append(Block(doc, start + 1, match.group("lang"), "\n".join(body) + "\n"))
        i += 1
    return out


def commands(text: str) -> Iterator[tuple[list[str], str | None]]:
    """(words, file its output is redirected to) of each simple command of a shell block."""
    for line in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        tokens = list(lexer)
        redirect = None
        for j, token in enumerate([*tokens, ";"]):
            if token in ("&&", "||", "|", ";", "&"):
                if words:
                    yield words, redirect
                words, redirect = [], None
            elif token == ">":
                redirect = tokens[j + 1] if j + 1 < len(tokens) else ""
            elif j == 0 or tokens[j - 1] != ">":
                words.append(token)


def gpufleet_argv(words: list[str]) -> list[str] | None:
    """The gpufleet argument list in ``words`` (also after ``kubectl exec ... --``)."""
    for j, word in enumerate(words):
        if Path(word).name == "gpufleet" and (j == 0 or words[j - 1] == "--"):
            return words[j + 1:]
    return None


def parse_gpufleet(argv: list[str]) -> str | None:
    """gpufleet's own parser over ``argv``: None, or what it says is wrong."""
    from exporter import cli

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser = cli._parser(cli._command(argv))
            args, extra = parser.parse_known_args(argv)
            if extra:
                return f"unrecognized arguments: {' '.join(extra)}"
            if args.command is None:
                return "no command"
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


class Session:
    """One document's blocks run in order in ``folder``; ``failures`` says what went wrong."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        for name in LINKED:
            (folder / name).symlink_to(REPO / name)
        self.failures: list[str] = []
        self.configs: list[Block] = []
        self.previous_scrape = ""
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.gpufleet = [sys.executable, "-m", "exporter"]  # this checkout's

    def fail(self, block: Block, message: str) -> None:
        self.failures.append(f"{block.where}: {message.strip()[-600:]}")

    def local(self, word: str) -> str:
        """``word`` with an absolute /etc or /var path moved into the scratch folder."""
        return re.sub(r"(^|=)/(etc|var)/", lambda m: f"{m.group(1)}{self.folder}/{m.group(2)}/", word)

    def run(self, block: Block) -> None:
        if block.lang == "":
            return  # a drawing
        if block.lang == "sh":
            self.shell(block)
        elif block.lang == "yaml":
            self.yaml(block)
        else:
            self.fail(block, f"no runner for a ```{block.lang} block")

    # --- shell -----------------------------------------------------------------------

    def installing(self, block: Block, words: list[str]) -> bool:
        """An install step of the README's (checked here: the fresh-venv test runs them)."""
        specs = pip_install(words)
        if specs is not None:
            problem = extras_problem(specs)
            if problem:
                self.fail(block, problem)
            return True
        return words[:3] == ["python3", "-m", "venv"] or words[0] == "export"

    def shell(self, block: Block) -> None:
        marked = block.not_run is not None
        for words, redirect in commands(block.text):
            if self.installing(block, words):
                continue
            self.check_paths(block, words)
            argv = gpufleet_argv(words)
            if argv is not None and (marked or words[0] != "gpufleet" or self.parse_only(argv)):
                problem = self.unrun(argv)
                if problem:
                    self.fail(block, f"gpufleet {' '.join(argv)}: {problem}")
                continue
            if marked:
                continue
            if argv is not None:
                self.command(block, [*self.gpufleet, *map(self.local, argv)], redirect)
                for out in self.outs(argv):
                    if not any(out.iterdir()):
                        self.fail(block, f"gpufleet {' '.join(argv)}: wrote nothing into {out}")
            elif words[0] == "openssl":
                self.command(block, [require_binary("openssl"), *words[1:]], redirect)
            elif words[0] == "make":
                self.command(block, ["make", "-n", *words[1:]], None, cwd=REPO)
            elif words[0] in VM_BINARIES:
                extra = ["-dryRun"]
                if words[0] == "victoria-metrics" and not any(
                        w.startswith("-promscrape.config=") for w in words):
                    extra.append("-promscrape.config=deploy/vmagent.yml")
                self.command(block, [require_binary(words[0]), *map(self.local, words[1:]), *extra],
                             redirect)
            elif words[0] == "curl" and words[-1].endswith("localhost:9874/v1/snapshot"):
                self.snapshot(block, redirect)
            else:
                self.fail(block, f"no runner for {words[0]!r}: run it, or start the block with "
                          "'# not run by the tests: needs ...'")

    def parse_only(self, argv: list[str]) -> str | None:
        return parse_only(argv)

    def unrun(self, argv: list[str]) -> str | None:
        """What is wrong with a command that is not run: its arguments, its trace."""
        return parse_gpufleet(argv) or self.trace(argv)

    def trace(self, argv: list[str]) -> str | None:
        """The ``--trace`` an unrun command names is there, looked up as gpufleet looks."""
        from exporter.analysis.openb import OpenbError, named_trace

        names = [argv[j + 1] for j, w in enumerate(argv[:-1]) if w == "--trace"]
        with contextlib.chdir(self.folder):
            try:
                for name in names:
                    named_trace(name)
            except OpenbError as exc:
                return str(exc)
        return None

    def outs(self, argv: list[str]) -> list[Path]:
        outs = [argv[j + 1] for j, w in enumerate(argv[:-1]) if w == "--out"]
        return [self.folder / self.local(out).removeprefix(str(self.folder) + "/") for out in outs]

    def check_paths(self, block: Block, words: list[str]) -> None:
        """Every file of this repository the command names exists (kubectl's ``deploy/NAME``
        is a Deployment, not a path: only its ``-k``/``-f`` values are files)."""
        if words[0] == "kubectl":
            words = [w for j, w in enumerate(words) if j and words[j - 1] in ("-k", "-f")]
        for word in words:
            value = word.partition("=")[2] if word.startswith("-") else word
            if REPO_PATH.match(value) and not list(REPO.glob(value.removeprefix("./"))):
                self.fail(block, f"{value}: no such file in the repository")

    def command(self, block: Block, cmd: list[str], redirect: str | None,
                cwd: Path | None = None, timeout: float = TIMEOUT) -> None:
        try:
            done = subprocess.run(cmd, cwd=cwd or self.folder, env=self.env, capture_output=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(block, f"{' '.join(cmd)}: still running after {timeout} s")
            return
        if done.returncode != 0:
            self.fail(block, f"{' '.join(cmd)}: exit {done.returncode}: "
                      f"{(done.stderr or done.stdout).decode(errors='replace')}")
        elif redirect:
            (self.folder / self.local(redirect)).write_bytes(done.stdout)

    def snapshot(self, block: Block, redirect: str | None) -> None:
        """What a running ``make run`` answers on /v1/snapshot: the default fleet's body."""
        from exporter.fleet_sim.fleet import Simulation
        from exporter.sources.sim.options import SimSource
        from exporter.web.server import snapshot_bodies

        if redirect is None:
            self.fail(block, "curl of /v1/snapshot without '> FILE'")
            return
        body, _ = snapshot_bodies(Simulation(SimSource(), start_time=1_760_000_000.0).snapshot(), 1)
        (self.folder / self.local(redirect)).write_bytes(body)

    # --- yaml ------------------------------------------------------------------------

    def yaml(self, block: Block) -> None:
        text = block.text
        if text.lstrip().startswith("- job_name"):  # continues the scrape_configs before it
            text = self.previous_scrape + text
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            self.fail(block, f"not YAML: {exc}")
            return
        if not isinstance(data, dict):
            self.fail(block, "not a YAML mapping")
        elif "scrape_configs" in data:
            self.previous_scrape = text
            self.prometheus(block, text)
        else:
            from exporter.web import webconfig

            if set(data) <= set(webconfig._TOP):
                self.web_config(block, text)
            else:
                self.configs.append(block)
                self.gpufleet_config(block, text)

    def prometheus(self, block: Block, text: str) -> None:
        path = self.folder / f"prometheus-{block.line}.yml"
        path.write_text(self.local_text(text))
        self.command(block, [require_binary("promtool"), "check", "config", str(path)], None)

    def local_text(self, text: str) -> str:
        return re.sub(r"(?<=[\s\[\"'])/(etc|var)/", f"{self.folder}/\\1/", text)

    def web_config(self, block: Block, text: str) -> None:
        from exporter.errors import ConfigError
        from exporter.web import webconfig
        from tests.helpers.tls import make_pki

        folder = self.folder / f"web-{block.line}"
        try:
            parsed = webconfig.parse(text, f"{block.where}", folder)
            tls = parsed.tls
            if tls is not None and tls.cert_file:
                # an openssl certificate under the names the block gives
                pki = make_pki(folder, name="web")
                Path(tls.cert_file).write_bytes(pki.cert.read_bytes())
                Path(tls.key_file).write_bytes(pki.key.read_bytes())
                webconfig.build_context(tls, block.where)
        except ConfigError as exc:
            self.fail(block, str(exc))

    def gpufleet_config(self, block: Block, text: str) -> None:
        path = self.folder / f"gpufleet-{block.line}.yaml"
        path.write_text(text)
        self.start(block, path)

    def start(self, block: Block, path: Path) -> None:
        """Load the config; where its sources run here, start it as ``serve`` would."""
        from exporter.cli.serve import assemble, enabled_sources
        from exporter.config import load
        from exporter.errors import ConfigError

        try:
            config = load(path)
            names = enabled_sources(config)
            if set(names) <= {"sim"}:
                with contextlib.chdir(self.folder):  # the outbox, relative secret files
                    assemble(config, names, clock=lambda: 1_760_000_000.0, timer=lambda: 0.0)
        except ConfigError as exc:
            self.fail(block, str(exc))

    def pasted_together(self) -> None:
        if len(self.configs) > 1:
            path = self.folder / "pasted-together.yaml"
            path.write_text("".join(b.text for b in self.configs))
            self.start(dataclasses.replace(self.configs[0], lang="yaml (pasted together)"), path)


def run_doc(doc: str, text: str, folder: Path) -> list[str]:
    session = Session(folder)
    for block in blocks(doc, text):
        session.run(block)
    if PASTED_TOGETHER.get(doc):
        session.pasted_together()
    return session.failures


@pytest.mark.parametrize("doc", DOCS)
def test_every_block_runs_as_written(doc: str, tmp_path: Path) -> None:
    failures = run_doc(doc, (REPO / doc).read_text(), tmp_path)
    assert not failures, "\n".join(failures)


def test_the_blocks_that_cannot_run_here_say_why() -> None:
    """Only deploy.md's cluster, root, container and terminal blocks are left unrun."""
    marked = {b.where: b.not_run for doc in DOCS for b in blocks(doc, (REPO / doc).read_text())
              if b.not_run}
    assert marked and all(why.startswith("needs ") for why in marked.values()), marked
    assert not [w for w in marked if w.startswith("README")], marked


def test_the_readme_names_the_address_make_run_binds() -> None:
    """issue 30: the README said 127.0.0.1 while ``make run`` bound every interface."""
    from exporter.config import DEFAULT_LISTEN

    readme = (REPO / "README.md").read_text()
    assert f"`make run` listens on {DEFAULT_LISTEN}" in readme
    assert "$(BIN)/gpufleet serve $(ARGS)" in (REPO / "Makefile").read_text()  # no --listen


BROKEN = """
```yaml
collect_interval: 5s
sources: {sim: {seeed: 42}}
```

```yaml
scrape_configs:
  - job_name: gpufleet-nodes
    scrape_intervall: 15s
```

```sh
gpufleet rules --outt rules-out
gpufleet replay --seeds 42 --policies nosuch
gpufleet analyze --trace openb-nosuch --placed-by fgd
make no-such-target
```

```sh
# not run by the tests: needs root
install -m 0644 deploy/no-such-file.yaml /etc/gpufleet/
```

```yaml
tls_server_config: {cert_file: a.crt, key_file: a.key, min_version: TLS14}
```

```yaml
advisor:
  receivers: [{name: s, url: "https://x.example/plan", secret_file: no-such-secret}]
```

```sh
python3 -m venv ~/v && ~/v/bin/pip install '.[replay,nosuch]'
```
"""


def test_a_wrong_block_fails(tmp_path: Path) -> None:
    """Each kind of runner fails on its kind of mistake, naming the block's line."""
    failures = run_doc("broken.md", BROKEN, tmp_path)
    assert len(failures) == 10, "\n".join(failures)
    expected = [
        ("broken.md:2: ", "sources.sim.seeed: unknown key"),
        ("broken.md:7: ", "field scrape_intervall not found"),
        ("broken.md:13: ", "unrecognized arguments: --outt"),
        ("broken.md:13: ", "nosuch"),
        ("broken.md:13: ", "trace 'openb-nosuch': no openb_pod_list_nosuch.csv"),
        ("broken.md:13: ", "No rule to make target"),
        ("broken.md:20: ", "deploy/no-such-file.yaml: no such file in the repository"),
        ("broken.md:25: ", "min_version: must be one of"),
        ("broken.md:29: ", "secret_file: cannot read no-such-secret"),
        ("broken.md:34: ", ".[replay,nosuch]: no extra nosuch in pyproject.toml"),
    ]
    for failure, (where, what) in zip(failures, expected, strict=True):
        assert failure.startswith(where) and what in failure, (failure, where, what)


# --- the README installed, outside the checkout ------------------------------------------------

# a command not run is checked by the installed gpufleet: its parser, the extra it needs, its
# trace (looked up in the clone's data/, as the README says to outside a checkout)
_UNRUN = """
import sys
from exporter import cli
from exporter.analysis.openb import named_trace
from exporter.extras import check_command
argv = sys.argv[1:]
args, extra = cli._parser(cli._command(argv)).parse_known_args(argv)
assert not extra, f"unrecognized arguments: {extra}"
check_command(args.command)
for j, word in enumerate(argv[:-1]):
    if word == "--trace":
        named_trace(argv[j + 1])
"""


class Installed(Session):
    """The README's shell blocks as a reader runs them after the README's own install: a
    fresh virtual environment under ``home``, the ``gpufleet`` its ``export PATH`` finds, run
    in ``folder``, outside the checkout and without it on PYTHONPATH."""

    def __init__(self, folder: Path, home: Path) -> None:
        self.folder, self.home = folder, home
        self.failures: list[str] = []
        self.configs: list[Block] = []
        self.previous_scrape = ""
        path = [p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(REPO))]
        # pip's own settings (its index, certificates) stay; the checkout's do not
        self.env = {**{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
                    "PATH": os.pathsep.join(path), "HOME": str(home), "LANG": "C.UTF-8"}
        self.gpufleet: list[str] = []
        self.python = ""
        self.install_seconds = 0.0  # the install from the kept wheels (printed: make test's budget)

    def run(self, block: Block) -> None:
        if block.lang == "sh":  # the config blocks are the checkout test's: no install in them
            self.shell(block)

    def expand(self, word: str) -> str:
        """``~`` and ``$HOME`` as the reader's shell reads them, in the test's home."""
        home = self.env["HOME"]
        return (home + word[1:] if word.startswith("~/") else word).replace("$HOME", home)

    def local(self, word: str) -> str:
        """A repository file a command names, by its path in the clone."""
        word = super().local(word)
        flag, eq, value = word.rpartition("=") if word.startswith("-") else ("", "", word)
        if REPO_PATH.match(value):
            return f"{flag}{eq}{REPO / value.removeprefix('./')}"
        return word

    def installing(self, block: Block, words: list[str]) -> bool:
        words = [self.expand(w) for w in words]
        if words[:3] == ["python3", "-m", "venv"]:
            # the interpreter the tests run on, outside its own virtual environment
            base = getattr(sys, "_base_executable", sys.executable)
            self.command(block, [base, "-m", "venv", *words[3:]], None)
        elif (specs := pip_install(words)) is not None:
            self.pip(block, words[0], specs)
        elif words[0] == "export":
            name, _, value = words[1].partition("=")
            if name == "PATH":
                self.env["PATH"] = value.replace("$PATH", self.env["PATH"])
                found = shutil.which("gpufleet", path=self.env["PATH"])
                self.gpufleet = [found] if found else []
                self.python = str(Path(found).parent / "python") if found else ""
        else:
            return False
        return True

    def pip(self, block: Block, pip: str, specs: list[str]) -> None:
        """``pip install`` as written, its dependencies from the kept wheels; those fetched
        from the package index only when a dependency is missing there."""
        # --no-compile: the bytecode of matplotlib and numpy is most of an install's CPU, and
        # changes nothing a command does
        install = [pip, "install", "-q", "--no-compile", "--no-index", "--find-links",
                   str(WHEELHOUSE), *specs]
        started = time.monotonic()
        done = subprocess.run(install, cwd=REPO, env=self.env, capture_output=True, timeout=600)
        self.install_seconds = time.monotonic() - started
        if done.returncode == 0:
            return
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        for fill in ([pip, "wheel", "-q", "-w", str(WHEELHOUSE), *specs],
                     [pip, "download", "-q", "-d", str(WHEELHOUSE), "setuptools>=68", "wheel"]):
            subprocess.run(fill, cwd=REPO, env=self.env, capture_output=True, timeout=600)
        for built in WHEELHOUSE.glob("gpufleet-*.whl"):  # the clone is built afresh each time
            built.unlink()
        self.command(block, install, None, cwd=REPO, timeout=600)

    def parse_only(self, argv: list[str]) -> str | None:
        # simulate runs: the arrival series it replays must come with the package
        return None if argv[:1] == ["simulate"] else parse_only(argv)

    def unrun(self, argv: list[str]) -> str | None:
        if not self.python:
            return "no gpufleet on PATH: the install block did not put it there"
        done = subprocess.run([self.python, "-c", _UNRUN, *argv], cwd=self.folder,
                              env={**self.env, "GPUFLEET_DATA": str(REPO / "data")},
                              capture_output=True, text=True, timeout=TIMEOUT)
        return None if done.returncode == 0 else (done.stderr or done.stdout)

    def shell(self, block: Block) -> None:
        for words, redirect in commands(block.text):
            if words[0] == "make":
                continue  # the checkout's Makefile: the checkout's test runs it
            if gpufleet_argv(words) is not None and not self.gpufleet:
                self.fail(block, "gpufleet before the install put it on PATH")
                return
            one = shlex.join(words) + (f" > {shlex.quote(redirect)}" if redirect else "")
            Session.shell(self, dataclasses.replace(block, text=one + "\n"))


@pytest.mark.slow
def test_the_readme_runs_installed_outside_the_checkout(tmp_path: Path) -> None:
    """issue 44: commands the README documents failed after the README's own install
    (no matplotlib, simulate's data not packaged, no word on PATH)."""
    home, folder = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    folder.mkdir()
    session = Installed(folder, home)
    started = time.monotonic()
    for block in blocks("README.md", (REPO / "README.md").read_text()):
        session.run(block)
    print(f"README installed and run in {time.monotonic() - started:.0f} s, "
          f"of which pip install {session.install_seconds:.0f} s")
    assert not session.failures, "\n".join(session.failures)
    assert session.gpufleet and session.gpufleet[0].startswith(str(home))
    # simulate ran installed, with no data/ here: its series came with the package
    assert (folder / "sim-out" / "outcomes.csv").is_file() and not (folder / "data").exists()
    assert (folder / "out" / "load.csv").exists() is False  # load is parsed, not run


def test_a_missing_extra_is_one_line_before_any_work(tmp_path: Path) -> None:
    """A command whose extra is not installed says so, with the install that adds it, and
    exits 2 before computing anything (simulate and replay computed for 30 s first)."""
    for argv, extra, what in [
            (["simulate", "--days", "14", "--out", "o"], "replay", "gpufleet simulate (timeline.png)"),
            (["replay", "--out", "o"], "replay", "gpufleet replay (replay.png)"),
            (["dashboards", "--out", "o"], "dashboards", "gpufleet dashboards")]:
        hidden = "matplotlib" if extra == "replay" else "grafanalib"
        done = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.modules[{hidden!r}] = None; "
             "from exporter.cli import main; sys.exit(main(sys.argv[1:]))", *argv],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
            text=True, timeout=60)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (f"gpufleet: {what} needs {hidden}, which is not installed: "
                               f"pip install 'gpufleet[{extra}]' (in a clone of gpufleet: "
                               f"pip install '.[{extra}]')\n")
        assert not (tmp_path / "o").exists()
