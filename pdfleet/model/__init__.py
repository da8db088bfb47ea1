"""What operators write and what every side agrees on: profiles, inventories, vLLM release facts, the
hardware catalog. Imports nothing above it (no service, no fleet code); keep this file import-free, so
host code can import one model module without pulling in the rest."""
