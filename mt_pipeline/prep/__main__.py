"""``python -m mt_pipeline.prep CORPUS [options]``: the same as ``mt-prep`` (:mod:`mt_pipeline.prep.cli`)."""

import sys

from mt_pipeline.prep.cli import main

sys.exit(main())
