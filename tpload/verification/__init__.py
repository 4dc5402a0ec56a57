"""Everything that proves a served byte is the checkpoint's, in one folder.

Read in this order:

* :mod:`.policy` -- the verify modes, and who hashes what (each tensor once per node);
* :mod:`.hashing` -- the hash scheduler: sha256 (or blake3) of this rank's share, from the bytes it
  read;
* :mod:`.fingerprint` -- the fingerprint of a served tensor (one definition; a compiled CPU pass
  and torch ops on a device), and the rank digest;
* :mod:`.evidence` -- what each served tensor leaves behind, and the settlement that judges it
  (every problem of a rank listed at once);
* :mod:`.crosscheck` -- node mode: every rank served the bytes its node peer hashed;
* :mod:`.store` -- trusted digests for ``--verify digest``, kept by the operator, not the
  checkpoint.
* :mod:`.blake3sums` -- the optional blake3 sidecar (in the same store): a faster content hash.

What each mode proves, and against whom, is in docs/threat-model.md.
"""
