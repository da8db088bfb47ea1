"""Reading metrics: a direct scrape of one /metrics endpoint (and, with monitoring, Prometheus)."""
