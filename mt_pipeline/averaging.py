#!/usr/bin/env python3
"""Average the parameters of the last N fairseq checkpoints.

Usage (from the repo root)::

    python scripts/average_checkpoints.py --inputs CKPT_DIR --num-epoch-checkpoints 5 \\
        --output CKPT_DIR/checkpoint_avg5.pt
    python scripts/average_checkpoints.py --inputs CKPT_DIR --num-update-checkpoints 5 \\
        --output CKPT_DIR/checkpoint_avg_upd5.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

``--inputs`` takes checkpoint directories and/or checkpoint files.  With
``--num-epoch-checkpoints N`` the candidates are the files named ``checkpoint<E>.pt``
(in the given directories, or among the given files) and the N with the highest epoch E
are averaged; with ``--num-update-checkpoints N`` the candidates are ``checkpoint_<E>_<U>.pt``
and the N with the highest update U are used.  Without either option only files may be
given and all of them are averaged.

Every floating-point tensor of ``state["model"]`` is averaged (accumulated in float64, cast
back to its dtype); other entries of ``state["model"]`` (integer/bool tensors, non-tensors)
are taken from the last checkpoint.  The checkpoints must have the same parameter names,
shapes and dtypes (otherwise: error naming the first differences).  The rest of the output
state (cfg, optimizer history, extra_state, ...) is the last checkpoint's -- the one with the
highest epoch/update number, or the last file given.  The output is written with
``torch.save`` to a temp file in the output's directory and renamed with ``os.replace``.

Checkpoints are loaded with ``fairseq_plugins.checkpoint.load_checkpoint`` (``torch.load`` with
``weights_only=True`` and the allow-list of plain-data types fairseq stores in checkpoints; an
empty, cut-short or unsafe file is refused with the plugin's message naming it).
"""

import argparse
import os
import re
import sys

from .atomic import atomic_path

EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")


class AverageError(RuntimeError):
    """Inputs cannot be averaged (missing files, mismatching parameters, bad checkpoint)."""


def select_checkpoints(inputs, num_epoch=None, num_update=None):
    """Return the checkpoint paths to average, oldest first (the last one's state is kept)."""
    dirs = [p for p in inputs if os.path.isdir(p)]
    missing = [p for p in inputs if not os.path.exists(p)]
    if missing:
        raise AverageError(f"--inputs: no such file or directory: {', '.join(missing)}")
    if num_epoch is None and num_update is None:
        if dirs:
            raise AverageError(
                f"--inputs contains directories ({', '.join(dirs)}): give --num-epoch-checkpoints N "
                f"or --num-update-checkpoints N to choose the checkpoints in them")
        if len(set(map(os.path.realpath, inputs))) != len(inputs):
            raise AverageError("--inputs lists the same file twice")
        return list(inputs)

    pattern, kind, n = (EPOCH_RE, "epoch", num_epoch) if num_epoch is not None else (UPDATE_RE, "update", num_update)
    example = "checkpoint<E>.pt" if kind == "epoch" else "checkpoint_<E>_<U>.pt"
    candidates = []
    for p in inputs:
        names = sorted(os.listdir(p)) if os.path.isdir(p) else [os.path.basename(p)]
        base = p if os.path.isdir(p) else os.path.dirname(p)
        for name in names:
            m = pattern.match(name)
            if m is None:
                if not os.path.isdir(p):
                    raise AverageError(f"--inputs file {p} is not named {example} (needed with --num-{kind}-checkpoints)")
                continue
            key = int(m.group(1)) if kind == "epoch" else (int(m.group(2)), int(m.group(1)))
            candidates.append((key, os.path.join(base, name)))
    candidates.sort()
    keys = [k for k, _ in candidates]
    dups = sorted({k for k in keys if keys.count(k) > 1})
    if dups:
        raise AverageError(f"several inputs have the same {kind} number {dups}: "
                           + ", ".join(p for k, p in candidates if k in dups))
    if len(candidates) < n:
        found = ", ".join(os.path.basename(p) for _, p in candidates) or "none"
        raise AverageError(f"--num-{kind}-checkpoints {n}: only {len(candidates)} files named {example} "
                           f"found in {', '.join(inputs)} ({found})")
    return [p for _, p in candidates[-n:]]


