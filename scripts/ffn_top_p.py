#!/usr/bin/env python
"""FFN top-p % score sum (ReLUFormer Figure 2) -- entry point of :func:`fairseq_plugins.analysis.ffn_memory.main_top_p` (console command ``fairseq-attention-ffn-top-p``)."""
from fairseq_plugins.analysis.ffn_memory import main_top_p

if __name__ == "__main__":
    main_top_p()
