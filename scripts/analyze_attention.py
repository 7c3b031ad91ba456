#!/usr/bin/env python
"""Attention analysis of fairseq checkpoints (the ``fairseq-attention-analysis`` console command).

See ``python scripts/analyze_attention.py --help`` and :mod:`fairseq_plugins.analysis.cli`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq_plugins.analysis.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
