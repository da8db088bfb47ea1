"""The paced SSE upstream of bench/gateway_overhead.py, alone: `python bench/gateway_upstream.py --port P`.

Each POST body's JSON gives `max_tokens` and `bench: {first_ms, gap_ms}`; the reply is a chunked
`text/event-stream` of `max_tokens` OpenAI-style chunk events `gap_ms` apart after `first_ms`, then
`data: [DONE]`. Keep-alive is supported. The server is `pdfleet.bench.upstream` (also
`python -m pdfleet.bench.upstream`); the benchmark's client is `pdfleet.bench.client`.
"""

from pdfleet.bench.upstream import main

if __name__ == "__main__":
    main()
