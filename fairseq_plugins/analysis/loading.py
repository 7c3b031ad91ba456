"""Loading a trained checkpoint and a binarized split for the per-checkpoint analyses."""

from ..user_dir import import_user_dir

__all__ = ["USER_DIR_HELP", "checkpoint_batches", "analysis_parser", "emit_result", "run_checkpoint_analysis"]

#: the ``--user-dir`` option of every analysis command that loads a checkpoint
USER_DIR_HELP = ("a fairseq --user-dir imported before any model is built: the one a checkpoint was trained with "
                 "when it uses an attention function (or architecture) registered outside this plugin "
                 "(docs/extending.md)")


def checkpoint_batches(checkpoint: str, data_bin: str, src: str, tgt: str, subset: str = "valid",
                       max_tokens: int = 4096, transformer_only: bool = True, tool: str = "this analysis"):
    """``(model, task, batches)`` for a per-checkpoint analysis: the model and task from
    :func:`.capture.load_model_for_analysis` (eval mode, the plugin's safe checkpoint loader) and
    :func:`.capture.iter_batches` over ``subset`` (every sentence once, no shuffling).

    ``transformer_only`` (default) refuses a model that is not an encoder-decoder Transformer
    (the per-layer analyses); False accepts any fairseq encoder-decoder (source reliance).
    ``tool`` names the caller in that refusal.

    Raises:
        FileNotFoundError: ``checkpoint`` or ``data_bin`` does not exist.
        fairseq_plugins.checkpoint.CheckpointError: an empty, cut-short or non-checkpoint file;
            its subclasses ``UnsafeCheckpointError`` (a non-allow-listed pickle global) and
            ``UnsupportedCheckpointError`` (not a Transformer, with ``transformer_only``).
    """
    import os

    from .capture import iter_batches, load_model_for_analysis

    for path in (checkpoint, data_bin):
        if not os.path.exists(path):
            raise FileNotFoundError(f"not found: {path}")
    model, task, _ = load_model_for_analysis(checkpoint, data_bin, src, tgt, subsets=[subset],
                                             transformer_only=transformer_only, tool=tool)
    return model, task, iter_batches(task, task.dataset(subset), max_tokens=max_tokens)


def analysis_parser(description: str, prog: str = None):
    """The argparse parser shared by the per-checkpoint analysis commands (``--checkpoint``,
    ``--data-bin``, ``--src``, ``--tgt``, ``--subset`` (default valid), ``--max-tokens``,
    ``--json``: the contract ``mt-table`` analyses are called with; ``--user-dir``, imported by
    :func:`import_user_dir` before the checkpoint is loaded)."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data-bin", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--json", help="write the result here (atomically)")
    p.add_argument("--user-dir", metavar="DIR", help=USER_DIR_HELP)
    return p


def emit_result(res: dict, checkpoint: str, subset: str, json_path=None, prog: str = "", argv=None) -> dict:
    """Add ``checkpoint`` (repo-relative), ``subset``, ``model`` (the checkpoint's training run
    and committed evidence, :func:`fairseq_plugins.provenance.trained_model`) and ``provenance``
    (command ``prog`` + ``argv``, git commit, hardware, time) to ``res``, print it as JSON and,
    with ``json_path``, write it there atomically (never a half-written file).  Returns ``res``."""
    import json
    import os

    from .. import provenance
    from ..atomic import atomic_path

    res.update(checkpoint=provenance.repo_relative(os.path.abspath(checkpoint)), subset=subset,
               model=provenance.trained_model(checkpoint),
               provenance=provenance.collect(provenance.command_line(prog, argv)))
    text = json.dumps(res, indent=1)
    print(text)
    if json_path:
        with atomic_path(json_path) as tmp, open(tmp, "w") as f:
            f.write(text + "\n")
    return res


def run_checkpoint_analysis(argv, prog: str, description: str, measure, extra_args=None) -> dict:
    """The body of a per-checkpoint analysis command: parse :func:`analysis_parser`'s arguments
    (plus ``extra_args(parser)``), load the model and the split (:func:`checkpoint_batches`), run
    ``measure(args, model, task, batches) -> dict`` and :func:`emit_result` it.

    A missing file (the ``--user-dir`` included), a bad checkpoint
    (:class:`fairseq_plugins.checkpoint.CheckpointError`, one with an attention function not
    registered included) or a ``ValueError`` of ``measure`` (a model the analysis does not apply
    to) stops with the parser's error, naming the problem, and writes nothing."""
    from ..checkpoint import CheckpointError

    p = analysis_parser(description, prog=prog)
    if extra_args:
        extra_args(p)
    a = p.parse_args(argv)
    try:
        import_user_dir(a.user_dir)
        model, task, itr = checkpoint_batches(a.checkpoint, a.data_bin, a.src, a.tgt, a.subset, a.max_tokens, tool=prog)
        res = measure(a, model, task, itr)
    except (FileNotFoundError, CheckpointError, ValueError) as e:
        p.error(str(e))
    return emit_result(res, a.checkpoint, a.subset, a.json, prog=prog, argv=argv)
