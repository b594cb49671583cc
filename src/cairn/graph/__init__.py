"""Graph workflows: typed state, reducers, nodes and routers, run as a
Cairn workflow with one checkpoint per super-step (docs/design.md, "Graph
workflows"). The public names are exported by ``cairn`` (``cairn.Graph``)."""
