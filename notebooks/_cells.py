"""The cell helpers and the writer every notebook builder shares (notebooks/_build*.py import this
module and nothing of each other but `_build.py`, which gathers them all).

Every notebook is written for a learner: it says what you will see, shows it, and says what
happened. It starts from a clean slate (`%statekit up --fresh`), ends with `%statekit down`, and
checks its results against plain Python in a cell that prints OK. What `make demo` needs beyond
that comes from the app's own figures, in a short cell tagged `remove-cell` that prints nothing
(`statekit.demo.record_restore`).
"""
from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str, tags=(), solution: str | None = None):
    c = new_code_cell(text.strip("\n"))
    if tags:
        c.metadata["tags"] = list(tags)
    if solution is not None:   # an exercise: its reference answer (statekit.demo.apply_solutions)
        c.metadata["statekit"] = {"solution": solution.strip("\n")}
    return c


def hidden(text: str):
    """A cell for `make demo` or the tests, not for the learner: tagged remove-cell, prints nothing."""
    return code(text, tags=("remove-cell",))


SETUP = code("""
%load_ext kernel_ext
%statekit up --fresh
""")

DOWN = code("""
%statekit down
""")

# Workshop-scale state: bank accounts, one movement each (the `accounts` generator's first KEYS
# records visit every account once), written by the fast produce path. 2.5 million where a restore
# from scratch is timed (02, 03: it must last a few seconds to be watched), a million elsewhere.
# The test suite runs the tour with fewer accounts (STATEKIT_TOUR_KEYS); `make demo` and JupyterLab
# use the full size.
TOUR_KEYS, RESTORE_TOUR_KEYS = 1_000_000, 2_500_000

# the word count's store against plain Python (notebooks 01 and 15: sample_data/words.jsonl, then
# 1,500 more words of seed 7)
WORDCOUNT_CHECK = code("""
from collections import Counter
from statekit.datagen import generate, read_jsonl

expected = Counter(r.key for r in read_jsonl("../sample_data/words.jsonl"))
expected.update(r.key for r in generate("words", seed=7, limit=1500))
store = app.query_all("counts")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected), f"{len(set(actual.items()) ^ set(expected.items()))} keys differ"
print(f"{len(actual)} words, {sum(actual.values())} records counted, exactly as plain Python counts them")
print("OK")
""")

ACCOUNTS_CELL = """
import os
from collections import Counter
from statekit.datagen import accounts_reference

KEYS = int(os.environ.get("STATEKIT_TOUR_KEYS", "{default}"))
%statekit produce accounts --generator accounts --seed 1 --limit {{KEYS}} --keys {{KEYS}} --partitions {partitions} --wait
expected = Counter(accounts_reference(seed=1, limit=KEYS, keys=KEYS)[0])   # account -> movements
print(f"{{KEYS:,}} movements of {{len(expected):,}} accounts")
"""


def accounts(default: int = TOUR_KEYS, partitions: int = 4):
    return code(ACCOUNTS_CELL.format(default=default, partitions=partitions))


# The forecast before a crash: App.restore_forecast(), per instance a sentence.
FORECAST = """
forecast = app.restore_forecast()
print("\\n".join(forecast.lines.values()))
"""

# What the last restart restored, beside the forecast made before the crash.
RESTORE_VS_FORECAST = """
rs = app.restore_summary()   # one row per task (and store) the restart replayed from its changelog
said = forecast.frame.query("source == 'scratch'").seconds.sum()
print(f"the restore replayed {rs.records.sum():,} changelog records in {rs.seconds.sum():.1f} s; "
      f"the forecast before the crash said ≈ {said:.1f} s")
rs[["task", "source", "records", "seconds"]]
"""

RECORD_RESTORE = hidden("""
from statekit.demo import record_restore   # the restore's figures for `make demo`'s report
record_restore(app, forecast)
""")

def write(notebooks: dict, names=None) -> list[str]:
    """Write each notebook of `notebooks` (name -> cells), or only those in `names`; returns the paths."""
    paths = []
    for name, cells in notebooks.items():
        if names and name not in names:
            continue
        nb = new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                     "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        for i, c in enumerate(nb.cells):  # stable ids: a rebuild changes nothing unless a cell did
            c["id"] = f"{name[:2]}-{i:02d}"
        path = os.path.join(HERE, f"{name}.ipynb")
        nbformat.validate(nb)
        with open(path, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
        paths.append(path)
    return paths
