"""Schemas in the Confluent wire format: the serdes `avro`, `protobuf` and `json_schema`
(`statekit.schemas.serdes`) and how they reach a Schema Registry (`statekit.schemas.client`).
`statekit.serdes` is the public face; `statekit.stores.serdes` resolves the names."""
