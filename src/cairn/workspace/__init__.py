"""Workspaces: a directory's files as content-addressed trees of objects.

``objects`` (ids, stored form, checks), ``scan`` (snapshot with a stat
cache), ``trees`` (checked reads, listing, diff) and ``restore`` (make a
directory exactly a snapshot). Nothing here knows a store or a run: a
snapshot hands its objects to a sink and a restore reads them from a
``trees.Source``; ``engine.workspace`` binds both to a run's store.
"""

from cairn.workspace.objects import Entry
from cairn.workspace.restore import Restored, restore
from cairn.workspace.scan import Scan, TreeCache, snapshot
from cairn.workspace.trees import Change, Objects, Source, diff, walk

__all__ = ["Change", "Entry", "Objects", "Restored", "Scan", "Source", "TreeCache", "diff", "restore",
           "snapshot", "walk"]
