"""pdfleet's operations engine: pyinfra's model on Fabric (the vocabulary is in `base`).

One module per job, imported directly (this package re-exports nothing):

- `base`: facts, operations, changes, handlers, skips: the vocabulary every other module speaks
- `files`, `apt`, `systemd`, `users`, `kernel`, `pip`: one domain each, its facts beside its operations
- `errors`: OperationError and FactError; `diff`: the human diffs of changes
- `gather`: the per-host fact cache; `ssh`: the transports; `runner`: plan, then apply across the fleet;
  `report`: the progress lines and summary table of a run
"""
