"""Staged model weights: the fact that reads a revision's files on a host (one batched sha256sum, the
partial downloads, the free space) and the operations that fetch each missing or wrong file, resumably,
checked against its SHA-256 before it takes the file's name.

A download goes to `<file>.part` (curl -C - continues it after an interruption; a push from the control
machine appends to it likewise), is checked, then renamed over the file: vLLM never sees a partial or
corrupt file under its real name.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pdfleet.model.weights import ManifestFile, WeightsManifest
from pdfleet.ops.base import Change, Command, Fact, FactSource, Handler, Operation, Push, Run, Watch, relabel
from pdfleet.ops.errors import FactError, OperationError
from pdfleet.ops.files import File, FileState
from pdfleet.ops.transfer import human_bytes, rate_bytes

q = shlex.quote
PART = ".part"
CURL_RETRIES = 3
NO_RANGES = 33  # curl's exit code when the server cannot resume (no byte ranges)


@dataclass(frozen=True)
class StagedState:
    """A revision's directory on a host: each present file's SHA-256 and each partial download's size
    (by manifest path), and the bytes free on the filesystem that holds (or will hold) it."""

    sha256: Mapping[str, str]
    partial: Mapping[str, int]
    free_bytes: int


@dataclass(frozen=True)
class StagedFiles(Fact[StagedState]):
    """One command per revision: `df` of the nearest existing parent, the `.part` sizes, and one
    sha256sum over every manifest file present (manifest paths hold no newline, quote or backslash)."""

    directory: str
    paths: tuple[str, ...]
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        d = q(self.directory)
        words = " ".join(q(p) for p in self.paths)
        return (
            f'p={d}; while [ ! -e "$p" ]; do p=$(dirname -- "$p"); done; '
            'df -P -B1 -- "$p" | awk \'NR==2 {print "free|" $4}\'; '
            f"cd {d} 2>/dev/null || exit 0; set --; for f in {words}; do "
            'if [ -f "$f.part" ]; then printf "part|%s|%s\\n" "$(stat -c %s -- "$f.part")" "$f"; fi; '
            'if [ -f "$f" ]; then set -- "$@" "$f"; fi; done; '
            'if [ $# -gt 0 ]; then sha256sum -- "$@"; fi'
        )

    def parse(self, stdout: str, rc: int) -> StagedState:
        if rc != 0:
            raise FactError(f"cannot read {self.directory} (exit {rc})")
        free: int | None = None
        partial: dict[str, int] = {}
        shas: dict[str, str] = {}
        for line in stdout.splitlines():
            if line.startswith("free|"):
                free = int(line[5:])
            elif line.startswith("part|"):
                _, size, path = line.split("|", 2)
                partial[path] = int(size)
            elif line.strip():
                digest, sep, path = line.partition("  ")
                if not sep or len(digest) != 64:
                    raise FactError(f"unexpected sha256sum output: {line!r}")
                shas[path] = digest
        if free is None:
            raise FactError(f"df printed no free space for {self.directory}")
        return StagedState(shas, partial, free)


def missing_files(manifest: WeightsManifest, state: StagedState) -> list[ManifestFile]:
    """The manifest's files a host lacks or holds with another SHA-256."""
    return [f for f in manifest.files if state.sha256.get(f.path) != f.sha256]


def bytes_to_fetch(manifest: WeightsManifest, state: StagedState) -> int:
    """What the missing files still need on disk: a partial download shorter than its file continues, so
    only its remainder counts."""
    total = 0
    for f in missing_files(manifest, state):
        part = state.partial.get(f.path, 0)
        total += f.size - part if part < f.size else f.size
    return total


@dataclass(frozen=True)
class WeightsSpace(Operation):
    """Refuses the host's plan, before any change is made, when the revision's missing files do not fit
    on its filesystem (a download that fills the disk half way would take vLLM and the host with it)."""

    directory: str
    manifest: WeightsManifest

    def describe(self) -> str:
        return f"disk space for {self.directory}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (StagedFiles(self.directory, tuple(f.path for f in self.manifest.files)),)

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(StagedFiles(self.directory, tuple(f.path for f in self.manifest.files)))
        needed = bytes_to_fetch(self.manifest, state)
        if needed > state.free_bytes:
            raise OperationError(
                f"{self.manifest.model} at {self.manifest.revision} needs {human_bytes(needed)} more in "
                f"{self.directory} but its filesystem has {human_bytes(state.free_bytes)} free; nothing was "
                "downloaded (free space, or move pdfleet's state directory to a larger disk)"
            )
        return []


