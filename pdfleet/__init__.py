"""pdfleet: provision, verify, benchmark and roll out P/D-disaggregated vLLM fleets."""

__version__ = "0.1.0"
