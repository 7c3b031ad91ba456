#!/usr/bin/env python
"""Source reliance of a trained checkpoint: NLL with true vs shuffled sources (nats/token).

Usage:
    python scripts/source_reliance.py --checkpoint runs/.../average_last3.pt \\
        --data-bin data-bin/multi30k_en_de/bin --src en --tgt de [--subset valid] [--seed 0] [--json OUT]

Prints ``{"nll_true": [x], "nll_shuffled": [y], "delta_nll": [y - x], ...}`` (see
:func:`fairseq_plugins.analysis.source_reliance`) and writes it to ``--json`` atomically.
delta_nll near 0 means the model ignores the source (a target language model).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    sys.path.insert(0, ROOT)
    from fairseq_plugins.analysis.loading import analysis_parser, checkpoint_batches, emit_result
    from fairseq_plugins.checkpoint import CheckpointError

    p = analysis_parser(__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="seed of the source shuffles")
    a = p.parse_args(argv)
    from fairseq_plugins.analysis import source_reliance

    try:
        model, task, itr = checkpoint_batches(a.checkpoint, a.data_bin, a.src, a.tgt, a.subset, a.max_tokens,
                                              transformer_only=False)
    except (FileNotFoundError, CheckpointError) as e:  # names the file: empty, cut short, unsafe, wrong model
        p.error(str(e))
    res = source_reliance(model, itr, task.target_dictionary.pad(), seed=a.seed)
    emit_result(res, a.checkpoint, a.subset, a.json)


if __name__ == "__main__":
    main()
