"""Loading a trained checkpoint and a binarized split for the per-checkpoint analyses."""

__all__ = ["checkpoint_batches"]


def checkpoint_batches(checkpoint: str, data_bin: str, src: str, tgt: str, subset: str = "valid",
                       max_tokens: int = 4096):
    """Load ``checkpoint`` (with this plugin's archs and safe globals) over ``data_bin`` and
    return ``(model, task, batches)``: the first model of the ensemble, the translation task, and
    an iterator over ``subset`` in fairseq's length-sorted batches of at most ``max_tokens``
    tokens (every sentence once, ``required_batch_size_multiple=1``, no shuffling).

    Raises:
        FileNotFoundError: ``checkpoint`` or ``data_bin`` does not exist, or ``subset`` is not
            binarized there (fairseq's own error).
    """
    import os

    for path in (checkpoint, data_bin):
        if not os.path.exists(path):
            raise FileNotFoundError(f"not found: {path}")
    import fairseq_plugins  # noqa: F401  (safe globals, archs)
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data_bin, "source_lang": src, "target_lang": tgt})
    task.load_dataset(subset)
    itr = task.get_batch_iterator(dataset=task.dataset(subset), max_tokens=max_tokens,
                                  required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    return models[0], task, itr


def analysis_parser(description: str):
    """The argparse parser shared by the per-checkpoint analysis scripts (``--checkpoint``,
    ``--data-bin``, ``--src``, ``--tgt``, ``--subset`` (default valid), ``--max-tokens``,
    ``--json``: the contract ``scripts/run_table.py`` analyses are called with)."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data-bin", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--json", help="write the result here (atomically)")
    return p


def emit_result(res: dict, checkpoint: str, subset: str, json_path=None) -> dict:
    """Add ``checkpoint`` (absolute path) and ``subset`` to ``res``, print it as JSON and, with
    ``json_path``, write it there atomically (never a half-written file).  Returns ``res``."""
    import json
    import os

    from ..atomic_io import atomic_path

    res.update(checkpoint=os.path.abspath(checkpoint), subset=subset)
    text = json.dumps(res, indent=1)
    print(text)
    if json_path:
        with atomic_path(json_path) as tmp, open(tmp, "w") as f:
            f.write(text + "\n")
    return res
