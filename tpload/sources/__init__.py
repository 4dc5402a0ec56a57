"""Where a rank's windows come from, chosen once at setup behind one seam (:mod:`.base`'s
``ReadSource``, picked by :mod:`.open`): the storage it reads itself (:mod:`.storage`), or the
replica peers that read them (:mod:`.replicas`); and the evidence producers the gate judges, fed
from the same bytes (:mod:`.hashing`: the hash taps, tensors hashed whole at rest;
:mod:`.whole_files`: files hashed whole beside the copies). This face imports nothing."""
