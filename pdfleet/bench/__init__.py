"""Benchmark library: what `bench/*.py` (and `invoke bench`) are built from.

Load: `arrivals` (when streams start), `workload` (what they ask for), `client` (the streaming client
that times TTFT and every event), `load` (open/closed-loop runs over a measured window).
Figures: `stats` (percentiles, ITL, streams in flight), `sim_clock` (simulator drift), `report`
(Markdown tables). Processes on loopback: `procs` (ports, readiness, pinning, stopping), `cpu` (CPU
accounting), `launch` (simulator and vllm-router), `upstream` and `proxies` (the paced upstream, nginx
and the gateway). The gateway-overhead benchmark itself: `gateway_overhead`, `gateway_overhead_report`.
"""
