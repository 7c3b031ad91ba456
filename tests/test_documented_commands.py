"""The commands the documentation gives are commands that run: every option of every documented call
of one of our console scripts or ``python -m`` modules (README.md, docs/*.md and the results pages, whose commands regenerate
their numbers) is an option of that script (of its subcommand, of its corpus for ``mt-prep``), every
``reproduce PAPER TABLE [--scale S]`` names a table that exists at that scale, and every
``fairseq-train`` / ``fairseq-generate`` / ``fairseq-interactive`` call in a code block parses with
fairseq's own parser and the plugin loaded (``--user-dir``), arch-specific options included; and
every relative Markdown link of the documentation names a file of the checkout.

What is not checked: option *values* (paths, placeholders such as ``CK`` or ``<paper>``), the
fairseq calls written inline in prose (``fairseq-train --fp16``: mentions of one flag, without the
data directory and architecture a parse needs), and fairseq calls with a user directory of the
reader's own (docs/extending.md: tests/test_extending.py runs them), ``fairseq-hydra-train``
(tests/test_hydra.py composes each, found by the same :func:`doc_commands.documented_commands`).
"""

import configparser
import contextlib
import glob
import importlib
import inspect
import io
import os
import re
import shlex
import sys

import pytest
from doc_commands import documented_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAIRSEQ = {"fairseq-train": "get_training_parser", "fairseq-generate": "get_generation_parser",
           "fairseq-interactive": "get_interactive_generation_parser"}
#: scripts whose first positional argument selects another parser (a subcommand, mt-prep's corpus)
SUBCOMMANDS = {"mt-campaign", "mt-table", "mt-flexible-sweep", "mt-prep"}
SHELL_END = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}


def _console_scripts():
    """``{name: "module:function"}`` of setup.cfg's console scripts."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    out = {}
    for line in cfg["options.entry_points"]["console_scripts"].splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, target = (x.strip() for x in line.split("=", 1))
            out[name] = target
    return out


SCRIPTS = _console_scripts()
# ``python -m MODULE`` calls of our modules that have a main() but no console script
SCRIPTS.update({f"python -m {m}": f"{m}:main" for m in ("mt_pipeline.significance",)})
#: the names of the scripts checked, longest first (one name may begin another)
NAME = "|".join(re.escape(n) for n in sorted(set(SCRIPTS) | set(FAIRSEQ), key=len, reverse=True))


def _files():
    return (["README.md"] + sorted(glob.glob("docs/*.md", root_dir=ROOT))
            + sorted(glob.glob("results/**/*.md", root_dir=ROOT, recursive=True)))


COMMANDS = [(f, kind, c) for f in _files() for kind, c in documented_commands(os.path.join(ROOT, f), NAME)]


def _tokens(command):
    """The command's words up to the first shell operator; Markdown table pipes unescaped, optional
    ``[...]`` brackets, ``<placeholder>`` angle brackets and an elided ``...`` dropped."""
    text = command.replace("\\|", "|").replace("[", " ").replace("]", " ").replace("<", "").replace(">", " > ")
    text = text.replace(" >  > ", " >> ").replace("2 > &1", "2>&1")
    toks = shlex.split(text)
    end = next((i for i, t in enumerate(toks) if t in SHELL_END), len(toks))
    return [t for t in toks[:end] if t not in ("...", "…")]  # an elision: "the other options"


_HELP = {}


def _help(name, sub):
    """The ``--help`` text of console script ``name`` (of its subcommand / corpus ``sub``), run in
    this process."""
    if (name, sub) not in _HELP:
        module, func = SCRIPTS[name].split(":")
        fn = getattr(importlib.import_module(module), func)
        argv = ([sub] if sub else []) + ["--help"]
        buf, old = io.StringIO(), sys.argv
        sys.argv = [name, *argv]
        try:
            with contextlib.redirect_stdout(buf):
                code = fn(argv) if inspect.signature(fn).parameters else fn()
        except SystemExit as stop:  # argparse's --help exits; mt-prep's returns
            code = stop.code
        finally:
            sys.argv = old
        assert code in (0, None), f"{name} {' '.join(argv)} exited with {code}"
        _HELP[(name, sub)] = buf.getvalue()
    return _HELP[(name, sub)]


def _script(toks):
    """``(script name, its arguments)`` of a command's words (``python -m MODULE`` is one name)."""
    n = 3 if toks[:2] == ["python", "-m"] else 1
    return " ".join(toks[:n]), toks[n:]


