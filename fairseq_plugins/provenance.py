"""Provenance of every result file: the one record and its one Markdown rendering.

A number in ``results/`` must say how to regenerate it.  :func:`collect` gathers what every
result carries -- the command (with repo-relative paths), the git commit of the code (``+dirty``
when tracked code differs from it), the hardware and software, the time -- plus whatever the
caller adds (config, data, sacreBLEU signature, updates, wall time); :func:`markdown` renders
such a record as the ``## Provenance`` section of a Markdown result.  It lives in the plugin (its
analysis CLIs record provenance too) and :mod:`mt_pipeline.provenance` re-exports it.
"""

import hashlib
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Dict, Iterable, Optional

__all__ = ["ROOT", "CODE_DIRS", "git_commit", "hardware", "command_line", "repo_relative", "collect",
           "markdown", "file_sha256"]

#: the repository root (the directory holding ``mt_pipeline/`` and ``fairseq_plugins/``)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: tracked paths whose uncommitted changes make a result ``+dirty`` (results/ and docs do not)
CODE_DIRS = ("fairseq_plugins", "mt_pipeline", "scripts", "configs", "data-prep", "setup.cfg")


def git_commit(root: str = ROOT) -> str:
    """``<sha>``, or ``<sha>+dirty`` when tracked files under :data:`CODE_DIRS` differ from the
    commit; ``unknown`` outside a git checkout (e.g. an installed wheel)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=30)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_DIRS],
                               cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        return sha.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def file_sha256(path: str, algo: str = "sha256") -> str:
    """Hex SHA-256 of a file (checkpoints, data), read in 1 MiB blocks; ``algo`` another
    :func:`hashlib.new` algorithm (mt-prep checks the md5 sums sacreBLEU records for test sets)."""
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hardware() -> Dict[str, object]:
    """CPU model, cores, torch threads, accelerator, torch/python versions (torch imported here)."""
    cpu = platform.processor() or platform.machine() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu only"
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "accelerator": dev, "torch": torch.__version__, "python": platform.python_version()}


def repo_relative(word: str, root: str = ROOT) -> str:
    """``word`` with a path inside the repository written relative to it (sibling directories
    such as ``/work/main2`` are not inside ``/work/main``); anything else unchanged."""
    if not os.path.isabs(word):
        return word
    try:
        inside = os.path.commonpath([os.path.abspath(word), root]) == root
    except ValueError:  # different drives
        return word
    return os.path.relpath(word, root) if inside else word


def command_line(prog: str, argv: Optional[Iterable[str]] = None) -> str:
    """The shell command that reran this one: ``prog`` and ``argv`` (default ``sys.argv[1:]``),
    quoted, repo paths relative."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([prog] + [shlex.quote(repo_relative(str(a))) for a in args])


def collect(command: str, **extra) -> Dict[str, object]:
    """The provenance record of one result: ``command``, ``git_commit``, ``hardware``, ``time``
    (local, ``%Y-%m-%d %H:%M:%S``) and every keyword in ``extra`` (e.g. ``config``, ``data``,
    ``sacrebleu``, ``updates``, ``wall_s``; values must be JSON-serialisable)."""
    rec = {"command": command, "git_commit": git_commit(), "hardware": hardware(),
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    rec.update(extra)
    return rec


def _fmt(value) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown(record: Dict[str, object], title: str = "Provenance", level: int = 2) -> str:
    """Render a :func:`collect` record as a Markdown section: a heading and one bullet per key
    (the command and the commit in code spans), ending with a newline."""
    lines = ["#" * level + f" {title}", ""]
    for key, value in record.items():
        label = key.replace("_", " ")
        if key in ("command", "git_commit"):
            lines.append(f"- {label}: `{value}`")
        else:
            lines.append(f"- {label}: {_fmt(value)}")
    return "\n".join(lines) + "\n"
