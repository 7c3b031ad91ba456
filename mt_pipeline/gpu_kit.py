"""The GPU kit: what an offline GPU machine needs to run the campaign (``mt-campaign gpu-kit``).

The lent GPU machines (Python 3.12, torch + CUDA and triton preinstalled, no network) lack a few
of this project's dependencies.  :func:`write_kit` writes a git-ignored folder (default
``.device/``) holding

* ``whl/`` -- cp312 / pure-Python wheels of the dependencies that image lacks (:data:`PACKAGES`;
  sdist-only pure-Python ones are built into wheels here) and fairseq-fixed's sdist (built in
  place there: its Cython extensions need the machine's compiler);
* ``data/`` -- what ``mt-prep`` reads of the plans' corpora in ``../shared/data``, under the same
  relative paths (:func:`mt_pipeline.prep.spec.shared_inputs`: ``multi30k_en_de/raw``; for the
  long documents the Maruf et al. sets, the IWSLT14 TED XML and newstest2014's sgm files), so
  ``mt-prep`` prepares the same data there (same BPE, same binarisation), and the few files of
  :data:`EXTRA_DATA` (newstest2014's English side, for ReLA Figure 2 on the GPU; the RWTH gold
  alignments, for ReLA Table 5's AER);
* ``KIT.json`` -- what is in it and the command that wrote it.

``scripts/device_setup.sh .device`` installs it there; docs/gpu.md has the commands that set up,
start the campaign with ``setsid``, poll it and bring back finished runs.  The folder stays under
the device tool's 64 MiB limit (checked here: :class:`SystemExit` if not).
"""

import glob
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List

from .provenance import ROOT, collect, repo_relative

__all__ = ["PACKAGES", "SDIST_ONLY", "EXTRA_DATA", "copy_extra_data", "corpus_inputs", "copy_corpus_data", "write_kit"]

#: dependencies missing from the GPU image (its package list: /work/.library/device/KINDS.md),
#: at the versions installed here (the ones the tests ran with)
PACKAGES = ["entmax", "subword-nmt", "mock", "sacremoses", "hydra-core", "omegaconf", "bitarray", "nltk",
            "defusedxml", "submitit", "cffi", "pycparser"]
#: pure-Python packages published only as sdists: built into wheels here
SDIST_ONLY = ["antlr4-python3-runtime"]
FAIRSEQ = "fairseq-fixed==0.12.3.1"
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    x for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64") for x in ("--platform", p)]
LIMIT_MIB = 60
#: files of ../shared/data every kit carries besides the plan's corpora (paths under that folder):
#: the source side of ReLA Figure 2's benchmark (``mt-bench-decode-length --device cuda``) and the
#: RWTH De-En gold alignments (124 KiB) that ReLA Table 5's post-training step (``reproduce rela table5``,
#: ``fairseq-attention-analysis --aer-checkpoint``) scores against
EXTRA_DATA = ["wmt/plain/newstest2014.de-en.en.gz"] + [
    f"rwth_gold_alignment_de_en/{name}.gz" for name in ("alignment.talp", "test.de", "test.en", "test.uc.de", "test.uc.en")]


