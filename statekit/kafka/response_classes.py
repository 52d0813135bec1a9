"""kafka-python 3.0 finds the class that decodes an answer in a registry with one entry per API,
held by ``weakref.proxy``; each versioned class it makes on first use (``ApiVersionsResponse[3]``)
registers itself there too. Two threads asking for the same version at once each make one, the
registry may keep the one that is then collected, and from then on every answer to that API raises
``ReferenceError`` in that process (seen in CI as an ApiVersions answer "statekit cannot read").
Registering each API's primary class, strongly, makes the race harmless; importing this module
does so for the classes to come and fixes the entries already made."""
from __future__ import annotations

import weakref

from kafka.protocol.api_header import ResponseClassRegistry
from kafka.protocol.api_message import ApiMessage

__all__ = ["pin_response_classes"]


def _response_class(api_key: int):
    """The live primary response class of ``api_key`` among kafka-python's message classes."""
    todo = [ApiMessage]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if (cls.__dict__.get("_class_version", 0) is None and cls.__dict__.get("_json")
                and cls._json.get("type") == "response" and cls._json.get("apiKey") == api_key):
            return cls
    return None


def pin_response_classes() -> None:
    """Every entry of the registry: its API's live primary class, held strongly."""
    registry = ResponseClassRegistry._response_class_registry
    for key, cls in list(registry.items()):
        live = _primary_of(key, cls)
        if live is None:
            del registry[key]
        else:
            registry[key] = live


def _primary_of(key: int, cls):
    """The primary class behind an entry (a versioned class or a proxy); the live one when the
    entry's class was collected."""
    try:
        if type(cls) in weakref.ProxyTypes or cls._class_version is not None:
            return cls[None]
        return cls
    except ReferenceError:
        return _response_class(key)
    except (AttributeError, TypeError):
        return cls  # a class of kafka-python's old protocol: not one statekit uses


def _register_strongly(registry, response_class) -> None:
    """kafka-python's ``register_response_class``, keeping the primary class instead of a proxy."""
    try:
        key = response_class.API_KEY
    except ReferenceError:
        return
    live = _primary_of(key, response_class)
    if live is not None:
        registry._response_class_registry[key] = live


ResponseClassRegistry.register_response_class = classmethod(_register_strongly)


pin_response_classes()