@dataclass(frozen=True)
class StageFile(Operation):
    """One file of a revision at `directory/path` with the manifest's SHA-256: fetched from `url` into
    `path.part` (continued when a partial one is there), checked, then renamed into place.

    `header_file` is a 0600 file of request headers (`Authorization: Bearer ...` for the hub), given to
    curl as `-H @file` so the token is on no command line; the command removes it when it fails."""

    directory: str
    file: ManifestFile
    url: str
    paths: tuple[str, ...]  # every manifest path: the StagedFiles fact this operation shares
    limit: str | None = None  # curl --limit-rate
    header_file: str | None = None
    notify: tuple[Handler, ...] = field(default=())

    def describe(self) -> str:
        return f"weights {self.directory}/{self.file.path} ({human_bytes(self.file.size)})"

    def facts(self) -> Iterable[Fact[Any]]:
        return (StagedFiles(self.directory, self.paths),)

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(StagedFiles(self.directory, self.paths))
        have = state.sha256.get(self.file.path)
        if have == self.file.sha256:
            return []
        part = state.partial.get(self.file.path, 0)
        if have is None:
            diff = f"fetch {self.file.path} ({human_bytes(self.file.size)}, sha256 {self.file.sha256[:12]})"
        else:
            diff = f"replace {self.file.path}: sha256 {have[:12]} → {self.file.sha256[:12]}"
        if 0 < part < self.file.size:
            diff += f"; continue the partial download at {human_bytes(part)}"
        return [Change(self.describe(), diff, self.commands(part), notify=self.notify)]

    def commands(self, part: int) -> tuple[Command, ...]:
        """How the file gets here: one shell that fetches, checks and renames (see the class docstring),
        its `.part` watched for progress (`part`: the bytes it held when planned)."""
        f = self.file
        watch = Watch(f"{self.directory}/{f.path}{PART}", f.size, f.path, start=part if part < f.size else 0)
        return (Run(self.command(), watch=watch),)

    def command(self) -> str:
        """The shell that fetches, checks and renames (see the class docstring)."""
        f = self.file
        part = q(f.path + PART)
        curl = ["curl", "-fsSL", "--retry", str(CURL_RETRIES), "-C", "-", "-o", part]
        if self.limit:
            curl += ["--limit-rate", q(self.limit)]
        if self.header_file:
            curl += ["-H", q("@" + self.header_file)]
        curl.append(q(self.url))
        fetch = " ".join(curl)
        script = (
            f"{self._prepare()}; "
            # exit 33: the server answers no byte ranges (python -m http.server), so start the file over
            f"if [ {self._part_size()} -lt {f.size} ]; then {fetch} || {{ rc=$?; [ $rc -eq {NO_RANGES} ] || "
            f"exit $rc; rm -f -- {part}; {fetch}; }}; fi; "
            f"{self._check_and_rename(f'download from {self.url}')}"
        )
        if not self.header_file:
            return script
        # a failed download takes the token's file with it: HeadersRemoved, later in the plan, never runs
        removed = "the hub token's headers file was removed; the next run writes it again"
        return (
            f"( {script} ); rc=$?; if [ $rc -ne 0 ]; then rm -f -- {q(self.header_file)}; "
            f"echo {q(removed)} >&2; fi; exit $rc"
        )

    def _part_size(self) -> str:
        return f'"$(stat -c %s -- {q(self.file.path + PART)} 2>/dev/null || echo 0)"'

    def _prepare(self) -> str:
        """Into the directory, the file's parent made, a `.part` longer than the file (not a prefix of
        it) dropped."""
        f = self.file
        return (
            f'set -e; cd {q(self.directory)}; mkdir -p -- "$(dirname -- {q(f.path)})"; '
            f"if [ {self._part_size()} -gt {f.size} ]; then rm -f -- {q(f.path + PART)}; fi"
        )

    def _check_and_rename(self, after: str) -> str:
        """The `.part` checked against the manifest's SHA-256 (removed when it differs), then renamed."""
        f = self.file
        part = q(f.path + PART)
        mismatch = (
            f"{f.path}: SHA-256 differs from the manifest after {after} "
            "(removed; the next run fetches it again)"
        )
        return (
            f"if ! echo {q(f'{f.sha256}  {f.path}{PART}')} | sha256sum -c --status; then rm -f -- {part}; "
            f"echo {q(mismatch)} >&2; exit 1; fi; "
            f"chmod 0644 -- {part}; mv -f -- {part} {q(f.path)}"
        )


