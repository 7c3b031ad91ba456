#!/usr/bin/env python
"""Source reliance of a trained checkpoint: NLL with true vs shuffled sources (nats/token).

Usage:
    python scripts/source_reliance.py --checkpoint runs/.../average_last3.pt \\
        --data-bin data-bin/multi30k_en_de/bin --src en --tgt de [--subset valid] [--seed 0] [--json OUT]

Prints ``{"nll_true": [x], "nll_shuffled": [y], "delta_nll": [y - x], ...}`` (see
:func:`fairseq_plugins.analysis.source_reliance`) and writes it to ``--json`` atomically.
delta_nll near 0 means the model ignores the source (a target language model).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic import atomic_path  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data-bin", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0, help="seed of the source shuffles")
    p.add_argument("--json", help="write the result here (atomically)")
    a = p.parse_args(argv)
    for path in (a.checkpoint, a.data_bin):
        if not os.path.exists(path):
            p.error(f"not found: {path}")
    sys.path.insert(0, ROOT)
    import fairseq_plugins  # noqa: F401  (safe globals, archs)
    from fairseq import checkpoint_utils

    from fairseq_plugins.analysis import source_reliance

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [a.checkpoint], arg_overrides={"data": a.data_bin, "source_lang": a.src, "target_lang": a.tgt})
    task.load_dataset(a.subset)
    itr = task.get_batch_iterator(dataset=task.dataset(a.subset), max_tokens=a.max_tokens,
                                  required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    res = source_reliance(models[0], itr, task.target_dictionary.pad(), seed=a.seed)
    res.update(checkpoint=os.path.abspath(a.checkpoint), subset=a.subset)
    print(json.dumps(res, indent=1))
    if a.json:
        with atomic_path(a.json) as tmp, open(tmp, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
