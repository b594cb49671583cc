"""Memory of agents beyond one run (issue 14): embedders and the embedding worker."""
