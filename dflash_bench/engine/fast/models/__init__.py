"""The fast path's models: the family registry, the targets' and the drafter's forwards, a slot's layout, a rank's shard."""
