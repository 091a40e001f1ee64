"""What both sides need, without torch: `hpcyolo` imports these on a login node
before torch loads (errors, atomic writes, the YAML reader, the data YAML, the
settings' table, records, run directories, the preemption protocol, the
rendezvous, polygon clipping, the model names, devices, the ledger of a run's hours). Imports nothing of the trainer
outside common/, and neither torch nor numpy at module level."""