def _is_ours(command):
    return _script(command.split())[0] in SCRIPTS


def _options(toks):
    return [t.split("=", 1)[0] for t in toks if t.startswith("--") and len(t) > 2]


def test_the_documentation_calls_scripts_at_all():
    """The extraction finds the commands (a broken pattern would make the tests below vacuous)."""
    names = {_script(c.split())[0] for _, _, c in COMMANDS}
    assert len(COMMANDS) > 200 and {"reproduce", "mt-campaign", "mt-prep", "fairseq-train",
                                    "python -m mt_pipeline.significance"} <= names, names
    assert sum(kind == "block" and c.startswith("fairseq-train ") for _, kind, c in COMMANDS) >= 2


@pytest.mark.parametrize("where,command", [(f, c) for f, _, c in COMMANDS if _is_ours(c)],
                         ids=lambda x: x[:60] if isinstance(x, str) else None)
def test_documented_options_are_options_of_their_script(where, command):
    name, args = _script(_tokens(command))
    subs = [None]
    if name in SUBCOMMANDS and args and not args[0].startswith("-"):
        subs = args[0].split("|")  # "run|status|render": each of them
    for sub in subs:
        text = _help(name, sub)
        missing = [o for o in _options(args) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
        assert not missing, f"{where}: `{command}`: {name}{' ' + sub if sub else ''} has no {', '.join(missing)}"


@pytest.mark.parametrize("where,command", [(f, c) for f, _, c in COMMANDS if c.split()[0] == "reproduce"],
                         ids=lambda x: x[:60] if isinstance(x, str) else None)
def test_documented_reproduce_calls_name_a_table_at_that_scale(where, command):
    from mt_pipeline import reproduce

    toks = _tokens(command)
    pos = [t for t in toks[1:] if not t.startswith("-")]
    if len(pos) < 2 or pos[0] not in reproduce.TABLES:  # placeholders: reproduce PAPER TABLE
        return
    scales = toks[toks.index("--scale") + 1].split("|") if "--scale" in toks else [None]
    for table in pos[1].split("|"):  # "table4|table5": each of them
        for scale in scales:
            try:
                reproduce.lookup(pos[0], table, scale)
            except SystemExit as err:
                pytest.fail(f"{where}: `{command}`: {err}")


def _plugin_only(command):
    """False for a call with a ``--user-dir`` of the user's own (docs/extending.md's ``my_attention``:
    tests/test_extending.py writes it and runs those calls)."""
    toks = command.split()
    return "--user-dir" not in toks or toks[toks.index("--user-dir") + 1].endswith("fairseq_plugins")


@pytest.mark.parametrize("where,command", [(f, c) for f, kind, c in COMMANDS
                                           if kind == "block" and c.split()[0] in FAIRSEQ and _plugin_only(c)],
                         ids=lambda x: x[:60] if isinstance(x, str) else None)
def test_documented_fairseq_calls_parse_with_the_plugin(where, command, monkeypatch):
    """fairseq's parser with ``--user-dir`` imports the plugin and adds the architecture's,
    criterion's and task's options; an unknown option is argparse's error (SystemExit 2)."""
    from fairseq import options

    monkeypatch.chdir(ROOT)
    toks = [os.path.expandvars(t.replace("$PWD", ROOT)) for t in _tokens(command)]
    parser = getattr(options, FAIRSEQ[toks[0]])()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            options.parse_args_and_arch(parser, toks[1:])
    except SystemExit:
        pytest.fail(f"{where}: `{command}` does not parse: {err.getvalue().strip()[-500:]}")


def test_relative_links_of_the_documentation_resolve():
    """Every relative Markdown link ``[text](path[#anchor])`` of README.md, docs/, results/,
    data-prep/ and configs/ names a file or folder of the checkout (a results page that points at
    a moved figure or run would otherwise go unnoticed)."""
    pages = _files() + sorted(glob.glob("data-prep/**/*.md", root_dir=ROOT, recursive=True)) + sorted(
        glob.glob("configs/**/*.md", root_dir=ROOT, recursive=True))
    links, broken = 0, []
    for page in pages:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            target = link.split("#")[0]
            if not target or re.match(r"[a-z]+:", target):  # an anchor on the page, a URL
                continue
            links += 1
            if not os.path.exists(os.path.join(ROOT, os.path.dirname(page), target)):
                broken.append(f"{page}: ({link})")
    assert links > 100 and not broken, broken
