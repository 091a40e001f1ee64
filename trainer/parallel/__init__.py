"""torch.distributed: the process group and the small Dist record (dist.py),
BatchNorm over the global batch on CPU groups (syncbn.py), loader workers
forked safely beside gloo's threads (forksafe.py). Imports common/ only."""
