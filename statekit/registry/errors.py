"""The errors of the Schema Registry REST API: an HTTP status, Confluent's `error_code` and its
message wording, so a client that matches on either (confluent-kafka's `SchemaRegistryError`, the
Java `RestClientException`, scripts reading the JSON) sees what a Confluent registry would say."""
from __future__ import annotations

LEVELS_TEXT = ("none, backward, forward, full, backward_transitive, forward_transitive, and "
               "full_transitive")


class RestError(Exception):
    """An answer other than 2xx: ``{"error_code": code, "message": message}`` with ``status``."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def body(self) -> dict:
        return {"error_code": self.code, "message": self.message}


class InvalidSchema(ValueError):
    """A schema that does not parse (answered 42201 with the reason)."""


def subject_not_found(subject: str) -> RestError:
    return RestError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(version) -> RestError:
    return RestError(404, 40402, f"Version {version} not found.")


def schema_not_found(schema_id=None) -> RestError:
    return RestError(404, 40403, "Schema not found" if schema_id is None else f"Schema {schema_id} not found")


def subject_soft_deleted(subject: str) -> RestError:
    return RestError(404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently")


def subject_not_soft_deleted(subject: str) -> RestError:
    return RestError(404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted")


def version_soft_deleted(subject: str, version) -> RestError:
    return RestError(404, 40406, f"Subject '{subject}' Version {version} was soft deleted.Set permanent=true to "
                                 f"delete permanently")


def version_not_soft_deleted(subject: str, version) -> RestError:
    return RestError(404, 40407, f"Subject '{subject}' Version {version} was not deleted first before being "
                                 f"permanently deleted")


def subject_level_compatibility_not_configured(subject: str) -> RestError:
    return RestError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")


def subject_level_mode_not_configured(subject: str) -> RestError:
    return RestError(404, 40409, f"Subject '{subject}' does not have subject-level mode configured")


def incompatible(subject: str, details: list[str]) -> RestError:
    return RestError(409, 409, f'Schema being registered is incompatible with an earlier schema for subject '
                               f'"{subject}", details: [{", ".join(details)}]')


def invalid_schema(reason: str) -> RestError:
    return RestError(422, 42201, reason)


def invalid_version(version) -> RestError:
    return RestError(422, 42202, f"The specified version '{version}' is not a valid version id. Allowed values are "
                                 f'between [1, 2^31-1] and the string "latest"')


def invalid_compatibility(level=None) -> RestError:
    return RestError(422, 42203, f"Invalid compatibility level{'' if level is None else f' {level!r}'}. "
                                 f"Valid values are {LEVELS_TEXT}")


def invalid_mode(mode) -> RestError:
    return RestError(422, 42204, f"Invalid mode {mode!r}: statekit's registry is always READWRITE")


def not_permitted(message: str) -> RestError:
    return RestError(422, 42205, message)


def reference_exists(subject: str, version: int) -> RestError:
    return RestError(422, 42206, f"One or more references exist to the schema "
                                 f"{{magic=1,keytype=SCHEMA,subject={subject},version={version}}}.")


def store_error(message: str) -> RestError:
    return RestError(500, 50001, message)


def bad_request(message: str) -> RestError:
    return RestError(400, 400, message)


def not_found_url() -> RestError:
    return RestError(404, 404, "HTTP 404 Not Found")


def method_not_allowed() -> RestError:
    return RestError(405, 405, "HTTP 405 Method Not Allowed")


def not_acceptable() -> RestError:
    return RestError(406, 406, "HTTP 406 Not Acceptable")


def unsupported_media_type() -> RestError:
    return RestError(415, 415, "HTTP 415 Unsupported Media Type")
