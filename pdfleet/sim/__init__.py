"""pdfleet-sim: a vLLM-compatible server that behaves like a GPU (see docs/sim.md).

Parts: `catalog` (GPUs, models, links, with sources), `perf` (step-time roofline), `engine` (vLLM
V1-style scheduler on an injected clock), `des` (discrete-event driver for tests), `server`
(OpenAI-compatible HTTP API paced in real time), `pd` (KV side channel), `metrics` (vLLM names),
`config` (`vllm serve` option parsing), `cli`.

Time: the engine works in simulated seconds; `--sim-time-scale X` makes one simulated second take X
wall seconds. Every duration the simulator reports or is configured with is in simulated seconds.
"""
