"""pdfleet-sim: a vLLM-compatible server that behaves like a GPU (see docs/sim.md).

Parts, pure to I/O-bound: `perf` (step-time roofline, KV link queue; hardware from
`pdfleet.model.catalog`), `engine` (vLLM V1-style scheduler on an injected clock), `des`
(discrete-event driver for tests), `metrics` (vLLM names), `serve_options` (the `vllm serve` command
line), `config` (the validated `SimConfig`), `clock` (simulated vs wall time), `stream` (Sinks, SSE
framing), `side_channel` (the KV side channel's wire protocol), `kv_transfer` (the instance's P/D
connector), `runtime` (the step loop paced in real time), `intake` (a request's arrival, parsing and
token count, off the event loop), `vocab` (output tokens from the tokenizer's vocabulary), `api` (the
OpenAI-compatible HTTP API), `server` (wires them), `cli`.

Time: the engine works in simulated seconds; `--sim-time-scale X` makes one simulated second take X
wall seconds. Every duration the simulator reports or is configured with is in simulated seconds.
"""
