"""Profile files: YAML under profiles/, merged through `extends:`, validated into a `Profile`.

Every error names the file, the key path and what is allowed, e.g.
`profiles/cross-rdma.yml: pools.decode.gpu_memory_utilization: must be <= 0.98 (got 0.99)`.
A key set in a base profile is reported against the base file. Files whose name starts with `_`
(e.g. `profiles/_base.yml`) are bases for `extends:` only: they are not listed and cannot be loaded
as a profile. `extends:` merges mappings key by key (the extending file wins); lists and scalars are
replaced whole; `key: null` in the extending file clears a key set by the base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.model.checks import profile_problems
from pdfleet.model.problems import problems_error
from pdfleet.model.profile import Origins, Profile, ProfileError, origin_of
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.yamlfile import read_yaml

PROFILE_SUFFIXES = (".yml", ".yaml")


def list_profiles(profiles_dir: Path) -> list[str]:
    """Runnable profile names in a directory (file stems, sorted; `_`-prefixed bases excluded)."""
    if not profiles_dir.is_dir():
        return []
    names = {p.stem for p in profiles_dir.iterdir() if p.suffix in PROFILE_SUFFIXES and p.is_file()}
    return sorted(name for name in names if not name.startswith(("_", ".")))


def _find(name: str, directory: Path) -> Path | None:
    """The file for a profile name in a directory, if any."""
    for suffix in PROFILE_SUFFIXES:
        candidate = directory / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def resolve_profile(name_or_path: str, profiles_dir: Path) -> Path:
    """A profile name (looked up in profiles_dir) or a path to a profile file."""
    if not name_or_path:  # a task's --profile left out (invoke passes None)
        names = ", ".join(list_profiles(profiles_dir)) or "(none)"
        raise ValidationError(f"no profile given: pass --profile NAME, one of: {names}")
    as_path = Path(name_or_path)
    if as_path.suffix in PROFILE_SUFFIXES and ("/" in name_or_path or as_path.is_file()):
        if not as_path.is_file():
            raise ValidationError(f"{as_path}: profile file not found")
        return as_path
    if name_or_path.startswith("_"):
        raise ValidationError(
            f"profile {name_or_path!r} is a base for `extends:`, not a runnable profile; "
            f"available: {', '.join(list_profiles(profiles_dir)) or '(none)'}"
        )
    found = _find(name_or_path, profiles_dir)
    if found is None:
        raise ValidationError(
            f"unknown profile {name_or_path!r} in {profiles_dir}; "
            f"available: {', '.join(list_profiles(profiles_dir)) or '(none)'}"
        )
    return found


def _record_origins(data: Any, prefix: tuple[str, ...], source: Path, origins: Origins) -> None:
    """Note which file set each key path, so errors point at the file to edit."""
    origins[prefix] = source
    if isinstance(data, dict):
        for key, value in data.items():
            _record_origins(value, (*prefix, str(key)), source, origins)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key (override wins); anything else is replaced whole."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _find_base(name: str, path: Path, profiles_dir: Path | None) -> Path:
    """The file `extends: name` in `path` means: the file's own folder first, then the profiles dir, so a
    site profile kept outside the repo can extend a shipped one (`extends: cross-rdma`)."""
    folders = [path.parent]
    if profiles_dir is not None and profiles_dir.resolve() != path.parent.resolve():
        folders.append(profiles_dir)
    for folder in folders:
        found = _find(name, folder)
        # a file never extends itself: site/cross-rdma.yml with `extends: cross-rdma` means the shipped one
        if found is not None and found.resolve() != path.resolve():
            return found
    names = sorted(
        {
            p.stem
            for folder in folders
            if folder.is_dir()
            for p in folder.iterdir()
            if p.suffix in PROFILE_SUFFIXES and p.is_file()
        }
    )
    where = " or ".join(str(folder) for folder in folders)
    raise ProfileError(
        [f"{path}: extends: no profile {name!r} in {where}; available: {', '.join(names) or '(none)'}"]
    )


def _load_raw(
    path: Path, chain: list[Path], origins: Origins, profiles_dir: Path | None = None
) -> dict[str, Any]:
    """One file's mapping with its `extends:` chain merged underneath; detects cycles and missing bases."""
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(
            [f"{path}: (top level): must be a mapping of profile keys (got {type(data).__name__})"]
        )
    for reserved in ("name", "source"):
        if reserved in data:
            raise ProfileError([f"{path}: {reserved}: set by pdfleet from the file name; remove this key"])
    base_data: dict[str, Any] = {}
    base_name = data.get("extends")
    if base_name is not None:
        if not isinstance(base_name, str) or not base_name:
            raise ProfileError([f"{path}: extends: must be the name of another profile (got {base_name!r})"])
        base_path = _find_base(base_name, path, profiles_dir)
        resolved = [p.resolve() for p in chain]
        if base_path.resolve() in resolved or base_path.resolve() == path.resolve():
            cycle = " -> ".join(p.stem for p in [*chain, path, base_path])
            raise ProfileError([f"{path}: extends: cycle {cycle}"])
        base_data = _load_raw(base_path, [*chain, path], origins, profiles_dir)
    _record_origins(data, (), path, origins)
    return _deep_merge(base_data, data)


def load_profile(name_or_path: str, profiles_dir: Path) -> Profile:
    """Load, merge (`extends:`) and validate a profile; raises ProfileError listing every problem."""
    path = resolve_profile(str(name_or_path or ""), Path(profiles_dir))  # None: a task without --profile
    origins: Origins = {}
    data = _load_raw(path, [], origins, Path(profiles_dir))
    data.pop("extends", None)
    try:
        profile = Profile.model_validate(
            {**data, "name": path.stem, "source": path, "extends": _extends(path)}
        )
    except PydanticValidationError as exc:

        def file_of(key: str) -> Path:
            return origin_of(key, path, origins)

        raise ProfileError(schema_problems(exc, Profile, file_of, hidden=("name", "source"))) from None
    profile._origins = origins
    problems = profile_problems(profile)
    if problems:
        raise problems_error(profile, problems)
    return profile


def raw_profile(name_or_path: str, profiles_dir: Path) -> dict[str, Any]:
    """The merged YAML of a profile without validation ({} if unreadable), for listings of bad profiles."""
    try:
        return _load_raw(resolve_profile(str(name_or_path), Path(profiles_dir)), [], {}, Path(profiles_dir))
    except ValidationError:
        return {}


def _extends(path: Path) -> str | None:
    """The `extends:` value of the file itself (not of its bases), kept on the model for display."""
    data = read_yaml(path)
    return data.get("extends") if isinstance(data, dict) else None
