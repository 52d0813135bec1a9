"""Moved to :mod:`statekit.compare_engines` (it builds a ``statekit.App``: a tool above the façade,
not part of an engine). This alias is a known exception of tests/test_layers.py, kept while
notebooks/_build_09.py and 09_two_engines.ipynb import it from here; delete it once they import
``statekit.compare_engines``."""
from statekit.compare_engines import compare_engines  # noqa: F401

__all__ = ["compare_engines"]