def _pinned(names: List[str]) -> List[str]:
    """``name==<version installed here>`` for each package name."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in names:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            raise SystemExit(f"{name} is not installed here; install the project first (scripts/setup_env.sh)") from None
    return out


def _pip(args: List[str]) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def _size_mib(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 2 ** 20


def copy_extra_data(data_dir: str, shared_data: str = "") -> List[str]:
    """Copy :data:`EXTRA_DATA` from ``shared_data`` (default ``../shared/data``) into ``data_dir``
    under the same relative paths (``scripts/device_setup.sh`` puts ``data/*`` back where the
    tools look).  Returns the copied paths.

    Raises:
        SystemExit: one of the files is missing (named, with the folder searched)."""
    shared_data = shared_data or os.path.join(os.path.dirname(ROOT), "shared", "data")
    copied = []
    for rel in EXTRA_DATA:
        src = os.path.join(shared_data, rel)
        if not os.path.isfile(src):
            raise SystemExit(f"{rel} not found under {shared_data} (the kit carries it for ReLA Figure 2's "
                             "benchmark or Table 5's AER)")
        dst = os.path.join(data_dir, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        copied.append(dst)
    return copied


def corpus_inputs(plans: List[Dict]) -> Dict[str, List[str]]:
    """``{corpus: [paths under ../shared/data]}``: the corpora of the plans' runs' budgets and what
    ``mt-prep`` reads of each there (:func:`mt_pipeline.prep.spec.shared_inputs`), corpora sorted.

    Raises:
        SystemExit: a budget names an unknown corpus (the message lists the valid ones)."""
    from .budget import load_budget
    from .prep.spec import load_spec, shared_inputs

    corpora = sorted({load_budget(run.budget)["data"]["corpus"] for plan in plans for run in plan["_runs"]})
    return {c: shared_inputs(load_spec(c)) for c in corpora}


def _check_corpus_data(inputs: Dict[str, List[str]], shared_data: str) -> None:
    """Raises SystemExit naming every path of ``inputs`` missing under ``shared_data`` (and every
    corpus whose spec names no local folder: it could only be downloaded, and the GPU machine is offline)."""
    missing = [f"{rel} (corpus {c})" for c, paths in inputs.items() for rel in paths
               if not os.path.exists(os.path.join(shared_data, rel))]
    missing += [f"{c}: its spec names no local folder" for c, paths in inputs.items() if not paths]
    if missing:
        raise SystemExit(f"the kit's corpus files are not under {shared_data}: {'; '.join(missing)}")


def copy_corpus_data(data_dir: str, inputs: Dict[str, List[str]], shared_data: str) -> List[str]:
    """Copy every path of ``inputs`` (:func:`corpus_inputs`) from ``shared_data`` into ``data_dir``
    under the same relative path (folders merged: two corpora may read folders of one tree).
    Returns the copied paths, sorted.

    Raises:
        SystemExit: paths missing under ``shared_data`` (all of them named, nothing copied)."""
    _check_corpus_data(inputs, shared_data)
    rels = sorted({r for paths in inputs.values() for r in paths})
    for rel in rels:
        src, dst = os.path.join(shared_data, rel), os.path.join(data_dir, rel)
        if os.path.isdir(src):
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
    return [os.path.join(data_dir, rel) for rel in rels]


def write_kit(out: str, plans: List[Dict], shared_data: str = "") -> str:
    """Write the kit for ``plans`` (the corpora of their runs' budgets) into ``out``; returns ``out``.
    ``shared_data``: where the corpora's files are read (default ``../shared/data``).

    Raises:
        SystemExit: ``out`` exists and was not written by this function (no ``KIT.json``), lies in
            the repository without being git-ignored, a corpus's files are not here (each missing
            path named), pip fails, or the kit exceeds 60 MiB.
    """
    out = out if os.path.isabs(out) else os.path.join(ROOT, out)
    if os.path.exists(out) and not os.path.exists(os.path.join(out, "KIT.json")) and os.listdir(out):
        raise SystemExit(f"{out} exists and is not a GPU kit (no KIT.json): refusing to write into it")
    inside = os.path.commonpath([os.path.abspath(out), ROOT]) == ROOT
    if inside and subprocess.run(["git", "check-ignore", "-q", os.path.join(out, "KIT.json")], cwd=ROOT).returncode != 0:
        raise SystemExit(f"{out} is not git-ignored: add it to .gitignore first (the kit must never be committed)")
    shared_data = shared_data or os.path.join(os.path.dirname(ROOT), "shared", "data")
    inputs = corpus_inputs(plans)
    _check_corpus_data(inputs, shared_data)  # before pip's minutes
    for sub in ("whl", "data"):
        if os.path.isdir(os.path.join(out, sub)):
            shutil.rmtree(os.path.join(out, sub))  # written by an earlier write_kit (KIT.json checked above)
    whl = os.path.join(out, "whl")
    os.makedirs(whl)
    with open(os.path.join(out, "KIT.json"), "w") as f:  # marks the folder as the kit's, complete or not
        json.dump({"state": "incomplete: being written by mt-campaign gpu-kit"}, f)
    try:
        _pip(["download", "-q", "--no-deps", *PLATFORM, "-d", whl, *_pinned(PACKAGES)])
        _pip(["wheel", "-q", "--no-deps", "-w", whl, *_pinned(SDIST_ONLY)])
        # the sdist only (no build): its metadata is read with this environment's build tools
        _pip(["download", "-q", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-d", whl, FAIRSEQ])
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"pip could not fetch the kit's packages ({err}); {out} is incomplete: re-run") from None
    copy_corpus_data(os.path.join(out, "data"), inputs, shared_data)
    copy_extra_data(os.path.join(out, "data"), shared_data)
    size = _size_mib(out)
    if size > LIMIT_MIB:
        raise SystemExit(f"the kit is {size:.1f} MiB, over the {LIMIT_MIB} MiB that may travel to the GPU machine")
    plan_args = "".join(f" --plan {repo_relative(p['_path'])}" for p in plans if p.get("_path"))
    record = collect("mt-campaign gpu-kit --out " + os.path.relpath(out, ROOT) + plan_args,
                     corpus=", ".join(inputs), data=inputs,
                     files=sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(out, "*", "*"))),
                     size_mib=round(size, 1))
    record["state"] = "complete"
    with open(os.path.join(out, "KIT.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"[gpu-kit] wrote {out} ({size:.1f} MiB): {len(os.listdir(whl))} packages, data of {', '.join(inputs)}")
    return out
