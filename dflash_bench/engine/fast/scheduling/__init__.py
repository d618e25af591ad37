"""The fast path's decisions: what each step runs (the scheduler) and its verify width by load."""