@dataclass(frozen=True)
class PushFile(StageFile):
    """StageFile from a directory on the control machine: `url` is the file's path there, pushed over the
    host's SSH connection into `path.part` (continued from what it holds) at most `limit` bytes per second,
    then checked and renamed like a download."""

    def commands(self, part: int) -> tuple[Command, ...]:
        f = self.file
        limit = rate_bytes(self.limit) if self.limit else None
        return (
            Run(self._prepare()),
            Push(self.url, f"{self.directory}/{f.path}{PART}", f.size, f.path, limit),
            Run(f"set -e; cd {q(self.directory)}; {self._check_and_rename(f'push from {self.url}')}"),
        )


@dataclass(frozen=True)
class StagedListing(Fact["dict[str, str] | None"]):
    """Every file in a staged directory (but partial downloads) with its SHA-256, whatever the manifest
    says: what `invoke doctor --profile` compares across instances. None when the directory is absent."""

    directory: str
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        d = q(self.directory)
        return (
            f"[ -d {d} ] || {{ echo absent; exit 0; }}; cd {d} && "
            "find . -type f ! -name '*.part' -print0 | sort -z | xargs -0 -r sha256sum --"
        )

    def parse(self, stdout: str, rc: int) -> dict[str, str] | None:
        if rc != 0:
            raise FactError(f"cannot list {self.directory} (exit {rc})")
        if stdout.strip() == "absent":
            return None
        found: dict[str, str] = {}
        for line in stdout.splitlines():
            digest, sep, path = line.partition("  ")
            if not sep or len(digest) != 64:
                raise FactError(f"unexpected sha256sum output: {line!r}")
            found[path.removeprefix("./")] = digest
        return found


@dataclass(frozen=True)
class DownloadHeaders(Operation):
    """The 0600 file of request headers (the hub token) curl reads with `-H @file`, written only when the
    revision has files to fetch (a converged host never receives the token); HeadersRemoved deletes it
    after the downloads. Its diff never shows the content."""

    path: str
    content: bytes = field(repr=False)
    directory: str
    paths: tuple[str, ...]
    manifest: WeightsManifest

    def describe(self) -> str:
        return f"download headers {self.path}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (StagedFiles(self.directory, self.paths), FileState(self.path))

    def plan(self, facts: FactSource) -> list[Change]:
        if not missing_files(self.manifest, facts.get(StagedFiles(self.directory, self.paths))):
            return []
        file = File(self.path, self.content, mode="0600", secret=True)
        return relabel(file.plan(facts), self.describe())


@dataclass(frozen=True)
class HeadersRemoved(Operation):
    """The download headers file gone once the revision's files are in place (a StageFile that fails
    removes it itself; this also clears one an interrupted run left)."""

    path: str
    directory: str
    paths: tuple[str, ...]
    manifest: WeightsManifest

    def describe(self) -> str:
        return f"remove {self.path}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (StagedFiles(self.directory, self.paths), FileState(self.path))

    def plan(self, facts: FactSource) -> list[Change]:
        fetching = bool(missing_files(self.manifest, facts.get(StagedFiles(self.directory, self.paths))))
        if not fetching and facts.get(FileState(self.path)) is None:
            return []
        return [
            Change(self.describe(), f"remove {self.path} (the hub token)", (Run(f"rm -f -- {q(self.path)}"),))
        ]


