"""tests/state: make the helpers beside this file importable (statehelpers, the writer script)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
