"""What watches a machine, shared by the daemon and the embedded client: the sampler and its
scheduler, the lost-run watch and the stalled-run watch."""