def _load(path):
    from fairseq_plugins.checkpoint import CheckpointError, load_checkpoint

    try:
        state = load_checkpoint(path)
    except CheckpointError as e:  # the plugin's message: empty, cut short, refused global (never weights_only=False)
        raise AverageError(str(e)) from None
    except Exception as e:
        raise AverageError(f"cannot load {path}: {type(e).__name__}: {e}") from e
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise AverageError(f"{path} is not a fairseq checkpoint (no dict state['model'])")
    return state


def _diff_keys(a, b, limit=5):
    only_a, only_b = [k for k in a if k not in b], [k for k in b if k not in a]
    parts = []
    if only_a:
        parts.append(f"only in the first: {only_a[:limit]}{' ...' if len(only_a) > limit else ''}")
    if only_b:
        parts.append(f"only in the other: {only_b[:limit]}{' ...' if len(only_b) > limit else ''}")
    return "; ".join(parts)


def average_checkpoints(paths):
    """Load ``paths`` one at a time and return the last state with ``model`` averaged."""
    import torch

    if not paths:
        raise AverageError("no checkpoints to average")
    sums, ref_meta, ref_path, state = None, None, None, None
    for path in paths:
        state = _load(path)
        model = state["model"]
        meta = {k: (tuple(v.shape), v.dtype) if torch.is_tensor(v) else None for k, v in model.items()}
        if sums is None:
            ref_meta, ref_path = meta, path
            sums = {k: v.detach().to(torch.float64).clone()
                    for k, v in model.items() if torch.is_tensor(v) and v.is_floating_point()}
            continue
        if set(meta) != set(ref_meta):
            raise AverageError(f"parameter names differ between {ref_path} and {path}: {_diff_keys(ref_meta, meta)}")
        for k, m in meta.items():
            if m != ref_meta[k]:
                raise AverageError(f"parameter {k!r} differs between {ref_path} {ref_meta[k]} and {path} {m} "
                                   f"(shape, dtype)")
        for k in sums:
            sums[k] += model[k].detach().to(torch.float64)
        del model
    n = len(paths)
    last_model = state["model"]
    averaged = type(last_model)() if isinstance(last_model, dict) else {}
    for k, v in last_model.items():
        averaged[k] = (sums[k] / n).to(v.dtype) if k in sums else v
    state["model"] = averaged
    return state, len(sums)


def save_atomic(state, output):
    """``torch.save`` to ``output`` atomically (see mt_pipeline.atomic)."""
    import torch

    with atomic_path(output) as tmp:
        torch.save(state, tmp)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (python -c 'help(...)' or the file header) for details.",
    )
    parser.add_argument("--inputs", nargs="+", required=True, metavar="DIR_OR_FILE",
                        help="checkpoint directories and/or checkpoint files")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                       help="average the last N checkpoint<E>.pt (highest epochs)")
    group.add_argument("--num-update-checkpoints", type=int, metavar="N",
                       help="average the last N checkpoint_<E>_<U>.pt (highest updates)")
    parser.add_argument("--output", required=True, help="output checkpoint file")
    args = parser.parse_args(argv)
    for opt in ("num_epoch_checkpoints", "num_update_checkpoints"):
        v = getattr(args, opt)
        if v is not None and v <= 0:
            parser.error(f"--{opt.replace('_', '-')} must be a positive integer (got {v})")

    try:
        import fairseq_plugins  # noqa: F401  (registers the safe-globals allow-list for torch.load)
    except Exception as e:
        print(f"average_checkpoints.py: error: cannot import fairseq_plugins from "
              f"{os.path.dirname(os.path.dirname(os.path.abspath(__file__)))} "
              f"(needed to load fairseq checkpoints with weights_only=True): {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1

    try:
        paths = select_checkpoints(args.inputs, args.num_epoch_checkpoints, args.num_update_checkpoints)
        out_real = os.path.realpath(args.output)
        if any(os.path.realpath(p) == out_real for p in paths):
            raise AverageError(f"--output {args.output} is one of the inputs; choose another file name")
        print(f"averaging {len(paths)} checkpoints:", file=sys.stderr)
        for p in paths:
            print(f"  {p}", file=sys.stderr)
        state, n_float = average_checkpoints(paths)
    except AverageError as e:
        print(f"average_checkpoints.py: error: {e}", file=sys.stderr)
        return 1
    save_atomic(state, args.output)
    print(f"averaged {n_float} floating-point tensors; other state from {paths[-1]}; wrote {args.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
