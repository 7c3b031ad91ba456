#!/usr/bin/env python
"""Variance ratio Var(FFN output) / Var(residual) of a trained checkpoint (ReLUFormer Table 1).

Usage:
    python scripts/ffn_variance_ratio.py --checkpoint runs/.../average_last3.pt \
        --data-bin data-bin/multi30k_en_de/bin --src de --tgt en [--subset valid] [--json OUT]

Prints ``{"encoder": [...], "decoder": [...], "mean": [m]}`` (see
:func:`fairseq_plugins.analysis.ffn_variance_ratios`) and writes it to ``--json`` atomically.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    sys.path.insert(0, ROOT)
    from fairseq_plugins.analysis.loading import analysis_parser, checkpoint_batches, emit_result
    from fairseq_plugins.checkpoint import CheckpointError

    p = analysis_parser(__doc__.split("\n\n")[0])
    a = p.parse_args(argv)
    from fairseq_plugins.analysis import ffn_variance_ratios

    try:
        model, task, itr = checkpoint_batches(a.checkpoint, a.data_bin, a.src, a.tgt, a.subset, a.max_tokens,
                                              tool="ffn_variance_ratio.py")
    except (FileNotFoundError, CheckpointError) as e:  # names the file: empty, cut short, unsafe, wrong model
        p.error(str(e))
    res = ffn_variance_ratios(model, itr, task.target_dictionary.pad())
    emit_result(res, a.checkpoint, a.subset, a.json)


if __name__ == "__main__":
    main()