@dataclass(frozen=True)
class RevisionUse:
    """The revision directories under a model's directory with their sizes in bytes, and which running
    vLLM units (by unit name) load each, read off their main process's command line."""

    sizes: Mapping[str, int]
    users: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class RevisionDirs(Fact[RevisionUse]):
    """One command: `du -sb` of each revision directory under `root` (a model's MODELS_DIR/<id>), and the
    command-line words of every active `vllm-*` unit's main process that name a path under it."""

    root: str
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        r = q(self.root)
        return (
            f"cd {r} 2>/dev/null || exit 0; "
            'for d in *; do if [ -d "$d" ] && [ ! -L "$d" ]; then '
            'printf "dir|%s|%s\\n" "$d" "$(du -sb -- "$d" | cut -f1)"; fi; done; '
            "for u in $(systemctl list-units --type=service --state=active --plain --no-legend 'vllm-*' "
            "2>/dev/null | awk '{print $1}'); do p=$(systemctl show -p MainPID --value \"$u\"); "
            'if [ "${p:-0}" -gt 0 ]; then tr "\\0" "\\n" < "/proc/$p/cmdline" 2>/dev/null | '
            'sed "s#^#arg|$u|#"; fi; done; exit 0'
        )

    def parse(self, stdout: str, rc: int) -> RevisionUse:
        if rc != 0:
            raise FactError(f"cannot list {self.root} (exit {rc})")
        sizes: dict[str, int] = {}
        users: dict[str, set[str]] = {}
        under = self.root.rstrip("/") + "/"
        for line in stdout.splitlines():
            kind, _, rest = line.partition("|")
            if kind == "dir":
                name, _, size = rest.rpartition("|")
                sizes[name] = int(size)
            elif kind == "arg":
                unit, _, word = rest.partition("|")
                if under in word:  # vllm serve ROOT/REV, --model=ROOT/REV/...
                    revision = word.split(under, 1)[1].split("/", 1)[0]
                    users.setdefault(revision, set()).add(unit)
        return RevisionUse(sizes, {r: frozenset(u) for r, u in users.items()})


@dataclass(frozen=True)
class OldRevisions(Operation):
    """A model's revision directories but the pinned one removed, once the host converged: a handler, so
    it runs after this run's changes succeeded (the pinned files staged and verified) and after the
    restarts (which wait for /health), so the units already run the pin. A directory a running unit loads
    is removed only when that unit is one of `restarts` (this host's instances of the model, restarted
    onto the pin first); one loaded by any other unit is kept. The handler's name says what and how much,
    so provision's progress shows it."""

    root: str
    keep: str
    restarts: tuple[Handler, ...] = ()

    def describe(self) -> str:
        return f"old revisions in {self.root}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (RevisionDirs(self.root),)

    def plan(self, facts: FactSource) -> list[Change]:
        use = facts.get(RevisionDirs(self.root))
        ours = {h.unit for h in self.restarts if h.unit}
        old = sorted(r for r in use.sizes if r != self.keep)
        kept = [r for r in old if use.users.get(r, frozenset()) - ours]
        gone = [r for r in old if r not in kept]
        if not gone:
            return []
        what = ", ".join(f"{r} ({human_bytes(use.sizes[r])})" for r in gone)
        freed = human_bytes(sum(use.sizes[r] for r in gone))
        rm = "rm -rf -- " + " ".join(q(f"{self.root}/{r}") for r in gone)
        handler = Handler(f"remove old weights {what} from {self.root}", (Run(rm),))
        loaded = sorted({u for r in gone for u in use.users.get(r, frozenset())})
        restarts = tuple(h for h in self.restarts if h.unit in loaded)
        total = f", {freed} in all" if len(gone) > 1 else ""
        diff = f"remove {what} from {self.root}{total} once this host's changes succeeded"
        if restarts:
            diff += f", after restarting {', '.join(loaded)} onto {self.keep}"
        if kept:
            users = sorted({u for r in kept for u in use.users[r]})
            diff += f"; keep {', '.join(kept)} (loaded by {', '.join(users)})"
        return [Change(self.describe(), diff, (), notify=(*restarts, handler))]
