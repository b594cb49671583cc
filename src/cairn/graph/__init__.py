"""Graph workflows (issue 23): typed state, reducers, checkpoints per super-step, time travel."""
