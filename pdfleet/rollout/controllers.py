"""Every model's controller in one process (`pdfleet-rollout run`): one `Controller` per model of the
profile, each ticking on its own thread over its own state directory (state_dir/<model>/, its own lock),
plans, gates and stage, so one model's measurement, pause or abort never holds another's. They share
what the gateways share: the policy's one version, so they take one write turn and read each other's
saved states (controller.Controller.peers, reconcile.as_seen_by/lifted/peer_pending)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial

from pdfleet.errors import PdfleetError, ValidationError
from pdfleet.rollout.controller import Controller
from pdfleet.rollout.machine import RolloutState
from pdfleet.rollout.store import Store


@dataclass
class Controllers:
    """Every model's controller in one process (the profile's order): each ticks on its own thread, so
    one model's measurement or pause never holds another's step or abort, and they share one write
    turn and read each other's saved states, because the gateways' policy has one version for all."""

    models: list[Controller]

    @classmethod
    def of(cls, controllers: list[Controller]) -> Controllers:
        """Wire the controllers together: one write lock, each one's peers the others' stores."""
        lock = threading.Lock()
        for c in controllers:
            c.writing = lock
            c.peers = partial(saved_states, [o.store for o in controllers if o is not c])
        return cls(controllers)

    @property
    def names(self) -> list[str]:
        return [c.config.name or "-" for c in self.models]

    def named(self, name: str | None) -> Controller:
        """The controller of model `name`; None: the only one (ValidationError naming the models)."""
        if name is None and len(self.models) == 1:
            return self.models[0]
        found = [c for c in self.models if c.config.name == name]
        if not found:
            what = "several models roll out on their own; name one" if name is None else f"no model {name!r}"
            raise ValidationError(f"--model: {what}; models: {', '.join(self.names)}")
        return found[0]

    def run(self, stop: threading.Event) -> None:
        """Every model's loop until `stop` is set."""
        threads = [
            threading.Thread(target=c.run, args=(stop,), name=f"rollout-{c.config.name}", daemon=True)
            for c in self.models
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def saved_states(stores: list[Store]) -> list[RolloutState]:
    """The states saved in `stores` (read without their locks: each is replaced in one rename); one
    that cannot be read is left out (its own controller reports it)."""
    states = []
    for store in stores:
        try:
            state = store.load()
        except PdfleetError:
            continue
        if state is not None:
            states.append(state)
    return states
