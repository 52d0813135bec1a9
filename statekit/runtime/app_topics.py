"""An application's topics on the broker: its source topics checked (they exist, one partition per
task), its internal topics (changelogs, repartition topics, sinks) created at ``start()`` and
deleted by ``reset()``, the configs of changelogs that existed already (a ``cleanup.policy`` that
would lose state is said in one line), and the partition count its state was made with.

Against a broker without some admin APIs (a Kafka statekit did not set up): topics the user created
up front are used as they are; what statekit then cannot check (DescribeConfigs) is said once, and
what it cannot do (CreateTopics of a missing topic, DeleteTopics for ``reset()``) is refused before
anything changes.

Every refusal is one line that says what to do, because ``%%statekit app`` shows it as the cell's
error.
"""
from __future__ import annotations

import difflib
import json
import logging
from typing import Optional

from statekit.errors import StatekitError, UnknownTopic
from statekit.kafka import UnsupportedApi

log = logging.getLogger("statekit.app")


class CopartitionError(StatekitError):
    """A source topic's partition count is not the application's task count."""


def repartition_topics(plan) -> list:
    return list(getattr(plan, "repartition_topics", ()) or ())


def source_partitions(app) -> dict:
    """{external source topic: its partition count} (topics that exist)."""
    topics = app.kafka.topics()
    repart = set(repartition_topics(app.plan or app._compile()))
    out = {}
    for p in app.subplans.values():
        for src in p.sources:
            t = getattr(src, "topic", None)
            if t and t not in repart and t in topics:
                out[t] = int(topics[t])
    return out


def check_copartitioned(app, counts: Optional[dict] = None) -> None:
    counts = source_partitions(app) if counts is None else counts
    n = app.partitions
    for topic, have in sorted(counts.items()):
        if have != n:
            given = "" if app._partitions_given else " (the largest source topic's)"
            raise CopartitionError(
                f"source topic '{topic}' has {have} partition(s) but app '{app.name}' runs "
                f"{n} task(s) per sub-topology{given}: a task reads its own partition of every "
                f"source, so each needs {n}; give the app partitions={have}, or create "
                f"'{topic}' with {n} partitions (%statekit produce {topic} --partitions {n} "
                f"...)")


def check_topics(app) -> None:
    plan = app.plan or app._compile()
    topics = app.kafka.topics()
    repart = set(repartition_topics(plan))
    for p in app.subplans.values():
        for src in p.sources:
            topic = getattr(src, "topic", src if isinstance(src, str) else None)
            if topic and topic not in topics and topic not in repart:
                close = difflib.get_close_matches(topic, [t for t in topics if not t.startswith("__")],
                                                  n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise UnknownTopic(
                    f"source topic '{topic}' does not exist on {app.bootstrap}: {hint}create it "
                    f"first (%statekit produce {topic} ... in a notebook, or "
                    f"statekit.datagen.produce('{topic}', ...))")
    check_copartitioned(app)


def ensure_topics(app, sink: str) -> None:
    """The changelogs, the repartition topics and (with ``sink="kafka"``) the sinks."""
    from statekit.state.task import changelog_configs
    from statekit.worker.task import store_specs

    check_topics(app)
    kafka = app.kafka
    topics = kafka.topics()
    existing = {}
    for sub, p in app.subplans.items():
        for spec in store_specs(p, sub):
            if getattr(spec, "logging", True):
                name, cfg = app.changelog_topic(spec.name), changelog_configs(spec)
                if not kafka.ensure_topic(name, app.partitions, cfg):
                    existing[name] = cfg
    for note in changelog_config_notes(kafka, existing):
        log.warning("statekit: %s", note)
    for t in repartition_topics(app.plan):
        kafka.ensure_topic(t, app.partitions)
    if sink == "kafka":
        for p in app.subplans.values():
            for s in getattr(p, "sinks", ()) or ():
                topic = getattr(s, "topic", s if isinstance(s, str) else None)
                if topic and topic not in topics:
                    kafka.ensure_topic(topic, app.partitions)


def changelog_config_notes(kafka, existing: dict) -> list:
    """One line per changelog of ``existing`` (``{topic: the configs statekit creates it with}``)
    whose ``cleanup.policy`` differs, or one line saying none could be checked (a broker without
    DescribeConfigs)."""
    notes = []
    for topic, want in sorted(existing.items()):
        try:
            have = kafka.describe_configs(topic)
        except UnsupportedApi as e:
            keys = sorted({k for cfg in existing.values() for k in cfg})
            return [f"the broker at {e.broker} does not offer DescribeConfigs: statekit cannot check "
                    f"{', '.join(keys)} of the changelogs {', '.join(sorted(existing))}; check them "
                    f"yourself (a changelog that is not compacted loses state once its records age "
                    f"out)"]
        policy = have.get("cleanup.policy")
        wanted = want.get("cleanup.policy")
        if policy is not None and wanted and set(policy.split(",")) != set(wanted.split(",")):
            notes.append(f"changelog {topic} has cleanup.policy={policy}, statekit creates it with "
                         f"{wanted}" + (": its state is lost once records age past retention.ms"
                                        if "compact" not in policy else "")
                         + f"; set cleanup.policy={wanted}")
    return notes


def check_partitions(app) -> None:
    """Tasks cannot be re-partitioned: the partition count the state was made with must stay."""
    try:
        with open(app.layout.control.assignment) as f:
            saved = json.load(f)
    except (FileNotFoundError, ValueError):
        return
    if saved.get("partitions") not in (None, app.partitions):
        raise StatekitError(
            f"app '{app.name}' ran with {saved['partitions']} partitions before (state in "
            f"{app.state_dir}); tasks cannot be re-partitioned: keep partitions="
            f"{saved['partitions']}, or use another name / state_dir")


def delete_internal_topics(app) -> list:
    """Delete the changelog, repartition and events topics; returns those that were deleted."""
    from statekit.worker.task import store_specs

    names = [app.changelog_topic(s.name) for sub, p in app.subplans.items()
             for s in store_specs(p, sub) if getattr(s, "logging", True)]
    names += [app.changelog_topic("_task")]
    names += repartition_topics(app.plan)
    names.append(app.events_topic)
    deleted = []
    names = list(dict.fromkeys(names))
    for t in names:
        try:
            if app.kafka.delete_topic(t, missing_ok=True):
                deleted.append(t)
        except UnsupportedApi as e:  # refused before anything was deleted
            there = sorted(app.kafka.partition_counts(names))
            if not there:
                return deleted
            raise UnsupportedApi(
                f"the broker at {e.broker} does not offer DeleteTopics, so reset() cannot delete the "
                f"topics of app '{app.name}' ({', '.join(there)}): delete them with the cluster's own "
                f"tools, then call reset(topics=False) to forget the local state", e.api, e.broker) from None
        except StatekitError:
            raise
        except Exception as exc:  # noqa: BLE001
            log.info("could not delete %s: %s", t, exc)
    return deleted
