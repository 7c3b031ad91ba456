#!/usr/bin/env python
"""FFN value-slot anisotropy (ReLUFormer eq. 4, Figure 3) -- entry point of :func:`fairseq_plugins.analysis.ffn_memory.main_anisotropy` (console command ``fairseq-attention-ffn-anisotropy``)."""
from fairseq_plugins.analysis.ffn_memory import main_anisotropy

if __name__ == "__main__":
    main_anisotropy()
