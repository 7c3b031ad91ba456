"""Atomic file writing for the pipeline: :mod:`fairseq_plugins.atomic`, the one implementation
(it lives in the plugin so that a fairseq user who copies only ``fairseq_plugins/`` as a
``--user-dir`` gets every analysis CLI; the pipeline re-exports it here).
"""

from fairseq_plugins.atomic import *  # noqa: F401,F403  (the one atomic writer)
from fairseq_plugins.atomic import __all__  # noqa: F401
