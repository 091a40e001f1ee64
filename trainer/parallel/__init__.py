"""torch.distributed: the process group and the small Dist record (dist.py),
BatchNorm over the global batch on CPU groups (syncbn.py), loader workers
forked from a server that has no other thread (workers.py). Imports common/ only."""
