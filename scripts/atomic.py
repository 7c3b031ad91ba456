"""Atomic file writing for the scripts: re-exports :mod:`fairseq_plugins.atomic_io`.

The module is loaded from its file (it uses the standard library only), so scripts that do not
need fairseq -- scoring, hypothesis extraction -- do not pay for importing it.
"""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "fairseq_plugins", "atomic_io.py")
_spec = importlib.util.spec_from_file_location("_fairseq_plugins_atomic_io", _PATH)
_atomic_io = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_atomic_io)

atomic_path = _atomic_io.atomic_path
write_lines_atomic = _atomic_io.write_lines_atomic
write_text_atomic = _atomic_io.write_text_atomic
write_json_atomic = _atomic_io.write_json_atomic
remove_leftovers = _atomic_io.remove_leftovers

__all__ = ["atomic_path", "write_lines_atomic", "write_text_atomic", "write_json_atomic",
           "remove_leftovers"]
