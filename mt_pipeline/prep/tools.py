"""The libraries the data preparation needs, checked before a stage uses them.

A missing library stops a real run with the package to install (a dry run only warns), instead
of an ``ImportError`` halfway through a stage.  ``tool_versions`` gives the versions recorded in the
stage stamps, so that a new sacremoses / subword-nmt redoes the stages it affects.
"""

import importlib.util

# Language tools that are not part of the base environment: module, install command, what needs it.
LANG_TOOLS = {
    "zh": ("jieba", "pip install jieba", "Chinese word segmentation before Moses tokenisation"),
    "ja": ("Mykytea", "pip install kytea (needs the KyTea library: http://www.phontron.com/kytea/)",
           "Japanese word segmentation (KyTea, as in the WAT ASPEC baseline)"),
}

# Libraries of the post-tokenisation steps (in the base environment, checked all the same so that a
# trimmed environment fails with the package to install): module, install command, what needs it.
STEP_TOOLS = {
    "truecase": ("sacremoses", "pip install sacremoses", "Moses truecasing (sacremoses MosesTruecaser)"),
    "bpe": ("subword_nmt", "pip install subword-nmt", "BPE (subword-nmt learn_bpe / apply_bpe)"),
}

# What every pipeline needs (tokeniser, BPE, fairseq-preprocess).
BASE_MODULES = ("sacremoses", "subword_nmt", "fairseq", "fairseq_cli")


def require_module(mod, install, what, dry=False, log=print):
    """Stop when ``mod`` is not importable: ``SystemExit`` naming ``install`` (a dry run only
    calls ``log`` with a warning).

    Raises:
        SystemExit: the module is missing (not in a dry run)."""
    if importlib.util.find_spec(mod) is None:
        msg = f"{what}: Python module '{mod}' is missing; install it with: {install}"
        if dry:
            log("WARNING: " + msg)
        else:
            raise SystemExit(f"ERROR: {msg}")


def check_lang_tool(lang, dry=False, log=print):
    """Stop with the package to install when ``lang`` needs a segmenter that is not importable
    (``LANG_TOOLS``: zh -> jieba, ja -> Mykytea); a dry run only warns.

    Raises:
        SystemExit: the segmenter is missing (not in a dry run)."""
    if lang in LANG_TOOLS:
        mod, install, why = LANG_TOOLS[lang]
        require_module(mod, install, f"'{lang}' needs {why}", dry, log)


def check_tool(step, dry=False, log=print):
    """Stop with the package to install when the library of ``step`` (a key of ``STEP_TOOLS``:
    truecase, bpe) is not importable; a dry run only warns.

    Raises:
        SystemExit: the library is missing (not in a dry run)."""
    mod, install, why = STEP_TOOLS[step]
    require_module(mod, install, f"{why} is needed", dry, log)


def missing_base_modules():
    """The modules of ``BASE_MODULES`` this interpreter cannot import (empty: all there)."""
    return [m for m in BASE_MODULES if importlib.util.find_spec(m) is None]


def tool_versions():
    """``{'sacremoses': VERSION, 'subword-nmt': VERSION}`` ('unknown' for one not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("sacremoses", "subword-nmt"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "unknown"
    return out


def tool_versions_line():
    """``sacremoses=V subword-nmt=V``: the versions as the text stamps record them."""
    return " ".join(f"{k}={v}" for k, v in tool_versions().items())
