"""The lab: local "bare-metal" hosts for pdfleet, as systemd-nspawn containers on a private bridge.

`invoke lab.up` builds what is missing and boots the hosts of `inventory/lab.yml` (or of
`--inventory FILE`, e.g. the 16 hosts of inventory/lab-16.yml, stopping lab hosts it does not list;
refused before booting when they would not fit in memory); `lab.down` removes exactly what up
created. Needs Linux and root. Nothing outside 198.18.0.0/24 is addressed: the hosts have no default
route and there is no NAT; they reach only the control machine's mirrors.

Layout on disk (the state root, `/var/lib/pdfleet-lab/`):

    state.json                 what up created (nspawn and init PIDs with start times, mirror
                               server PIDs, the bridge), saved as it goes so down works after a kill
    image/<key>/rootfs/        the debootstrap Debian image; <key> hashes the recipe (suite, mirror,
                               package list, customisation version), so it is rebuilt only when that
                               changes; <key>/COMPLETE marks a finished build (a .partial dir is junk
                               from a killed build and is deleted)
    image/debs/                debootstrap's .deb cache, so a recipe change downloads only new packages
    hosts/<name>/upper,work/   the host's overlay (the image is the read-only lower layer); holds the
                               host's own machine-id, SSH host keys, network config and everything
                               provisioning writes; deleted by lab.down
    hosts/<name>/root/         the overlay mount point, booted by systemd-nspawn
    hosts/<name>/console.log   the container's console (boot messages)
    hosts/<name>/image-key     the image the overlay sits on (a new image means a fresh host)
    ssh/id_ed25519{,.pub}      the lab's own login key for user `ops` (kept across down/up)
    ssh/known_hosts            host keys read from each overlay at up time (never learned over the
                               network), used with strict host-key checking
    mirrors/apt-repos/<key>/   flat apt repositories (.debs + Packages/Release) keyed by image and
                               package set; mirrors/apt is a symlink to the one served on :8081
    mirrors/apt-work/          private apt lists/cache used to resolve the mirror against the image
    mirrors/pypi-deps/<key>/   wheels of pdfleet's and vllm-router's requirements for CPython 3.11
    mirrors/pypi/              the PEP 503 tree served on :8082: packages/*.whl (dependency wheels
                               hard-linked from pypi-deps plus the pdfleet wheel of this clone) and
                               simple/<project>/index.html
    mirrors/models/            the model mirror served on :8083 (byte ranges): the lab's small model
                               at each revision, <id>/<revision>/{files, manifest.json}
    run/                       mirror server logs
    gateway-client.key         the gateway client key provisioning leaves for `lab.env` (0600)

Modules: paths (locations, addresses), system (preflight, processes), state, network (bridge),
image (debootstrap cache), sshkeys, hosts (nspawn), mirrors (apt + PyPI + models), model_mirror (the
lab's model and its range-answering server), control (up/down/status), capacity (memory per host),
usage (a host's CPU, for bench/converge.py).
"""
