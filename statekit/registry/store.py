"""What the registry knows, and the rules of Confluent's Schema Registry for changing it.

State: schemas by global id (type, canonical text, references), subjects as numbered versions
(each pointing at a schema id, live or soft-deleted), and compatibility levels (global and per
subject). An id names one (type, canonical text, references): the same schema registered under
any subject gets the same id, and ids are never reused (the next id is one past the highest ever
given).

Durability: every change is one JSON line appended to ``DIR/_schemas.jsonl`` and fsynced before it
takes effect in memory or is answered (the file plays the part of Confluent's ``_schemas`` topic).
At start the lines are replayed in order; a torn last line (a crash mid-write) is cut off. A write
that fails changes nothing and is answered 50001.

Rules (Confluent's): registering a schema a live version of the subject already has returns that
version; otherwise it must pass the subject's compatibility level against the live versions, and
gets version max(all versions, soft-deleted too) + 1. A soft delete hides a version (or a whole
subject) but keeps its id readable by id; a permanent delete (``permanent=true``) needs a soft
delete first and removes the version; a version another live schema references cannot be deleted
(42206). Removing a subject's last version permanently also removes its compatibility level."""
from __future__ import annotations

import json
import os
import threading

from . import errors as E
from .formats import DEFAULT_LEVEL, LEVELS, check, parse

LOG_NAME = "_schemas.jsonl"
MAX_VERSION = 2 ** 31 - 1


def parse_version(text: str, allow_latest: bool = True) -> int | None:
    """An URL's version: 1..2^31-1, or None for "latest" / -1."""
    if allow_latest and text in ("latest", "-1"):
        return None
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise E.invalid_version(text) from None
    if not 1 <= v <= MAX_VERSION:
        raise E.invalid_version(text)
    return v


def check_subject(subject: str) -> None:
    if not subject or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in subject) or subject in ("__GLOBAL", "__EMPTY"):
        raise E.RestError(422, 42208, f"Invalid subject {subject!r}: a subject is a non-empty name without "
                                      f"control characters")


