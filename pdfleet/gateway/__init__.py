"""pdfleet-gateway: one OpenAI-compatible base URL and key in front of the colocated and P/D pools.

The gateway only chooses the pool (colocated vs disaggregated) per request; the P/D protocol itself
is run by `vllm-router --vllm-pd-disaggregation`, which fronts the disaggregated pool.

A request goes app (routes, lifecycle) -> intake (key, body, decision; one RequestContext, context.py)
-> proxy (forward, fallback, stream) -> upstream (pooled connections: connection.py, http1.py).
"""
