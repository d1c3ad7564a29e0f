"""Which manifest file holds each object, and which other files declare it too.

An object (kind, namespace, name) belongs to the first file that declared it; a later
declaration elsewhere is an ignored duplicate until the holder lets go of the object.

"First" is in time, and holds across restarts: the holders of contested objects (declared
by more than one file) are saved (:meth:`contested`) and given back at start-up as
``preferred``: while the first load reads the files in path order, a preferred holder's
objects are reserved for it, whichever file comes first. An object declared anew while the
daemon was down (by a new file, or one that did not declare it before the restart) is held
``tentatively``: a file that declared it before the restart takes it back (:meth:`displaced`
files are read again, to report their duplicate). :meth:`end_preferences` ends both once
every file was read; an object its preferred holder no longer declares goes to the files
waiting for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kubeport.endpoints.manifests.parse import ObjectKey


class Holders:
    def __init__(self, preferred: Mapping[ObjectKey, str] | None = None) -> None:
        self._holder: dict[ObjectKey, str] = {}
        #: files that declare an object another file holds (or that is reserved for another file)
        self._duplicates: dict[ObjectKey, set[str]] = {}
        #: the holders before a restart, of the objects they shared with another file
        self._preferred: dict[ObjectKey, str] = dict(preferred or {})
        #: objects held by a file that declares them anew since the restart
        self._tentative: set[ObjectKey] = set()
        self._displaced: set[str] = set()

    def holder(self, key: ObjectKey) -> str | None:
        return self._holder.get(key)

    def claimant(self, key: ObjectKey) -> str | None:
        """The holder, or the file the object is reserved for."""
        return self._holder.get(key) or self._preferred.get(key)

    def __contains__(self, key: ObjectKey) -> bool:
        return key in self._holder

    def hold(self, path: str, key: ObjectKey, *, tentative: bool = False) -> bool:
        """Make ``path`` the holder of ``key`` unless another file holds it, or it is reserved
        for another file (then: False, and ``path`` waits for it). ``tentative``: ``path``
        did not declare it before the restart."""
        holder = self._holder.get(key)
        if holder is None:
            preferred = self._preferred.get(key, path)
            if preferred != path:
                self._duplicates.setdefault(key, set()).add(path)
                return False
            holder = self._holder[key] = path
            if tentative:
                self._tentative.add(key)
        elif holder != path and not tentative and key in self._tentative:
            self._tentative.discard(key)  # back to a file that declared it before the restart
            self._duplicates.setdefault(key, set()).add(holder)
            self._displaced.add(holder)
            holder = self._holder[key] = path
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

    def all_declared_elsewhere(self, path: str, keys: Iterable[ObjectKey]) -> bool:
        """Every object of ``keys`` that ``path`` holds is declared by another file too (and
        there is one)."""
        held = [key for key in keys if self._holder.get(key) == path]
        return bool(held) and all(self._duplicates.get(key) for key in held)

    def waiting(self, keys: Iterable[ObjectKey]) -> set[str]:
        """Files with an ignored declaration of one of ``keys`` that nobody holds."""
        return {path for key in keys if key not in self._holder for path in self._duplicates.get(key, ())}

    def displaced(self) -> set[str]:
        """Files that lost a tentatively held object since the last call."""
        displaced, self._displaced = self._displaced, set()
        return displaced

    def end_preferences(self) -> set[ObjectKey]:
        """Stop reserving objects (and holding any tentatively); those no preferred holder took
        (for :meth:`waiting`)."""
        unclaimed = {key for key in self._preferred if key not in self._holder}
        self._preferred, self._tentative = {}, set()
        return unclaimed

    def contested(self) -> dict[ObjectKey, str]:
        """The holder of each object that another file declares too: what to prefer after a restart."""
        return {key: self._holder[key] for key in self._duplicates if key in self._holder}

    def _forget_duplicate(self, path: str, key: ObjectKey) -> None:
        paths = self._duplicates.get(key)
        if paths is not None:
            paths.discard(path)
            if not paths:
                del self._duplicates[key]