class SchemaStore:
    def __init__(self, data_dir: str):
        self.dir = data_dir
        self.path = os.path.join(data_dir, LOG_NAME)
        self.lock = threading.RLock()
        self.schemas: dict[int, dict] = {}  # id -> {"schemaType", "schema", "references"}
        self.ids: dict[tuple, int] = {}  # identity -> id
        self.subjects: dict[str, dict[int, dict]] = {}  # subject -> version -> {"id", "deleted"}
        self.configs: dict = {}  # subject (None: global) -> level
        self.next_id = 1
        self._parsed: dict[int, object] = {}
        self._replay()
        self._file = open(self.path, "a", encoding="utf-8")

    # -- the log ------------------------------------------------------------------------------
    def _replay(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                open(self.path, "ab").close()
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        good = data.rfind(b"\n") + 1
        if good < len(data):  # a torn last line: it was never answered
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        for line in data[:good].splitlines():
            if line.strip():
                self._apply(json.loads(line))

    def _write(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        end = self._file.tell()
        try:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            # the line may have reached the file unsynced: cut it off, so a restart cannot bring back
            # what was answered as not done
            try:
                self._file.close()
            except OSError:
                pass
            try:
                os.truncate(self.path, end)
            except OSError:
                pass
            self._file = open(self.path, "a", encoding="utf-8")
            raise E.store_error(f"Error while writing to the registry's store {self.path}: {e.strerror}") from None
        self._apply(record)

    def _apply(self, r: dict) -> None:
        op = r["op"]
        if op == "schema":
            sid = r["id"]
            if sid not in self.schemas:
                self.schemas[sid] = {"schemaType": r["schemaType"], "schema": r["schema"],
                                     "references": r.get("references") or []}
                self.ids[self._identity(r["schemaType"], r["schema"], r.get("references") or [])] = sid
            self.next_id = max(self.next_id, sid + 1)
            self.subjects.setdefault(r["subject"], {})[r["version"]] = {"id": sid, "deleted": bool(r.get("deleted"))}
        elif op == "delete":
            versions = self.subjects.get(r["subject"], {})
            versions.pop(r["version"], None)
            if not versions:
                self.subjects.pop(r["subject"], None)
        elif op == "config":
            if r.get("compatibility") is None:
                self.configs.pop(r.get("subject"), None)
            else:
                self.configs[r.get("subject")] = r["compatibility"]

    def close(self) -> None:
        self._file.close()

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _identity(schema_type: str, text: str, refs: list) -> tuple:
        return schema_type, text, tuple((r["name"], r["subject"], r["version"]) for r in refs)

    def parsed(self, sid: int):
        if sid not in self._parsed:
            rec = self.schemas[sid]
            self._parsed[sid] = parse(rec["schemaType"], rec["schema"], self._resolve(rec["references"]))
        return self._parsed[sid]

    def _resolve(self, refs: list) -> list:
        """(name, parsed) of every schema ``refs`` reach, dependencies first."""
        out, seen = [], set()

        def visit(ref_list, depth):
            for ref in ref_list:
                if ref["name"] in seen:
                    continue
                entry = self.subjects.get(ref["subject"], {}).get(ref["version"])
                if entry is None or depth > 32:
                    raise E.InvalidSchema(f"Invalid schema: the reference {ref['name']!r} names subject "
                                          f"'{ref['subject']}' version {ref['version']}, which does not exist")
                seen.add(ref["name"])
                visit(self.schemas[entry["id"]]["references"], depth + 1)
                out.append((ref["name"], self.parsed(entry["id"])))

        visit(refs, 0)
        return out

    def _versions(self, subject: str, deleted: bool = False) -> list[int]:
        return sorted(v for v, e in self.subjects.get(subject, {}).items() if deleted or not e["deleted"])

    def level(self, subject: str | None) -> str:
        return self.configs.get(subject) or self.configs.get(None) or DEFAULT_LEVEL

    def _entry(self, subject: str, version: int) -> dict:
        e = self.subjects[subject][version]
        rec = self.schemas[e["id"]]
        out = {"subject": subject, "version": version, "id": e["id"]}
        return {**out, **self._schema_fields(rec)}

    @staticmethod
    def _schema_fields(rec: dict) -> dict:
        out = {}
        if rec["schemaType"] != "AVRO":
            out["schemaType"] = rec["schemaType"]
        if rec["references"]:
            out["references"] = rec["references"]
        out["schema"] = rec["schema"]
        return out

    def _request(self, body, normalize: bool):
        """(parsed, schema type, references) of a register / lookup / compatibility body."""
        if not isinstance(body, dict):
            raise E.RestError(422, 422, "The request body must be a JSON object with a \"schema\" field")
        schema_type = body.get("schemaType") or "AVRO"
        if not isinstance(schema_type, str):
            raise E.invalid_schema(f"Invalid schema type {schema_type!r}")
        schema_type = schema_type.upper()
        for key in ("metadata", "ruleSet"):
            if body.get(key):
                raise E.invalid_schema(f"{key} (data contracts) is not supported by statekit's registry: "
                                       f"register the schema without it")
        refs = body.get("references") or []
        if not isinstance(refs, list):
            raise E.invalid_schema("references must be a list of {name, subject, version}")
        clean = []
        for ref in refs:
            if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref.get("name") \
                    or not isinstance(ref.get("subject"), str) or not isinstance(ref.get("version"), int) \
                    or isinstance(ref.get("version"), bool):
                raise E.invalid_schema(f"Invalid reference {ref!r}: a reference is {{\"name\": str, \"subject\": "
                                       f"str, \"version\": int}}")
            version = ref["version"]
            if version == -1:
                live = self._versions(ref["subject"])
                version = live[-1] if live else -1
            clean.append({"name": ref["name"], "subject": ref["subject"], "version": version})
        text = body.get("schema")
        if text is not None and not isinstance(text, str):
            text = json.dumps(text)  # a schema sent as a JSON value, not a string: Jackson reads it so too
        try:
            parsed = parse(schema_type, text, self._resolve(clean), normalize)
        except E.InvalidSchema as e:
            raise E.invalid_schema(str(e)) from None
        return parsed, schema_type, clean

    # -- subjects and versions ----------------------------------------------------------------
    def register(self, subject: str, body, normalize: bool = False) -> dict:
        check_subject(subject)
        with self.lock:
            parsed, schema_type, refs = self._request(body, normalize)
            key = self._identity(schema_type, parsed.canonical, refs)
            sid = self.ids.get(key)
            versions = self.subjects.get(subject, {})
            live = self._versions(subject)
            if sid is not None:
                for v in reversed(live):
                    if versions[v]["id"] == sid:
                        return self._entry(subject, v)
            want_id = body.get("id")
            if want_id is not None and want_id != sid:
                if sid is not None or want_id in self.schemas:
                    raise E.RestError(422, 42207, f"Schema already registered with id {sid or want_id} instead of "
                                                  f"input id {want_id}")
                raise E.not_permitted("Registering a schema with an id of your choice needs IMPORT mode, which "
                                      "statekit's registry does not have: leave out \"id\"")
            new_version = max(versions, default=0) + 1
            want_version = body.get("version")
            if want_version not in (None, 0, -1) and want_version != new_version:
                raise E.invalid_schema(f"Version {want_version} is not one more than the previous version "
                                       f"({new_version - 1})")
            problems = check(self.level(subject), parsed, [(v, self.parsed(versions[v]["id"])) for v in live])
            if problems:
                raise E.incompatible(subject, problems)
            if sid is None:
                sid = self.next_id
                self._parsed[sid] = parsed
            for v in sorted(versions):  # a soft-deleted older version of the same schema goes (Confluent)
                if versions[v]["deleted"] and versions[v]["id"] == sid and not self._referrers(subject, v, True):
                    self._write({"op": "delete", "subject": subject, "version": v})
            self._write({"op": "schema", "subject": subject, "version": new_version, "id": sid,
                         "schemaType": schema_type, "schema": parsed.canonical, "references": refs,
                         "deleted": False})
            return self._entry(subject, new_version)

    def lookup(self, subject: str, body, normalize: bool = False, deleted: bool = False) -> dict:
        with self.lock:
            if not self._versions(subject, deleted):
                raise E.subject_not_found(subject)
            parsed, schema_type, refs = self._request(body, normalize)
            sid = self.ids.get(self._identity(schema_type, parsed.canonical, refs))
            for v in reversed(self._versions(subject, deleted)):
                if self.subjects[subject][v]["id"] == sid:
                    return self._entry(subject, v)
            raise E.schema_not_found()

    def list_subjects(self, prefix: str = "", deleted: bool = False, deleted_only: bool = False) -> list[str]:
        with self.lock:
            out = []
            for s, versions in self.subjects.items():
                if not s.startswith(prefix):
                    continue
                flags = [e["deleted"] for e in versions.values()]
                if (deleted_only and all(flags)) or (not deleted_only and (deleted or not all(flags))):
                    out.append(s)
            return sorted(out)

    def list_versions(self, subject: str, deleted: bool = False, deleted_only: bool = False) -> list[int]:
        with self.lock:
            if deleted_only:
                found = [v for v in self._versions(subject, True) if self.subjects[subject][v]["deleted"]]
            else:
                found = self._versions(subject, deleted)
            if not self._versions(subject, deleted or deleted_only):
                raise E.subject_not_found(subject)
            return found

    def _find(self, subject: str, version_text: str, deleted: bool) -> int:
        """The version an URL names (latest: the newest live one, or the newest at all with deleted)."""
        version = parse_version(version_text)
        if not self._versions(subject, deleted):
            raise E.subject_not_found(subject)
        if version is None:
            return self._versions(subject, deleted)[-1]
        e = self.subjects[subject].get(version)
        if e is None or (e["deleted"] and not deleted):
            raise E.version_not_found(version)
        return version

    def get_version(self, subject: str, version_text: str, deleted: bool = False) -> dict:
        with self.lock:
            return self._entry(subject, self._find(subject, version_text, deleted))

    def _referrers(self, subject: str, version: int, deleted: bool, other_than: str | None = None) -> list[int]:
        """Ids of schemas with a version (live, or any with ``deleted``) that reference subject/version
        (in subjects other than ``other_than``)."""
        out = set()
        for s, versions in self.subjects.items():
            if s == other_than:
                continue
            for e in versions.values():
                if e["deleted"] and not deleted:
                    continue
                if any(r["subject"] == subject and r["version"] == version
                       for r in self.schemas[e["id"]]["references"]):
                    out.add(e["id"])
        return sorted(out)

    def referenced_by(self, subject: str, version_text: str) -> list[int]:
        with self.lock:
            return self._referrers(subject, self._find(subject, version_text, True), False)

    def delete_version(self, subject: str, version_text: str, permanent: bool = False) -> int:
        with self.lock:
            version = parse_version(version_text)
            versions = self.subjects.get(subject, {})
            if version is not None and not permanent and versions.get(version, {}).get("deleted"):
                raise E.version_soft_deleted(subject, version)
            version = self._find(subject, version_text, True if version is not None else permanent)
            if self._referrers(subject, version, permanent):
                raise E.reference_exists(subject, version)
            if permanent:
                if not versions[version]["deleted"]:
                    raise E.version_not_soft_deleted(subject, version)
                self._write({"op": "delete", "subject": subject, "version": version})
                if subject not in self.subjects and subject in self.configs:
                    self._write({"op": "config", "subject": subject, "compatibility": None})
            else:
                self._soft_delete(subject, version)
            return version

    def _soft_delete(self, subject: str, version: int) -> None:
        sid = self.subjects[subject][version]["id"]
        rec = self.schemas[sid]
        self._write({"op": "schema", "subject": subject, "version": version, "id": sid,
                     "schemaType": rec["schemaType"], "schema": rec["schema"], "references": rec["references"],
                     "deleted": True})

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        with self.lock:
            if not self._versions(subject, True):
                raise E.subject_not_found(subject)
            live = self._versions(subject)
            if not permanent and not live:
                raise E.subject_soft_deleted(subject)
            if permanent and live:
                raise E.subject_not_soft_deleted(subject)
            doomed = self._versions(subject, True) if permanent else live
            for v in doomed:
                if self._referrers(subject, v, permanent, other_than=subject):
                    raise E.reference_exists(subject, v)
            for v in reversed(doomed) if permanent else doomed:
                if permanent:
                    self._write({"op": "delete", "subject": subject, "version": v})
                else:
                    self._soft_delete(subject, v)
            if permanent and subject in self.configs:
                self._write({"op": "config", "subject": subject, "compatibility": None})
            return doomed

    # -- schemas by id -----------------------------------------------------------------------
    def _uses(self, sid: int, deleted: bool) -> list[tuple[str, int]]:
        return sorted((s, v) for s, versions in self.subjects.items() for v, e in versions.items()
                      if e["id"] == sid and (deleted or not e["deleted"]))

    def get_schema(self, sid_text: str) -> dict:
        """An id's schema. (Confluent's ``subject`` parameter only picks a context; there is one.)"""
        with self.lock:
            return self._schema_fields(self.schemas[self._schema_id(sid_text)])

    def _schema_id(self, text: str) -> int:
        try:
            sid = int(text)
        except ValueError:
            raise E.schema_not_found(text) from None
        if sid not in self.schemas or not self._uses(sid, True):
            raise E.schema_not_found(sid)
        return sid

    def schema_subjects(self, sid_text: str, deleted: bool = False) -> list[str]:
        with self.lock:
            return sorted({s for s, _ in self._uses(self._schema_id(sid_text), deleted)})

    def schema_versions(self, sid_text: str, deleted: bool = False) -> list[dict]:
        with self.lock:
            return [{"subject": s, "version": v} for s, v in self._uses(self._schema_id(sid_text), deleted)]

    def list_schemas(self, prefix: str = "", deleted: bool = False, latest_only: bool = False) -> list[dict]:
        with self.lock:
            out = []
            for s in sorted(self.subjects):
                if s.startswith(prefix):
                    versions = self._versions(s, deleted)
                    out += [self._entry(s, v) for v in (versions[-1:] if latest_only else versions)]
            return out

    # -- compatibility -----------------------------------------------------------------------
    def get_config(self, subject: str | None, default_to_global: bool = False) -> dict:
        with self.lock:
            if subject is not None and subject not in self.configs:
                if not default_to_global:
                    raise E.subject_level_compatibility_not_configured(subject)
                subject = None
            return {"compatibilityLevel": self.level(subject)}

    def set_config(self, subject: str | None, body) -> dict:
        if subject is not None:
            check_subject(subject)
        level = body.get("compatibility", body.get("compatibilityLevel")) if isinstance(body, dict) else None
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise E.invalid_compatibility(level)
        with self.lock:
            self._write({"op": "config", "subject": subject, "compatibility": level.upper()})
            return {"compatibility": level.upper()}

    def delete_config(self, subject: str | None) -> dict:
        with self.lock:
            if subject is not None and subject not in self.configs:
                raise E.subject_not_found(subject)
            old = self.level(subject)
            if subject in self.configs:
                self._write({"op": "config", "subject": subject, "compatibility": None})
            return {"compatibilityLevel": old}

    def test_compatibility(self, subject: str, version_text: str | None, body, verbose: bool = False,
                           normalize: bool = False) -> dict:
        """POST /compatibility/subjects/S/versions[/V]: against one version (V, or the latest),
        or, without V, against the versions the subject's level compares with."""
        with self.lock:
            if version_text is None:
                live = self._versions(subject)
                against = [(v, self.parsed(self.subjects[subject][v]["id"])) for v in live]
                level = self.level(subject)
            else:
                version = parse_version(version_text)
                live = self._versions(subject)
                if version is None:
                    version = live[-1] if live else None
                elif version not in live:
                    raise E.version_not_found(version)
                against = [] if version is None else [(version, self.parsed(self.subjects[subject][version]["id"]))]
                level = self.level(subject)
            try:
                parsed = self._request(body, normalize)[0]
            except E.RestError as e:
                if verbose and e.code == 42201:
                    return {"is_compatible": False, "messages": [e.message]}
                raise
            problems = check(level, parsed, against)
            out = {"is_compatible": not problems}
            if verbose:
                out["messages"] = problems
            return out
