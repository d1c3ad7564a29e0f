"""Which manifest file holds each object, and which other files declare it too.

An object (kind, namespace, name) belongs to the first file that declared it; a later
declaration elsewhere is an ignored duplicate until the holder lets go of the object.
"""

from __future__ import annotations

from collections.abc import Iterable

from .manifest_files import ObjectKey


class Holders:
    def __init__(self) -> None:
        self._holder: dict[ObjectKey, str] = {}
        #: files that declare an object another file holds
        self._duplicates: dict[ObjectKey, set[str]] = {}

    def holder(self, key: ObjectKey) -> str | None:
        return self._holder.get(key)

    def __contains__(self, key: ObjectKey) -> bool:
        return key in self._holder

    def hold(self, path: str, key: ObjectKey) -> bool:
        """Make ``path`` the holder of ``key`` unless another file holds it (then: False)."""
        holder = self._holder.setdefault(key, path)
        if holder != path:
            self._duplicates.setdefault(key, set()).add(path)
            return False
        self._forget_duplicate(path, key)
        return True

    def drop(self, path: str, keys: Iterable[ObjectKey]) -> set[ObjectKey]:
        """``path`` no longer declares ``keys``; the ones it held, now held by nobody."""
        released = set()
        for key in keys:
            if self._holder.get(key) == path:
                del self._holder[key]
                released.add(key)
            else:
                self._forget_duplicate(path, key)
        return released

    def waiting(self, keys: Iterable[ObjectKey]) -> set[str]:
        """Files with an ignored declaration of one of ``keys`` that nobody holds."""
        return {path for key in keys if key not in self._holder for path in self._duplicates.get(key, ())}

    def _forget_duplicate(self, path: str, key: ObjectKey) -> None:
        paths = self._duplicates.get(key)
        if paths is not None:
            paths.discard(path)
            if not paths:
                del self._duplicates[key]
