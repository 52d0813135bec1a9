"""`%statekit query`: a store read from the freshest copy there is, and said in words: the value and
where it came from, the copy's lag when it is not current, and a key that is not there said to be
missing (the Python API answers None, which a notebook cell shows as nothing)."""
from __future__ import annotations

import json

from kernel_ext.lines import say


def typed_key(text: str, key_type: str):
    from statekit.errors import StatekitError

    if key_type == "int":
        try:
            return int(text)
        except ValueError:
            raise StatekitError(f"--key-type int: {text!r} is not a whole number") from None
    if key_type == "json":
        try:
            return json.loads(text)
        except ValueError:
            raise StatekitError(f"--key-type json: {text!r} is not JSON") from None
    return text

def freshest(fn, *args):
    """``(value, note, answer)`` of a query method read at once from the freshest copy there
    is; ``note`` names the tasks whose copy is not current ("" when all are). An app whose
    queries take no ``with_lag`` (Spark's own state store) is read as before."""
    import inspect

    from statekit.runtime.copies import stale_note

    try:
        takes = "with_lag" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return fn(*args), "", None
    a = fn(*args, stale=True, with_lag=True)
    if hasattr(a, "columns"):   # query_all: a frame, its copies in .attrs
        note = stale_note((a.attrs.get("copies") or {}).values())
        return a, (f"; {note}" if note else ""), None
    note = stale_note(a.copies)
    return a.value, (f"; {note}" if note else ""), a


def query(app, cmd):
    """Run a parsed `query` command against ``app``: a line, and a frame for several rows."""
    import pandas as pd

    windowed = cmd.window_from is not None or cmd.window_to is not None
    if cmd.key is not None and not windowed and hasattr(app, "store_spec"):
        windowed = getattr(app.store_spec(cmd.store), "kind", "kv") == "window"
    if cmd.key is not None and windowed:
        key = typed_key(cmd.key, cmd.key_type)
        lo = cmd.window_from or 0
        hi = cmd.window_to if cmd.window_to is not None else 2 ** 62
        rows, note, _a = freshest(app.query_window, cmd.store, key, lo, hi)
        rows = list(rows)
        df = pd.DataFrame(rows[: cmd.limit], columns=["window_start", "value"])
        say(f"{cmd.store}[{key!r}]: {len(rows)} window(s)"
            + (f"; first {cmd.limit}" if len(rows) > cmd.limit else "") + note)
        return df
    if cmd.key is not None:
        key = typed_key(cmd.key, cmd.key_type)
        value, note, a = freshest(app.query, cmd.store, key)
        owner = a.copy if a is not None else None
        if owner is None:
            try:
                owner = app.key_owner(cmd.store, key)
            except Exception:
                owner = None
        if value is None:   # the Python API's None: said in words
            task = f"task {getattr(owner, 'task', '?')}, " if owner is not None else ""
            copy = "current copy" if not note else "its copy is not current"
            say(f"key {key!r} is not in store {cmd.store} ({task}{copy}){note}")
            return None
        where = ""
        if owner is not None and not note:
            where = (f"  (task {getattr(owner, 'task', '?')}, instance {getattr(owner, 'instance', '?')}, "
                     f"{getattr(owner, 'role', 'active')})")
        say(f"{cmd.store}[{key!r}] = {value!r}{where}{note}")
        return None
    if cmd.range is not None:
        lo, hi = (typed_key(x, cmd.key_type) for x in cmd.range)
        rows, note, _a = freshest(app.query_range, cmd.store, lo, hi)
        rows = list(rows)
        df = pd.DataFrame(rows[: cmd.limit], columns=["key", "value"])
        say(f"{len(rows)} key(s) in [{lo!r}, {hi!r}]" + (f"; first {cmd.limit}" if len(rows) > cmd.limit else "")
            + note)
        return df
    df, note, _a = freshest(app.query_all, cmd.store)
    if not hasattr(df, "head"):
        df = pd.DataFrame(list(df), columns=["key", "value"])
    elif not note:   # every row current: the columns that say so add nothing
        df = df.drop(columns=[c for c in ("role", "state", "lag", "lag_s") if c in df.columns])
    say(f"{len(df)} key(s) in {cmd.store}" + (f"; first {cmd.limit}" if len(df) > cmd.limit else "")
        + note)
    return df.head(cmd.limit)

