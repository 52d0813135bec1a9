"""kafka-python's package without its clients until something asks for them.

statekit encodes Kafka requests with kafka-python's protocol classes (`kafka.protocol`,
`kafka.errors`) and never uses its KafkaConsumer, KafkaProducer or KafkaAdminClient, yet
`kafka/__init__` imports all three, with their network layer: ~0.1 s of CPU at the start of every
statekit process that speaks Kafka (the kernel, each instance, the broker, and Spark's source
runner, on the path of a cold launch). `defer_clients()` registers the `kafka` package with its
`__init__` not run: its submodules import as usual, and the first look for anything else
(`kafka.KafkaConsumer`, `from kafka import KafkaProducer`, `kafka.__version__`) runs the real
`__init__` then, so a user's own kafka-python code in the same process sees the whole package.
Imports nothing of statekit.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import threading


def defer_clients() -> bool:
    """Register `kafka` with its `__init__` deferred, unless it is imported already (or absent).
    Whether it did."""
    if "kafka" in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec("kafka")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    module = importlib.util.module_from_spec(spec)
    lock = threading.RLock()

    def __getattr__(name: str):
        with lock:
            if module.__dict__.get("__getattr__") is __getattr__:
                del module.__dict__["__getattr__"]     # once: the real package from now on
                spec.loader.exec_module(module)
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'kafka' has no attribute {name!r}") from None

    module.__getattr__ = __getattr__
    logging.getLogger("kafka").addHandler(logging.NullHandler())   # as its __init__ does
    sys.modules["kafka"] = module
    return True
