"""Where a rank's windows come from: the storage it reads itself, or the replica peers that read
them (:mod:`.replicas`). This face imports nothing."""
