"""Every vLLM instance's /metrics of a deployment, saved as one JSON file: taken before and after an
`invoke bench` run (into its output directory as server-before.json and server-after.json), it lets
bench/plan_fidelity.py read what the instances themselves saw over the run: the simulator's inter-token
latency (simulated time, the engine's own gaps) and how late each step's tokens left in wall time
(pdfleet_sim_step_lag_seconds), per pool and role, beside the client's view and the prediction.
`invoke plan --validate` takes the same snapshots around its own bench run.

    .venv/bin/python bench/plan_snapshot.py --profile lab-cross out/fid-cross/server-before.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from invoke import Config, Context

from pdfleet.cli.options import open_deployment
from pdfleet.cli.plan_validate import snapshot

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the JSON file to write")
    ap.add_argument("--profile", required=True, help="the profile the fleet runs (as invoke bench's)")
    ap.add_argument("--inventory", default=None, help="its inventory (default: the lab's, as invoke bench)")
    args = ap.parse_args()
    config = Config(project_location=REPO)
    config.load_project()
    deployment = open_deployment(Context(config), args.profile, args.inventory, fleet_layout=True)
    snap = snapshot(deployment)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(snap) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(snap['samples'])} samples of {snap['instances']} instance(s)")


if __name__ == "__main__":
    main()
