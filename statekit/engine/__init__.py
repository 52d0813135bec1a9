"""Engines: how a topology Plan runs. `spark` (the real one, Structured Streaming), `local` (in-process,
for tests and quick checks), `spec` (RunSpec, shared by the runtime and the engines)."""
