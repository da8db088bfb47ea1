"""Lab tests: real systemd-nspawn hosts on the pdlab0 bridge (root, Linux)."""
