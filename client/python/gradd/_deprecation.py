"""Renamed user-facing names of gradd.torch: the old name keeps working for
one release and warns.

FutureWarning, not DeprecationWarning: these names are used by training
scripts, and Python shows FutureWarning to the person running the program by
default (DeprecationWarning only when the caller is ``__main__`` or under a
test runner), which is what a rename that goes away in the next release
needs. torch warns the same way for its own DDP's deprecated
``check_reduction``. Every rename is listed in docs/deprecations.md.
"""
from __future__ import annotations

import warnings
from typing import Any

from gradd._ddp_logging import RuntimeLog

# Old constructor keyword -> new, for gradd.torch.DistributedDataParallel.
RENAMED_KWARGS = {
    "divide_by_initial_world_size": "divide_by_initial_world_after_reformation",
}


# Old DistributedDataParallel property -> new.
RENAMED_PROPERTIES = {
    "rejoined": "restarted",
    "rejoin_iteration": "restart_iteration",
}


def renamed_property(old: str, new: str) -> property:
    """A read-only property under its old name `old`: warns, then reads
    `new` (see RENAMED_PROPERTIES)."""
    assert RENAMED_PROPERTIES[old] == new

    def get(self):
        warnings.warn(
            f"gradd.torch.DistributedDataParallel.{old} is deprecated and will be removed in "
            f"the next release; use .{new} (the same value under its new name, see "
            "docs/deprecations.md)",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(self, new)

    return property(get, doc=f"Deprecated name of ``{new}`` (docs/deprecations.md).")


def renamed_kwarg(old: str, old_value: Any, new_value: Any, default: Any,
                  *, stacklevel: int = 3) -> Any:
    """The value of the keyword renamed from `old` (see RENAMED_KWARGS):
    `new_value` when the old keyword was not given (`old_value` None), else
    `old_value`, with a FutureWarning. Giving both (the new one not at its
    `default`) is a TypeError, as a keyword given twice is."""
    if old_value is None:
        return new_value
    new = RENAMED_KWARGS[old]
    if new_value != default:
        raise TypeError(f"got both {new}= and its deprecated alias {old}=; pass only {new}=")
    warnings.warn(
        f"gradd.torch.DistributedDataParallel({old}=...) is deprecated and will be removed "
        f"in the next release; use {new}=... (the same setting under its new name, see "
        "docs/deprecations.md)",
        FutureWarning,
        stacklevel=stacklevel,
    )
    return old_value


def check_reduction(check_reduction: bool) -> None:
    """torch's DDP deprecated ``check_reduction`` (accepted, unused); warns
    as torch does, with torch's message."""
    if check_reduction:
        warnings.warn(
            "The `check_reduction` argument in `DistributedDataParallel` "
            "module is deprecated. Please avoid using it.",
            FutureWarning,
            stacklevel=3,
        )


def migrate_pickled(attrs: dict) -> None:
    """A DDP pickled by the previous release (its logging state and the
    node-loss divide under their old names) loads as this one's."""
    if "_logging" not in attrs:
        log = RuntimeLog(attrs["_params"])
        log.sample_rate = attrs.pop("_logging_sample_rate", 100)
        log.sampled = attrs.pop("_sampled_stats", None)
        attrs.pop("_logged_error", None)
        attrs["_logging"] = log
    opts = attrs.get("_attach_options", {})
    if "divide_by_initial_world_size" in opts:
        opts["divide_by_initial_world_after_reformation"] = opts.pop(
            "divide_by_initial_world_size")
