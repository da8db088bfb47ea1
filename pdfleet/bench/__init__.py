"""Benchmark library: one stack that `bench/*.py` and `invoke bench` are both built from.

Load: `arrivals` (when requests start), `workloads` (what they ask for: seeded workloads, synthetic
prompts, request bodies), `client` (the one streaming client: a Record per request, TTFT and every
event timed), `load` (the one driver: open loop by a schedule, closed loop by workers, a measured
window, one pool's run through the gateway). Figures: `stats` (percentiles, ITL, streams in flight,
`vllm bench serve`'s figures), `sim_clock` (simulator drift), `report` (Markdown tables, `invoke
bench`'s report). `invoke bench`: `compare`, `sla_search`, `server_side`, `verdict`, `results`,
`plots`, `fleet_targets`, `local_fleet`. Processes on loopback: `procs` (ports, readiness, pinning,
stopping), `cpu` (CPU accounting), `launch` (simulator and vllm-router), `upstream` and `proxies` (the
paced upstream, nginx and the gateway). The gateway-overhead benchmark itself: `gateway_overhead`,
`gateway_overhead_report`; vllm-router's policies: `router_policy`.
"""
